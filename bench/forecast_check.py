"""How close a forecast comes on a real GPU: three runs of history, then steps x2 and batch x2.

For each preset (``resnet50-bf16`` and ``lora-tiny`` by default), in a history
of its own (fresh config, data and state directories: no other run counts):

1. three runs at the preset's settings (``--steps N`` shrinks its step count);
2. ``gpustation run PRESET --dry-run --json`` for twice the steps and for twice
   the batch, both forecast from those three runs;
3. the two runs for real, and what they took from ``runs show --json``.

It prints, per case, the forecast and actual time, GPU energy and peak GPU
memory with the forecast's error, then the median errors over all cases
(the aim: time and energy within 15 %, peak memory within 10 %), and writes
it all as JSON to ``--out``. Read-only on the GPU: the runs only compute.

    python3 bench/forecast_check.py --out /tmp/forecast_check.json
    python3 bench/forecast_check.py --presets lora-tiny --steps 100 --out /tmp/f.json

The expected total time is printed first (five runs a preset; each run's
start-up, torch.compile included, dominates a short one); ``--run-timeout``
caps each run. To check the script without a GPU, on simulated GPUs and the
CPU at toy sizes:

    python3 bench/forecast_check.py --simulate 1 --presets lora-tiny --steps 12 \\
        --set device=cpu --set model_preset=tiny --set compile=false \\
        --set precision=fp32 --set seq_len=64 --set batch_size=4 --out /tmp/f.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PRESETS = ("resnet50-bf16", "lora-tiny")
#: a rough run on an H100/H200, for the time said up front: (start-up s, s a step)
ROUGH = {"resnet50-bf16": (70.0, 0.05), "lora-tiny": (50.0, 0.06)}
#: the shipped presets' step counts and batches, when a preset file cannot be read here
DEFAULTS = {"resnet50-bf16": (150, 256), "lora-tiny": (300, 32)}
HISTORY_RUNS = 3
FIGURES = (("duration_s", "time"), ("energy_j", "energy"), ("peak_vram_mib", "peak memory"))


def gs(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpustation", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
        check=False,
    )


def preset_args(name: str) -> dict[str, Any]:
    """The shipped preset's [args] (read as TOML, without importing gpustation)."""
    path = REPO / "gpustation" / "presets" / "runs" / f"{name}.toml"
    try:
        import tomllib

        data = tomllib.loads(path.read_text())
    except (ImportError, OSError, ValueError):
        steps, batch = DEFAULTS.get(name, (100, 32))
        return {"steps": steps, "batch_size": batch}
    args = data.get("args")
    return dict(args) if isinstance(args, dict) else {}


def run_to_end(env: dict[str, str], args: list[str], timeout: float) -> dict[str, Any]:
    """``gpustation run ARGS`` to its end; the run's ``runs show --json``."""
    t0 = time.monotonic()
    done = gs(env, "run", *args, timeout=timeout)
    took = time.monotonic() - t0
    if done.returncode != 0:
        raise RuntimeError(f"run {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    show = gs(env, "runs", "show", "last", "--json", timeout=120)
    doc: dict[str, Any] = json.loads(show.stdout)
    print(f"    ran {' '.join(args)}: {doc['id']} in {took:.0f} s", flush=True)
    return doc


def dry_run(env: dict[str, str], args: list[str]) -> dict[str, Any]:
    done = gs(env, "run", *args, "--dry-run", "--json", timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"dry run {' '.join(args)} exited {done.returncode}: {done.stderr}")
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def error_pct(forecast: float | None, actual: float | None) -> float | None:
    if forecast is None or actual is None or actual == 0:
        return None
    return 100.0 * (forecast - actual) / abs(actual)


def check_preset(
    name: str, base: list[str], steps: int, batch: int, env: dict[str, str], timeout: float
) -> dict[str, Any]:
    """History, forecasts, real runs and errors for one preset."""
    print(f"\n== {name}: {HISTORY_RUNS} runs of {steps} steps at batch {batch}", flush=True)
    at = [*base, "--set", f"steps={steps}", "--set", f"batch_size={batch}"]
    history = [run_to_end(env, [name, *at], timeout)["id"] for _ in range(HISTORY_RUNS)]
    cases = {
        "steps x2": [*base, "--set", f"steps={2 * steps}", "--set", f"batch_size={batch}"],
        "batch x2": [*base, "--set", f"steps={steps}", "--set", f"batch_size={2 * batch}"],
    }
    # both forecast from the same three runs, before either real run joins the history
    forecasts = {case: dry_run(env, [name, *args])["forecast"] for case, args in cases.items()}
    out: dict[str, Any] = {"preset": name, "history": history, "cases": []}
    for case, args in cases.items():
        actual = run_to_end(env, [name, *args], timeout)
        fc = forecasts[case]
        row: dict[str, Any] = {
            "case": case,
            "run": actual["id"],
            "forecast_text": fc.get("text"),
            "runs": fc.get("runs"),
            "notes": fc.get("notes"),
        }
        for key, _label in FIGURES:
            row[key] = {
                "forecast": fc.get(key),
                "actual": actual.get(key),
                "error_pct": error_pct(fc.get(key), actual.get(key)),
            }
        out["cases"].append(row)
    return out


def cell(figure: dict[str, Any], scale: float, digits: int) -> str:
    fc, actual, err = figure["forecast"], figure["actual"], figure["error_pct"]

    def num(v: float | None) -> str:
        return "n/a" if v is None else f"{v / scale:,.{digits}f}"

    return f"{num(fc)} / {num(actual)} ({'n/a' if err is None else f'{err:+.1f} %'})"


def report(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Print the table and the medians; the medians and whether they are within the aims."""
    print(
        f"\n{'preset':<15}{'case':<10}{'time s fc/actual':<30}{'energy kJ fc/actual':<30}"
        f"{'peak GiB fc/actual':<30}"
    )
    errors: dict[str, list[float]] = {key: [] for key, _ in FIGURES}
    for result in results:
        for row in result["cases"]:
            print(
                f"{result['preset']:<15}{row['case']:<10}"
                f"{cell(row['duration_s'], 1.0, 1):<30}{cell(row['energy_j'], 1000.0, 2):<30}"
                f"{cell(row['peak_vram_mib'], 1024.0, 2):<30}"
            )
            for key, _ in FIGURES:
                err = row[key]["error_pct"]
                if err is not None:
                    errors[key].append(abs(err))
    medians = {key: statistics.median(v) if v else None for key, v in errors.items()}
    aims = {"duration_s": 15.0, "energy_j": 15.0, "peak_vram_mib": 10.0}
    within = {key: None if (m := medians[key]) is None else m <= aims[key] for key in aims}
    for key, label in FIGURES:
        m = medians[key]
        print(
            f"median |error| of {label}: {'n/a' if m is None else f'{m:.1f} %'} "
            f"(aim {aims[key]:.0f} %: {'met' if within[key] else 'not met'})"
        )
    return {"median_abs_error_pct": medians, "aim_pct": aims, "within": within}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default=",".join(PRESETS), help="comma-separated presets")
    ap.add_argument(
        "--steps", type=int, default=None, help="base step count (default: each preset's own)"
    )
    ap.add_argument("--gpus", default="0", help="the GPU(s) the runs use (default 0)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="more --set values for every run (device=cpu for a check)",
    )
    ap.add_argument(
        "--simulate", type=int, default=None, metavar="N", help="simulated GPUs (a check)"
    )
    ap.add_argument("--run-timeout", type=float, default=1200.0, help="cap on each run (s)")
    ap.add_argument("--out", default="forecast_check.json", help="where the JSON goes")
    ap.add_argument("--keep", metavar="DIR", help="keep the runs' history in DIR")
    args = ap.parse_args()
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    sets = {item.split("=", 1)[0]: item.split("=", 1)[1] for item in args.set if "=" in item}

    plans = []
    expected = 0.0
    for name in presets:
        own = preset_args(name)
        steps = args.steps or int(own.get("steps") or DEFAULTS.get(name, (100, 32))[0])
        batch = int(sets.get("batch_size") or own.get("batch_size") or 32)
        start_s, step_s = ROUGH.get(name, (60.0, 0.1))
        # three runs of N steps, one of 2N, one of N at twice the batch
        expected += 5 * start_s + (3 * steps + 2 * steps + 2 * steps) * step_s
        plans.append((name, steps, batch))
    print(
        f"forecast check of {', '.join(presets)} on GPU {args.gpus}: "
        f"{5 * len(presets)} runs, expected about {expected / 60:.0f} min on an H100/H200",
        flush=True,
    )
    base = ["--gpus", args.gpus]
    for key, value in sets.items():
        if key not in ("steps", "batch_size"):  # each case sets its own
            base += ["--set", f"{key}={value}"]
    if args.simulate is not None:
        base += ["--simulate", str(args.simulate)]

    if args.simulate is None:
        try:
            import pynvml  # noqa: F401  (the runs' telemetry reads the GPUs through it)
        except ImportError:
            print(
                "nvidia-ml-py (pynvml) is missing: the runs would have no GPU telemetry, so "
                "no energy; install it (pip install nvidia-ml-py)",
                file=sys.stderr,
            )
            return 2
    home = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="forecast-check-"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    for kind in ("config", "data", "state"):
        (home / kind).mkdir(parents=True, exist_ok=True)
        env[f"GPUSTATION_{kind.upper()}_DIR"] = str(home / kind)
    print(f"history in {home}", flush=True)

    t0 = time.monotonic()
    results: list[dict[str, Any]] = []
    doc: dict[str, Any] = {"presets": results, "gpus": args.gpus, "simulated": bool(args.simulate)}
    failed = False
    for name, steps, batch in plans:
        try:
            results.append(check_preset(name, base, steps, batch, env, args.run_timeout))
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as err:
            print(f"{name}: {err}", file=sys.stderr, flush=True)
            doc.setdefault("failures", []).append({"preset": name, "error": str(err)})
            failed = True
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    doc.update(report(results))
    doc["took_s"] = round(time.monotonic() - t0, 1)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\ntook {doc['took_s'] / 60:.1f} min; JSON in {args.out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
