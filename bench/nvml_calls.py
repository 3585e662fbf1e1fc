"""What the NVML driver costs gpustation, call by call (needs an NVIDIA GPU).

    python bench/nvml_calls.py --timeline [--json]   # every NVML call of one `gpustation snapshot`
    python bench/nvml_calls.py --cost                # wall and CPU time of the slow getters

``--timeline`` runs ``gpustation snapshot`` (or ``--json``) in a fresh
interpreter with every function of the built-in NVML binding wrapped, six
times (the first, not shown, leaves the static-value cache the others find),
and prints the middle run's calls: name, thread, start and duration in ms
from the moment the binding was imported. ``--cost`` times the getters the
dashboard reads on its slow cadence, and a static one, in this process: wall
time, and the process CPU time the driver spent (some of them compute, some
wait).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CHILD = r"""
import contextlib, io, json, sys, threading, time
P = time.perf_counter
T0 = P()
import gpustation.telemetry.nvml_lite as lite
calls = []
for name in dir(lite):
    fn = getattr(lite, name)
    if name.startswith("nvml") and name[4:5].isupper() and callable(fn):
        def wrapped(*a, _fn=fn, _name=name, **k):
            s = P()
            try:
                return _fn(*a, **k)
            finally:
                calls.append((_name, threading.current_thread().name, round((s - T0) * 1e3, 2),
                              round((P() - s) * 1e3, 2)))
        setattr(lite, name, wrapped)
from gpustation.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "done_ms": round((P() - T0) * 1e3, 2), "calls": calls}))
"""


def timeline(as_json: bool) -> None:
    argv = ["snapshot", "--json"] if as_json else ["snapshot"]
    runs = []
    for _ in range(6):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, check=True
        ).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    runs = sorted(runs[1:], key=lambda r: r["done_ms"])
    run = runs[len(runs) // 2]
    print(f"gpustation {' '.join(argv)}: done {run['done_ms']:.1f} ms after the binding's import")
    print(f"{'call':45} {'thread':18} {'start ms':>9} {'ms':>7}")
    for name, thread, start, dur in run["calls"]:
        print(f"{name:45} {thread[:18]:18} {start:9.2f} {dur:7.2f}")


def cost(repeat: int) -> None:
    from gpustation.telemetry import nvml_lite as nvml

    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    getters = [
        ("PCIe throughput (tx)", nvml.nvmlDeviceGetPcieThroughput, (handle, 0)),
        ("energy counter", nvml.nvmlDeviceGetTotalEnergyConsumption, (handle,)),
        ("PCIe replay counter", nvml.nvmlDeviceGetPcieReplayCounter, (handle,)),
        ("utilization", nvml.nvmlDeviceGetUtilizationRates, (handle,)),
        ("max SM clock (static)", nvml.nvmlDeviceGetMaxClockInfo, (handle, 1)),
    ]
    print(f"{'getter':24} {'wall ms':>8} {'CPU ms':>7}  (mean of {repeat}, after one first call)")
    for label, fn, args in getters:
        fn(*args)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(repeat):
            fn(*args)
        wall = (time.perf_counter() - wall) / repeat * 1e3
        cpu = (time.process_time() - cpu) / repeat * 1e3
        print(f"{label:24} {wall:8.2f} {cpu:7.2f}")
    nvml.nvmlShutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--timeline", action="store_true", help="the calls of one snapshot")
    mode.add_argument("--cost", action="store_true", help="wall and CPU time of slow getters")
    ap.add_argument("--json", action="store_true", help="with --timeline: `snapshot --json`")
    ap.add_argument("--repeat", type=int, default=5, help="with --cost: calls per getter")
    args = ap.parse_args()
    if args.timeline:
        timeline(args.json)
    else:
        cost(args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
