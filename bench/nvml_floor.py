"""What a one-shot read of the GPUs costs before any gpustation code runs.

    python bench/nvml_floor.py [--runs 15]

Each run is a fresh interpreter that calls libnvidia-ml through ctypes alone,
the way a one-shot `gpustation snapshot` must: NVML's start, every GPU's
handle, then the fields the snapshot table prints, each read twice (the
driver's first answer to each getter in a process is the slow one), and the
exit. The script prints the medians in ms, and for comparison the wall time
of an interpreter that does nothing and of one that only imports ctypes. It
only reads; it changes no GPU setting.

``exit normal`` and ``exit os._exit`` are the time from the child's last
write to its parent seeing it gone, with Python's normal exit (which runs the
NVML library's teardown) and with ``os._exit``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, os, sys, time
P = time.perf_counter
t0 = P()
import ctypes
rec = {"import ctypes": (P() - t0) * 1e3}
s = P()
lib = ctypes.CDLL("libnvidia-ml.so.1")
rec["load library"] = (P() - s) * 1e3
s = P()
assert lib.nvmlInitWithFlags(0) == 0
rec["nvmlInit"] = (P() - s) * 1e3
count = ctypes.c_uint()
lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
handles = []
s = P()
for i in range(count.value):
    h = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == 0
    handles.append(h)
rec["handles"] = (P() - s) * 1e3
U, ULL = ctypes.c_uint, ctypes.c_ulonglong


class Memory(ctypes.Structure):
    _fields_ = [("total", ULL), ("free", ULL), ("used", ULL)]


class Utilization(ctypes.Structure):
    _fields_ = [("gpu", U), ("memory", U)]


def out(t):
    return ctypes.byref(t())


FIELDS = {
    "temperature": lambda h: lib.nvmlDeviceGetTemperature(h, 0, out(U)),
    "power": lambda h: lib.nvmlDeviceGetPowerUsage(h, out(U)),
    "power limit": lambda h: lib.nvmlDeviceGetEnforcedPowerLimit(h, out(U)),
    "SM clock": lambda h: lib.nvmlDeviceGetClockInfo(h, 1, out(U)),
    "memory clock": lambda h: lib.nvmlDeviceGetClockInfo(h, 2, out(U)),
    "memory": lambda h: lib.nvmlDeviceGetMemoryInfo(h, out(Memory)),
    "utilization": lambda h: lib.nvmlDeviceGetUtilizationRates(h, out(Utilization)),
    "P-state": lambda h: lib.nvmlDeviceGetPerformanceState(h, out(U)),
    "clock event reasons": lambda h: lib.nvmlDeviceGetCurrentClocksEventReasons(h, out(ULL)),
    "PCIe generation": lambda h: lib.nvmlDeviceGetCurrPcieLinkGeneration(h, out(U)),
    "PCIe width": lambda h: lib.nvmlDeviceGetCurrPcieLinkWidth(h, out(U)),
    "processes": lambda h: lib.nvmlDeviceGetComputeRunningProcesses_v3(h, out(U), None),
    "graphics processes": lambda h: lib.nvmlDeviceGetGraphicsRunningProcesses_v3(h, out(U), None),
}
for name, read in FIELDS.items():
    s = P()
    for h in handles:
        read(h)
    rec["first read: " + name] = (P() - s) * 1e3
s = P()
for h in handles:
    for read in FIELDS.values():
        read(h)
rec["all fields again"] = (P() - s) * 1e3
s = P()
for h in handles:
    lib.nvmlDeviceGetTotalEccErrors(h, 1, 0, out(ULL))
rec["first read: ECC (not in the table)"] = (P() - s) * 1e3
rec["in process"] = (P() - t0) * 1e3
rec["gpus"] = count.value
sys.stdout.write(json.dumps(rec) + "\n")
sys.stdout.flush()
sys.stderr.write(repr(time.time()))
sys.stderr.flush()
if sys.argv[1] == "os._exit":
    os._exit(0)
"""


def run_child(how: str) -> dict[str, float]:
    start = time.time()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, how], capture_output=True, text=True, check=True
    )
    end = time.time()
    rec = json.loads(proc.stdout)
    rec["wall"] = (end - start) * 1e3
    rec[f"exit {how}"] = (end - float(proc.stderr)) * 1e3
    return rec


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True)
    return (time.perf_counter() - start) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    rows: dict[str, list[dict[str, float]]] = {"normal": [], "os._exit": []}
    empty: list[float] = []
    ctypes_only: list[float] = []
    for i in range(args.runs + 1):
        for how, kept in rows.items():
            rec = run_child(how)
            if i:
                kept.append(rec)
        e = wall([sys.executable, "-c", "pass"])
        c = wall([sys.executable, "-c", "import ctypes"])
        if i:
            empty.append(e)
            ctypes_only.append(c)
    normal = rows["normal"]
    print(f"{int(normal[0]['gpus'])} GPU(s), {args.runs} runs, medians in ms")
    print(f"  {'interpreter, -c pass (wall)':40} {statistics.median(empty):7.2f}")
    print(f"  {'interpreter, -c import ctypes (wall)':40} {statistics.median(ctypes_only):7.2f}")
    for key in normal[0]:
        if key in ("gpus", "wall"):
            continue
        print(f"  {key:40} {statistics.median(r[key] for r in normal):7.2f}")
    quick = rows["os._exit"]
    print(f"  {'exit os._exit':40} {statistics.median(r['exit os._exit'] for r in quick):7.2f}")
    print(f"  {'wall, normal exit':40} {statistics.median(r['wall'] for r in normal):7.2f}")
    print(f"  {'wall, os._exit':40} {statistics.median(r['wall'] for r in quick):7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
