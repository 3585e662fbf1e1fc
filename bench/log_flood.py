"""A run that prints 200,000 lines: what following it costs (headless part).

Side by side, median of ``--runs`` rounds:

- ``child > file``: the flood child alone, writing to a file (the floor);
- ``gpustation run``: the same child launched from a preset through the
  supervisor, its log streamed to a file by ``gpustation run``; wall time to
  the end, the CPU seconds of the ``gpustation run`` process, and whether
  every line arrived in order;
- ``Tailer``: reading the finished 200,000-line log by byte offset in 1 MiB
  bites, in-process (lines per second).

    python bench/log_flood.py [--lines 200000] [--runs 3]

Runs in a temporary config/data/state dir on simulated GPUs; nothing of the
user's is touched.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOD = (
    "import sys\n"
    "n = int(sys.argv[1])\n"
    "w = sys.stdout.write\n"
    "for i in range(n):\n"
    "    w(f'line {i} ' + 'x' * 60 + '\\n')\n"
)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    opts = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="gs-flood-") as tmp:
        root = Path(tmp)
        env = dict(os.environ)
        for kind in ("config", "data", "state"):
            (root / kind).mkdir()
            env[f"GPUSTATION_{kind.upper()}_DIR"] = str(root / kind)
        env["GPUSTATION_SIMULATE"] = "1"
        flood = root / "flood.py"
        flood.write_text(FLOOD)
        presets = root / "config" / "presets" / "runs"
        presets.mkdir(parents=True)
        (presets / "flood.toml").write_text(
            f'command = ["{sys.executable}", "{flood}", "{opts.lines}"]\ngpus = 1\n'
        )

        direct: list[float] = []
        gs_wall: list[float] = []
        gs_cpu: list[float] = []
        complete = True
        log_path: Path | None = None
        for _ in range(opts.runs):
            out = root / "direct.log"
            start = time.perf_counter()
            with open(out, "wb") as fh:
                subprocess.run([sys.executable, str(flood), str(opts.lines)], stdout=fh, check=True)
            direct.append(time.perf_counter() - start)

            out = root / "streamed.log"
            cpu0 = _children_cpu()
            start = time.perf_counter()
            with open(out, "wb") as fh:
                subprocess.run(
                    [sys.executable, "-m", "gpustation", "run", "flood"],
                    stdout=fh,
                    stderr=subprocess.DEVNULL,
                    env=env,
                    check=True,
                )
            gs_wall.append(time.perf_counter() - start)
            gs_cpu.append(_children_cpu() - cpu0)
            lines = out.read_bytes().splitlines()
            complete = (
                complete
                and len(lines) == opts.lines
                and lines[-1].startswith(b"line %d " % (opts.lines - 1))
            )
            log_path = next((root / "data" / "runs").glob("*/output.log"))

        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from gpustation.runs.tail import Tailer

        assert log_path is not None
        tail_s: list[float] = []
        for _ in range(opts.runs):
            start = time.perf_counter()
            count = 0
            with Tailer(log_path) as tailer:
                while True:
                    got = tailer.read_new(max_bytes=1 << 20)
                    if not got:
                        break
                    count += len(got)
            tail_s.append(time.perf_counter() - start)
        assert count == opts.lines, count

    med = statistics.median
    print(f"{opts.lines:,} lines, median of {opts.runs} runs")
    print(f"{'':32} {'wall s':>8} {'CPU s':>8}")
    print(f"{'child > file':32} {med(direct):8.2f} {'':>8}")
    print(f"{'gpustation run (log to file)':32} {med(gs_wall):8.2f} {med(gs_cpu):8.2f}")
    print(f"  every line arrived, in order: {'yes' if complete else 'NO'}")
    rate = opts.lines / med(tail_s)
    print(f"{'Tailer, 1 MiB bites':32} {med(tail_s):8.3f} {'':>8}  ({rate:,.0f} lines/s)")
    print("(CPU s: the gpustation run process with its supervisor and child)")
    return 0 if complete else 1


if __name__ == "__main__":
    raise SystemExit(main())
