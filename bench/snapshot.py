"""Wall time of `gpustation snapshot` against nvidia-smi and nvitop -1.

Runs every command in turn (A B C A B C ...), after one warm-up round, and
prints the median wall time of each with its ratio to gpustation's. Commands
that are not installed are left out and said so.

    python bench/snapshot.py --runs 15 [--simulate] [--out results.json]
    python bench/snapshot.py --runs 21 --baseline /tmp/v0/bin/gpustation

``--baseline EXE`` adds another installed gpustation (an earlier version, say)
to the same rounds, table and JSON, so that before and after share a run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time


def candidates(simulate: bool, baseline: str | None = None) -> dict[str, list[str]]:
    gs = [sys.executable, "-m", "gpustation", "snapshot"]
    if simulate:
        gs += ["--simulate", "1"]
    cmds: dict[str, list[str]] = {
        "gpustation snapshot": gs,
        "gpustation snapshot --json": [*gs, "--json"],
    }
    if shutil.which("gpustation"):
        exe = [shutil.which("gpustation") or "gpustation", "snapshot"]
        if simulate:
            exe += ["--simulate", "1"]
        cmds["gpustation (console script)"] = exe
    if baseline:
        base = [baseline, "snapshot", *(["--simulate", "1"] if simulate else [])]
        cmds["baseline snapshot"] = base
        cmds["baseline snapshot --json"] = [*base, "--json"]
    if shutil.which("nvidia-smi"):
        cmds["nvidia-smi"] = ["nvidia-smi"]
        cmds["nvidia-smi --query-gpu (csv)"] = [
            "nvidia-smi",
            "--query-gpu=index,name,temperature.gpu,power.draw,power.limit,clocks.sm,"
            "memory.used,memory.total,utilization.gpu",
            "--format=csv",
        ]
    if shutil.which("nvitop"):
        cmds["nvitop -1"] = ["nvitop", "-1"]
    return cmds


def time_once(argv: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--simulate", action="store_true", help="time gpustation on simulated GPUs")
    ap.add_argument("--out", help="write the figures as JSON here")
    ap.add_argument("--baseline", help="another gpustation executable to time beside this one")
    args = ap.parse_args()

    cmds = candidates(args.simulate, args.baseline)
    for name in ("nvidia-smi", "nvitop -1"):
        if not any(k.startswith(name) for k in cmds):
            print(f"# {name}: not installed here, left out")
    times: dict[str, list[float]] = {k: [] for k in cmds}
    codes: dict[str, set[int]] = {k: set() for k in cmds}
    for round_ in range(args.runs + 1):
        for name, argv in cmds.items():
            elapsed, code = time_once(argv)
            if round_:  # round 0 warms caches and is not counted
                times[name].append(elapsed)
                codes[name].add(code)
    ref = statistics.median(times["gpustation snapshot"])
    smi = statistics.median(times["nvidia-smi"]) if times.get("nvidia-smi") else None
    print(
        f"{'command':34} {'median s':>9} {'min s':>7} {'max s':>7} {'x gpustation':>12} "
        f"{'x nvidia-smi':>12}  exit"
    )
    result = {}
    for name, values in times.items():
        med = statistics.median(values)
        result[name] = {"median_s": med, "min_s": min(values), "max_s": max(values)}
        vs_smi = f"{med / smi:12.2f}" if smi else f"{'-':>12}"
        print(
            f"{name:34} {med:9.3f} {min(values):7.3f} {max(values):7.3f} "
            f"{med / ref:12.2f} {vs_smi}  {sorted(codes[name])}"
        )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"runs": args.runs, "results": result}, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
