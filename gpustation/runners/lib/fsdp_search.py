"""The fsdp runner's ``--find-max-model``: the largest model (layers at one width)
that trains on one GPU, with and without offload. Each size is a few steps of
the fsdp runner in its own child process, so every trial starts on a clean GPU;
layers are doubled until a trial runs out of memory, then bisected, within a
share of the time for each offload setting.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from gpustation.pyargv import python_argv
from gpustation.runners import EXIT_OOM
from gpustation.runners.lib import common, llm
from gpustation.runs.metrics import METRICS_ENV, RUN_DIR_ENV, MetricsWriter
from gpustation.runs.tail import parse_metric_line


def find_max_model(args: argparse.Namespace) -> int:
    """Grow the model until it does not fit one GPU, with and without offload."""
    device = common.pick_device(args.device)
    metrics = MetricsWriter.from_env()
    with metrics:
        if device.type != "cuda":
            why = "--find-max-model needs a CUDA GPU (on the CPU there is no GPU memory to fill)"
            print(f"skipped: {why}", flush=True)
            metrics.summary(find_max_model=None, skipped=why, device=str(device))
            return common.EXIT_OK
        t_start = time.monotonic()
        hidden = args.hidden_size or llm.MODEL_PRESETS[args.model_preset]["hidden_size"]
        results: dict[str, Any] = {}
        step_no = 0
        modes = {"both": (False, True), "no-offload": (False,), "offload": (True,)}
        searched = modes[getattr(args, "find_modes", "both")]
        for phase, offload in enumerate(searched):
            key = "offload" if offload else "no_offload"
            # An equal share of the time to each search: offloaded trials are the slow ones.
            deadline = t_start + args.find_max_seconds * (phase + 1) / len(searched)
            trials: list[dict[str, Any]] = []
            results[key] = {"trials": trials}
            fit: int | None = None
            no_fit: int | None = None
            layers = max(1, args.find_start_layers)
            while layers and time.monotonic() < deadline - 10:
                need = host_bytes_estimate(args.mode, layers, hidden, offload)
                avail = available_ram_bytes()
                if offload and avail and need > args.host_ram_fraction * avail:
                    trials.append({"layers": layers, "fits": False,
                                   "why": f"host RAM: needs ~{need / 2**30:.0f} GiB of "
                                          f"{avail / 2**30:.0f} GiB available"})  # fmt: skip
                    no_fit = layers if no_fit is None else min(no_fit, layers)
                else:
                    left = deadline - time.monotonic()
                    trial = run_trial(
                        args, layers, hidden, offload, min(args.find_trial_seconds, left)
                    )
                    trials.append(trial)
                    step_no += 1
                    metrics.log(
                        step=step_no, phase=key, layers=layers, fits=trial["fits"],
                        throughput=trial.get("tokens_per_s"), unit="tokens/s",
                        mem_peak_mib=trial.get("mem_peak_mib"),
                        host_rss_mib=trial.get("host_rss_peak_mib"),
                    )  # fmt: skip
                    print(f"[{key}] {layers} layers x hidden {hidden}: "
                          + (f"fits, {trial['tokens_per_s']:,.0f} tokens/s, "
                             f"{trial['params'] / 1e9:.2f}B params, GPU peak "
                             f"{trial['mem_peak_mib']:,.0f} MiB"
                             if trial["fits"] else f"does not fit ({trial['why']})"),
                          flush=True)  # fmt: skip
                    if trial["fits"]:
                        fit = layers
                    else:
                        no_fit = layers
                        if trial.get("why") not in ("out of memory",):
                            break  # a timeout or a failure: no point growing further
                layers = _next_layers(fit, no_fit)
            best = max((t for t in trials if t["fits"]), key=lambda t: t["layers"], default=None)
            results[key]["largest"] = best
        summary = {
            "find_max_model": results,
            "hidden_size": hidden,
            "mode": args.mode,
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "device": str(device),
        }
        for key in ("no_offload", "offload"):
            best = results.get(key, {}).get("largest")
            summary[f"{key}_max_layers"] = best["layers"] if best else None
            summary[f"{key}_max_params"] = best["params"] if best else None
            summary[f"{key}_tokens_per_s"] = best["tokens_per_s"] if best else None
        metrics.summary(**summary)
    print()
    common.print_table(
        ["offload", "largest (layers)", "params", "tokens/s", "GPU peak MiB", "host peak MiB"],
        [
            [key, b["layers"], f"{b['params'] / 1e9:.2f}B", common.fmt_rate(b["tokens_per_s"]),
             f"{b['mem_peak_mib']:,.0f}", f"{b['host_rss_peak_mib']:,.0f}"]
            if (b := results[key]["largest"]) else [key, "none fitted", "", "", "", ""]
            for key in ("no_offload", "offload") if key in results
        ],
    )  # fmt: skip
    return common.EXIT_OK


def _next_layers(fit: int | None, no_fit: int | None) -> int:
    """Double until something does not fit, then bisect; 0 when the search is done."""
    if no_fit is None:
        return (fit or 0) * 2 or 1
    lo = fit or 0
    if no_fit - lo <= max(1, lo // 8):  # within 1/8: close enough
        return 0
    return (lo + no_fit) // 2


def host_bytes_estimate(mode: str, layers: int, hidden: int, offload: bool) -> float:
    """Host memory an offloaded run needs: fp32 weights, plus gradients and Adam state
    of the trained ones (all of them in full mode, ~1% in lora mode)."""
    per_layer = 4 * hidden**2 + 3 * hidden * int(2.75 * hidden)
    params = layers * per_layer
    trained = params if mode == "full" else 0.01 * params
    return (4 * params + 12 * trained) * (1.0 if offload else 0.1) + 3 * 2**30


def available_ram_bytes() -> float | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024.0
    except OSError:
        pass
    return None


def trial_argv(
    args: argparse.Namespace, layers: int, hidden: int, offload: bool, output_dir: str
) -> list[str]:
    """The fsdp runner's argv for one trial."""
    return python_argv(
        "-m", "gpustation.runners.fsdp", "--device", "cuda",
        "--mode", args.mode, "--model-preset", args.model_preset,
        "--num-layers", str(layers), "--hidden-size", str(hidden),
        "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len),
        "--precision", args.precision, "--sharding", args.sharding,
        "--offload" if offload else "--no-offload",
        "--activation-checkpointing" if args.activation_checkpointing
        else "--no-activation-checkpointing",
        "--steps", "4", "--warmup-steps", "2", "--log-every", "2", "--output-dir", output_dir,
    )  # fmt: skip


def run_trial(
    args: argparse.Namespace, layers: int, hidden: int, offload: bool, timeout: float
) -> dict[str, Any]:
    """A few steps of the fsdp runner at one size in a child process (a clean GPU each time)."""
    with tempfile.TemporaryDirectory(prefix="fsdp-trial-") as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}  # fmt: skip
        env[METRICS_ENV] = str(metrics)
        env[RUN_DIR_ENV] = tmp
        cmd = trial_argv(args, layers, hidden, offload, tmp)
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"layers": layers, "fits": False, "why": f"over {timeout:.0f}s"}
        summary = None
        if metrics.exists():
            # a trial killed mid-write leaves a torn last line: skipped, not fatal
            for line in metrics.read_bytes().splitlines():
                event = parse_metric_line(line, check=False)
                if event is not None and "summary" in event:
                    summary = event["summary"]
        if proc.returncode == 0 and summary:
            return {"layers": layers, "fits": True, **{k: summary.get(k) for k in (
                "tokens_per_s", "params", "mem_peak_mib", "host_rss_peak_mib")}}  # fmt: skip
        if proc.returncode == EXIT_OOM:
            return {"layers": layers, "fits": False, "why": "out of memory"}
        if proc.returncode < 0:  # killed, e.g. by the kernel's OOM killer
            return {"layers": layers, "fits": False, "why": f"killed by signal {-proc.returncode}"}
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        return {"layers": layers, "fits": False, "why": f"exit {proc.returncode}: {tail[0]}"}
