"""Does a run on a real GPU name what slowed it down? Another process, then too few loader workers.

Two checks on one GPU, about three minutes in all (every wait has a deadline):

1. ``gpustation run lora-tiny`` (or ``--preset resnet50-bf16``) with steps enough to go on.
   Once it has reported its throughput steadily, a bf16 matmul loop starts on the same GPU
   as a child process of this script (its pid is printed). The run must slow down and its
   first slowdown name that pid ("another process (pid N)").
2. ``gpustation run dataloader-probe`` trying 8 loader workers six times, then 1 worker
   three times (ResNet-50 on JPEGs decoded and augmented on the CPU): its throughput falls
   when it goes to one worker, and the slowdown must name the input pipeline.

The runs get a config and a data directory of their own (a short warm-up, the default
thresholds; no notification, nothing in your run history). It prints a table and writes
each run's slowdowns, as ``runs show --json`` gives them, to ``--out``. It needs
gpustation's headless parts and torch (the image's python3), not textual.

    python3 bench/slowdown_check.py --gpu 0 --out slowdown-check.json

``--simulate`` runs the same steps on a simulated GPU, to show the script works where
there is no GPU: the first run is a small steady loop that halves its pace when the
stand-in process starts (as sharing a real GPU's SMs does), and the stand-in is put on
the simulated card as a guest with half its SMs; the probe runs a tiny model on the CPU,
and as a simulated card's utilisation does not follow a run, its cause is not expected.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MATMUL = """
import os, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print(f"bf16 matmul: pid {os.getpid()}", flush=True)
end = time.monotonic() + 60
while time.monotonic() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""
#: --simulate: the stand-in process (put on the simulated card as a guest) ...
STAND_IN = "import time\ntime.sleep(60)\n"
#: ... and the run: steps at a steady pace, slower by the factor in its control file
STEADY_RUN = """
import sys, time
from pathlib import Path
from gpustation.runs.metrics import MetricsWriter
control = Path(sys.argv[1])
with MetricsWriter.from_env() as m:
    last, steps, end = time.monotonic(), 0, time.monotonic() + 170
    while time.monotonic() < end:
        factor = float(control.read_text() or 1) if control.exists() else 1.0
        time.sleep(0.02 * factor)
        steps += 1
        now = time.monotonic()
        if now - last >= 0.25:
            m.log(step=steps, throughput=steps / (now - last), unit="steps/s")
            last, steps = now, 0
"""

#: seconds of steady throughput reports before the matmul starts (after the warm-up)
STEADY_S = 12.0
WARMUP_S = 10


def gpustation(env: dict[str, str], *args: str, timeout: float = 60) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gpustation", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"gpustation {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def environment(root: Path, name: str, config: str, simulate: bool) -> dict[str, str]:
    """The runs' own config, data and state directories."""
    env = dict(os.environ)
    for kind in ("config", "data", "state"):
        path = root / name / kind
        path.mkdir(parents=True)
        env[f"GPUSTATION_{kind.upper()}_DIR"] = str(path)
    (root / name / "config" / "config.toml").write_text(config)
    env.pop("GPUSTATION_SIMULATE", None)
    if simulate:
        env["GPUSTATION_SIMULATE"] = "1"
    return env


def start(env: dict[str, str], gpu: int, preset: str, sets: list[str], *command: str) -> Path:
    """Start a run of ``preset`` (or, given, of ``command``)."""
    argv = ["run", "--detach", "--gpus", str(gpu)]
    for value in sets:
        argv += ["--set", value]
    argv += ["--", *command] if command else [preset]
    run_id = gpustation(env, *argv).strip().splitlines()[-1]
    return Path(env["GPUSTATION_DATA_DIR"]) / "runs" / run_id


def wait(what: str, seconds: float, ready: Any) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.5)
    print(f"  gave up waiting {seconds:.0f} s for {what}", flush=True)
    return None


def reported_s(directory: Path) -> float:
    """Seconds between the run's first and last throughput reports."""
    times = []
    try:
        for line in (directory / "metrics.jsonl").read_text().splitlines():
            event = json.loads(line)
            if isinstance(event.get("throughput"), (int, float)) and "time" in event:
                times.append(event["time"])
    except (OSError, ValueError):
        return 0.0
    return times[-1] - times[0] if len(times) > 1 else 0.0


def slowdowns(directory: Path, since: float = 0.0) -> list[dict[str, Any]]:
    """The run's slowdowns that started from ``since`` on (Unix time, a little slack)."""
    # gpustation's own reader of slowdowns.jsonl (headless)
    from gpustation.runs.slowdown.records import read_slowdowns

    return [s for s in read_slowdowns(directory) if s.get("start_time", 0.0) >= since - 2.0]


def ended(directory: Path) -> bool:
    # gpustation's own reader of the run's state (headless)
    from gpustation.runs import rundir

    state = rundir.read_state(directory)
    return state is not None and not state.active


def poke(env: dict[str, str], **values: Any) -> None:
    """Change the simulated GPU the runs use (``--simulate``)."""
    # the simulator, only with --simulate
    from gpustation.telemetry.sim import SimBackend, machine_path

    os.environ["GPUSTATION_STATE_DIR"] = env["GPUSTATION_STATE_DIR"]
    SimBackend(count=1, state_path=machine_path("rtx4090", 1)).poke(0, **values)


def show(env: dict[str, str], directory: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(gpustation(env, "runs", "show", directory.name, "--json"))
    return doc


def check_process(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """A matmul on the run's GPU halfway through: the first slowdown names its pid."""
    t0 = time.monotonic()
    env = environment(root, "process", f"[slowdown]\nwarmup_s = {WARMUP_S}\n", args.simulate)
    sets = ["steps=1000000"]
    if args.preset == "lora-tiny":  # no eval or checkpoint pauses: the matmul alone
        sets += ["eval_every=1000000", "keep_checkpoints=0"]
    control = root / "pace"
    if args.simulate:  # a steady loop on a card at a steady load
        poke(env, load=0.7)
        directory = start(env, args.gpu, "", [], sys.executable, "-c", STEADY_RUN, str(control))
    else:
        directory = start(env, args.gpu, args.preset, sets)
    what = "a steady loop" if args.simulate else args.preset
    print(f"check 1: run {directory.name} ({what}) on GPU {args.gpu}", flush=True)
    result: dict[str, Any] = {"check": "another process", "run": directory.name}
    try:
        if not wait("steady throughput", 90, lambda: reported_s(directory) >= WARMUP_S + STEADY_S):
            result["error"] = "the run reported no steady throughput in time"
            return result
        child_env = {**env, "CUDA_VISIBLE_DEVICES": str(args.gpu)}
        code = STAND_IN if args.simulate else MATMUL
        interferer = subprocess.Popen(
            [sys.executable, "-c", code], env=child_env, start_new_session=True
        )
        result["interferer_pid"] = interferer.pid
        started = result["interferer_started"] = time.time()
        what = "a stand-in process" if args.simulate else "a bf16 matmul"
        print(f"  started {what} on GPU {args.gpu}: pid {interferer.pid}", flush=True)
        if args.simulate:  # a simulated card lists a host process only when told
            control.write_text("2")
            poke(env, guests=[[interferer.pid, 50.0, 2048.0]])
        found = wait("a slowdown", 25, lambda: slowdowns(directory, started))
        result["found_after_s"] = round(time.time() - started, 1) if found else None
        interferer.send_signal(signal.SIGKILL)
        interferer.wait()
        if args.simulate:
            control.write_text("1")
            poke(env, guests=[])
        wait(
            "the slowdown to end",
            10,
            lambda: all(s.get("state") == "ended" for s in slowdowns(directory, started)),
        )
    finally:
        gpustation(env, "runs", "stop", directory.name, timeout=90)
    result["slowdowns"] = show(env, directory).get("slowdowns") or []
    # The first slowdown since the matmul started (one before it has another cause).
    since = [s for s in result["slowdowns"] if s.get("start_time", 0.0) >= started - 2.0]
    first = (since or [{}])[0].get("cause") or {}
    pid = (first.get("evidence") or {}).get("pid")
    result["cause"] = first.get("words")
    result["ok"] = first.get("kind") == "process" and pid == result.get("interferer_pid")
    result["seconds"] = round(time.monotonic() - t0, 1)
    return result


def check_loader(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Eight loader workers, then one: the slowdown names the input pipeline."""
    t0 = time.monotonic()
    # One report per setting: none of them is warm-up but the first.
    env = environment(
        root, "loader", "[slowdown]\nwarmup_s = 0\nwarmup_reports = 1\n", args.simulate
    )
    sets = ["workers_list=8,8,8,8,8,8,1,1,1", "pin_memory_options=false", "steps=20"]
    if args.simulate:
        sets += ["device=cpu", "model=tiny", "batch_size=16", "image_size=64", "source_size=96"]
        poke(env, load=0.7)
    directory = start(env, args.gpu, "dataloader-probe", sets)
    print(f"check 2: run {directory.name} (dataloader-probe) on GPU {args.gpu}", flush=True)
    result: dict[str, Any] = {"check": "input pipeline", "run": directory.name}
    try:
        if not wait("the probe to end", 110, lambda: ended(directory)):
            result["error"] = "the probe did not end in time"
    finally:
        if not ended(directory):
            gpustation(env, "runs", "stop", directory.name, timeout=90)
    result["slowdowns"] = show(env, directory).get("slowdowns") or []
    kinds = [(s.get("cause") or {}).get("kind") for s in result["slowdowns"]]
    named = [
        s for s, kind in zip(result["slowdowns"], kinds, strict=True) if kind == "input_pipeline"
    ]
    result["cause"] = ((named or result["slowdowns"] or [{}])[0].get("cause") or {}).get("words")
    result["ok"] = bool(named)
    result["seconds"] = round(time.monotonic() - t0, 1)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--preset", default="lora-tiny", choices=("lora-tiny", "resnet50-bf16"))
    ap.add_argument("--out", required=True, help="where the JSON goes")
    ap.add_argument("--simulate", action="store_true", help="a simulated GPU, the CPU working")
    args = ap.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpustation-slowdown-check-") as tmp:
        results = [check_process(args, Path(tmp)), check_loader(args, Path(tmp))]
    print()
    print(f"{'check':<16} {'run':<44} {'ok':<5} {'s':>6}  cause")
    for r in results:
        expected = not (args.simulate and r["check"] == "input pipeline")
        ok = ("yes" if r.get("ok") else "NO") if expected else "n/a"
        cause = r.get("cause") or r.get("error") or "none found"
        print(f"{r['check']:<16} {r['run']:<44} {ok:<5} {r.get('seconds', 0):>6}  {cause}")
    doc = {"simulated": args.simulate, "preset": args.preset, "gpu": args.gpu,
           "seconds": round(time.monotonic() - t0, 1), "checks": results}  # fmt: skip
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.out} ({doc['seconds']:.0f} s in all)")
    return 0 if all(r.get("ok") for r in results[: 1 if args.simulate else 2]) else 1


if __name__ == "__main__":
    sys.exit(main())
