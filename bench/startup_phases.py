"""Where the dashboard's start-up time goes, phase by phase, in one process.

Prints seconds since the process started (from /proc) at each step: the
interpreter up, gpustation's dashboard source imported, the driver opened and
the first sample read on the source's thread (as the dashboard starts it), the
UI imported meanwhile, and both done; then the same reads again, warm. Run it
as the dashboard is run (the same Python, byte-compiled), with ``--simulate``
for simulated GPUs. Read-only.

    python bench/startup_phases.py            # this machine's GPUs
    python bench/startup_phases.py --simulate 1
"""

from __future__ import annotations

import argparse
import os
import time


def since_start() -> float:
    """Seconds since this process started (its start time in /proc)."""
    with open(f"/proc/{os.getpid()}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/uptime", encoding="ascii") as fh:
        uptime = float(fh.read().split()[0])
    return uptime - int(fields[19]) / ticks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", type=int)
    args = parser.parse_args()
    marks = [("interpreter up, arguments read", since_start())]
    t0 = time.perf_counter()
    from gpustation.tui.source import dashboard_source

    marks.append(("dashboard source imported", since_start()))
    source = dashboard_source(simulate=args.simulate)
    source.start_first_pass()
    from gpustation.tui import app  # noqa: F401  (the UI, imported while the first pass reads)

    marks.append(("UI imported (first pass going on)", since_start()))
    frame = source.sample()
    marks.append(("first sample in hand", since_start()))
    cpu = time.process_time()
    for label, at in marks:
        print(f"{at:7.3f} s  {label}")
    wall = time.perf_counter() - t0
    print(f"CPU of this process so far: {cpu:.3f} s; wall since imports began {wall:.3f} s")
    for n in range(3):
        t = time.perf_counter()
        source.sample()
        print(f"warm pass {n + 1}: {1000 * (time.perf_counter() - t):.1f} ms")
    print(f"GPUs: {len(frame.snapshot.gpus)}, simulated: {frame.snapshot.simulated}")
    source.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
