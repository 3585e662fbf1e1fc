"""A sweep on a real GPU, each point's energy set beside the driver's own counter.

Runs ``gpustation sweep PRESET --set ...`` (no power-limit axis: nothing on
the card is changed) while a thread reads NVML's total energy counter
(``nvmlDeviceGetTotalEnergyConsumption``) of the run's GPUs every 0.1 s. For
each point it takes the counter at the run's start and end (from its
``state.json``), interpolated between readings, and prints that beside the
run's own recorded energy, with J/unit from the sweep.

    python bench/sweep_energy.py resnet50-bf16 --set batch_size=128,256 \\
        --set precision=bf16,fp16 --set compile=false --set steps=200
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--gpus", default="0")
    args = ap.parse_args()

    import pynvml

    pynvml.nvmlInit()
    indices = [int(i) for i in args.gpus.split(",")]
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
    readings: list[tuple[float, float]] = []  # (Unix time, J summed over the GPUs)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            mj = sum(pynvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in handles)
            readings.append((time.time(), mj / 1000.0))
            stop.wait(0.1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    argv = [sys.executable, "-m", "gpustation", "sweep", args.preset, "--gpus", args.gpus]
    for item in args.set:
        argv += ["--set", item]
    result = subprocess.run(argv, text=True)
    stop.set()
    thread.join()
    if result.returncode != 0:
        return result.returncode

    shown = subprocess.run(
        [sys.executable, "-m", "gpustation", "sweeps", "show", "last", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    sweep = json.loads(shown.stdout)
    data = Path(os.environ.get("GPUSTATION_DATA_DIR") or Path.home() / ".local/share/gpustation")
    times = [t for t, _ in readings]

    def counter_at(t: float) -> float:
        i = bisect.bisect_left(times, t)
        if i <= 0:
            return readings[0][1]
        if i >= len(readings):
            return readings[-1][1]
        (t0, e0), (t1, e1) = readings[i - 1], readings[i]
        return e0 + (e1 - e0) * (t - t0) / (t1 - t0)

    print(
        f"{'point':40} {'status':>9} {'thrpt':>10} {'J/unit':>9} "
        f"{'run energy J':>13} {'NVML counter J':>15} {'diff %':>7}"
    )
    for point in sweep["points"]:
        run_dir = data / "runs" / str(point["run_id"])
        state = json.loads((run_dir / "state.json").read_text())
        shown_run = subprocess.run(
            [sys.executable, "-m", "gpustation", "runs", "show", str(point["run_id"]), "--json"],
            capture_output=True,
            text=True,
        )
        run = json.loads(shown_run.stdout) if shown_run.returncode == 0 else {}
        recorded = run.get("energy_j")
        counter = counter_at(state["ended_at"]) - counter_at(state["started_at"])
        diff = 100 * (recorded - counter) / counter if recorded and counter else float("nan")
        f = point["figures"]
        label = " ".join(f"{k}={v}" for k, v in point["overrides"].items())
        print(
            f"{label:40} {point['status']:>9} {f.get('throughput') or 0:10.1f} "
            f"{f.get('energy_per_unit_j') or 0:9.4f} {recorded or 0:13.1f} {counter:15.1f} "
            f"{diff:7.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
