"""Where the time of one `gpustation snapshot` goes, phase by phase, in-process.

    python bench/snapshot_phases.py [--json] [--simulate] [--repeat 5]

Each repeat runs in a fresh interpreter (imports and NVML's first calls are
part of what a user pays), and the phases' medians are printed in ms. It
reads what ``gpustation snapshot`` reads: the table's fields, or with
``--json`` every field (slow ones and topology included). The first run, not
counted, leaves the static-value cache that later one-shot runs find.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
marks = {}
def mark(name):
    marks[name] = (time.perf_counter() - t0) * 1000
from gpustation.telemetry.backend import open_backend
from gpustation.telemetry.sampler import Sampler
mark("import core")
simulate = 1 if sys.argv[1] == "sim" else None
full = sys.argv[2] == "json"
backend = open_backend(simulate=simulate, one_shot=True, slow_fields=full)
mark("open backend (nvmlInit, handles, static values)")
sampler = Sampler(backend, with_topology=full)
mark("sampler (versions)")
snap = sampler.sample(slow=full)
mark("first sample" + (" (fast + slow fields, topology, host)" if full else " (fast fields, host)"))
if full:
    doc = json.dumps(snap.to_dict())
    mark("to JSON")
else:
    from gpustation.telemetry.table import render_snapshot
    render_snapshot(snap)
    mark("render table")
backend.close()
mark("close")
print(json.dumps(marks))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--simulate", action="store_true")
    ap.add_argument("--json", action="store_true", help="the --json path: every field")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    runs = []
    for _ in range(args.repeat + 1):
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                "sim" if args.simulate else "nvml",
                "json" if args.json else "table",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    runs = runs[1:]  # the first run warms the file cache
    prev = 0.0
    print(f"{'phase':55} {'ms':>8} {'cumulative':>11}")
    for phase in runs[0]:
        cum = statistics.median(r[phase] for r in runs)
        print(f"{phase:55} {cum - prev:8.1f} {cum:11.1f}")
        prev = cum
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
