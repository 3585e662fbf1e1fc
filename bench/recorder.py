"""Size of a flight recording and the cost of opening it and seeking in it.

Writes ``--snapshots`` snapshots of ``--gpus`` simulated H200s one second
apart (power and temperature drawn at random each second, so the figures are
worse than a real, steadier card's), then opens the recording (the index of
frames) and seeks to random times. Side by side: a seek that decompresses and
parses from the start of the file, as a recording without an index would.

    .venv/bin/python bench/recorder.py                      # a day of 8 GPUs
    .venv/bin/python bench/recorder.py --gpus 1 --snapshots 3600
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import zstandard

from gpustation.telemetry.recording.file import Recording
from gpustation.telemetry.recording.recorder import Recorder
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend

START = 2_000_000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--snapshots", type=int, default=86_400)
    parser.add_argument("--seeks", type=int, default=100)
    args = parser.parse_args()
    clock = [START]
    backend = SimBackend(
        count=args.gpus, card="h200", seed=0, state_path=None, clock=lambda: clock[0]
    )
    snap = Sampler(backend, clock=lambda: clock[0]).sample()
    doc_bytes = len(json.dumps(snap.to_dict(), separators=(",", ":")))
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.jsonl.zst"
        mono = [0.0]
        t0 = time.perf_counter()
        with Recorder(path, max_size=10**12, clock=lambda: mono[0]) as rec:
            for _ in range(args.snapshots):
                snap.time = clock[0]
                for g in snap.gpus:
                    g.power_w = rng.uniform(100, 700)
                    g.temperature_c = rng.uniform(30, 80)
                rec.add(snap)
                clock[0] += 1.0
                mono[0] += 1.0
        write_s = time.perf_counter() - t0
        size = path.stat().st_size
        t0 = time.perf_counter()
        recording = Recording(path)
        open_s = time.perf_counter() - t0
        seeks = []
        for _ in range(args.seeks):
            t = START + rng.uniform(0, args.snapshots)
            t0 = time.perf_counter()
            recording.snapshot_at(t)
            seeks.append(time.perf_counter() - t0)
        naive = []
        for _ in range(3):
            t = START + rng.uniform(0, args.snapshots)
            t0 = time.perf_counter()
            reader = zstandard.ZstdDecompressor().stream_reader(
                path.open("rb"), read_across_frames=True
            )
            for line in io.BufferedReader(reader):
                if json.loads(line)["time"] > t:
                    break
            naive.append(time.perf_counter() - t0)
    n = args.snapshots
    print(f"{n} snapshots of {args.gpus} GPUs ({doc_bytes:,} B of JSON each), one a second\n")
    print("| figure | value |\n|---|---|")
    print(f"| written in | {write_s:.1f} s ({write_s / n * 1e6:.0f} µs a snapshot) |")
    print(
        f"| file | {size / 1e6:.1f} MB, {size / n:.0f} B a snapshot ({doc_bytes * n / size:.0f}x) |"
    )
    print(f"| frames | {len(recording.frames)} |")
    print(f"| open (index) | {open_s * 1e3:.0f} ms |")
    print(f"| seek, median of {args.seeks} | {statistics.median(seeks) * 1e3:.1f} ms |")
    print(
        f"| seek from the start, no index, median of 3 | {statistics.median(naive) * 1e3:.0f} ms |"
    )


if __name__ == "__main__":
    main()
