"""A run that prints 200,000 lines: what following it costs, headless and in the dashboard.

Side by side, median of ``--runs`` rounds:

- ``child > file``: the flood child alone, writing to a file (the floor);
- ``gpustation run``: the same child launched from a preset through the
  supervisor, its log streamed to a file by ``gpustation run``; wall time to
  the end, the CPU seconds of the ``gpustation run`` process, and whether
  every line arrived in order;
- ``Tailer``: reading the finished 200,000-line log by byte offset in 1 MiB
  bites, in-process (lines per second).

Dashboard part: ``gpustation --simulate 1`` under a pseudo-terminal of
``--size`` (160x48 unless told). The script opens the runs screen (``r``), launches the flood preset
through the launch form (``l``, Enter) and, while the dashboard follows the
flood, presses ``j`` and ``k`` (preset list cursor down, up) again and again.
The latency of a key is the time from writing it to the pty until the
description of the newly highlighted preset arrives in the pty output: the
key handled and the screen repainted.
Each press waits for the previous answer (a person does not type ahead of the
screen). A round lasts until the log pane has painted the flood's last line.
Reported: key latency p50/p99 with no flood and during the flood, how long
the dashboard took to show the last line, the dashboard's peak RSS (VmHWM)
before and after, and that every run's ``output.log`` holds every line.

    python bench/log_flood.py [--lines 200000] [--runs 3] [--part headless|dashboard|both]
                              [--size 160x48] [--trace]

Runs in a temporary config/data/state dir on simulated GPUs; nothing of the
user's is touched.
"""

from __future__ import annotations

import argparse
import os
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ptyrun import reap, spawn  # noqa: E402

FLOOD = (
    "import sys\n"
    "n = int(sys.argv[1])\n"
    "w = sys.stdout.write\n"
    "for i in range(n):\n"
    "    w(f'line {i} ' + 'x' * 60 + '\\n')\n"
)

# The dashboard half's flood: each line starts with the end of its run's id, so
# the last line of one round cannot be mistaken for the last line of another
# (the log pane of the previous run repaints when the launch form closes).
FLOOD_TAGGED = (
    "import os, sys\n"
    "n = int(sys.argv[1])\n"
    "tag = os.environ.get('GPUSTATION_RUN_ID', 'run')[-4:]\n"
    "w = sys.stdout.write\n"
    "for i in range(n):\n"
    "    w(f'{tag} line {i} ' + 'x' * 55 + '\\n')\n"
)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# ---- the dashboard half ------------------------------------------------------------------


class Terminal:
    """A program under a pseudo-terminal; its output is kept to search for text."""

    def __init__(self, argv: list[str], env: dict[str, str], cols: int, rows: int) -> None:
        self.pid, self.fd = spawn(argv, env, cols, rows)
        self.out = bytearray()
        self.closed = False

    def read(self, timeout: float) -> None:
        """Read what arrives within ``timeout`` seconds (at least one select)."""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if ready:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
            self.out += chunk

    def wait_for(self, text: str, since: int, timeout: float) -> float | None:
        """``time.monotonic()`` when ``text`` appeared after offset ``since`` (None: never)."""
        needle = text.encode()
        deadline = time.monotonic() + timeout
        start = max(0, since - len(needle))
        while True:
            if self.out.find(needle, start) >= 0:
                return time.monotonic()
            start = max(start, len(self.out) - len(needle))
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                return None
            self.read(min(left, 0.05))

    def press(self, key: str) -> int:
        """Write a key; return the output offset from which its answer counts."""
        self.read(0)
        offset = len(self.out)
        os.write(self.fd, key.encode())
        return offset

    def vm_hwm_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def close(self) -> None:
        reap(self.pid, self.fd, grace_s=10)


def _newest_run(runs_root: Path, preset: str, seen: set[str], timeout: float = 10.0) -> Path:
    """The new run directory of ``preset`` (one not in ``seen``; waits for its run.json)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [p.parent for p in runs_root.glob(f"*-{preset}-*/run.json")]
        new = [p for p in found if p.name not in seen]
        if new:
            return new[0]
        if time.monotonic() > deadline:
            raise SystemExit(f"no run directory of {preset} appeared")
        time.sleep(0.05)


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))]


def dashboard_half(
    root: Path,
    env: dict[str, str],
    lines: int,
    rounds: int,
    trace: bool = False,
    size: tuple[int, int] = (160, 48),
) -> bool:
    """Flood the dashboard's runs screen; print latency, memory and completeness.

    ``trace`` prints each key of a flood as it is answered: when it was sent
    (``time.monotonic()``, to line up with a profile of the dashboard), how long
    after Enter, and its latency.
    """
    sys.path.insert(0, str(REPO))
    from gpustation.runs.presets import load_presets

    flood = root / "flood_tagged.py"
    flood.write_text(FLOOD_TAGGED)
    presets = root / "config" / "presets" / "runs"
    runs_root = root / "data" / "runs"
    # Named to sort first in the preset list, so the launch key finds it at once.
    (presets / "aa-flood.toml").write_text(
        'title = "aa-flood: prints lines as fast as it can"\n'
        'description = "Prints lines as fast as it can"\n'
        f'command = ["{sys.executable}", "{flood}", "{lines}"]\ngpus = 1\n'
    )
    listed = list(
        load_presets([("package", REPO / "gpustation" / "presets" / "runs"), ("user", presets)])[
            0
        ].values()
    )
    # The key moves the preset list's cursor (j down, k up, alternately); its answer
    # is the description of the newly highlighted preset under the list, in the left
    # column, where no notification ever covers it. Below 100 columns that line is
    # not shown: there the answer is the title in the list's highlighted row, drawn
    # in the same frame.
    wide = size[0] >= 100
    answers = [(p.description if wide else p.display_title)[:20] for p in (listed[0], listed[1])]
    cols, rows = size
    dash_env = dict(env, TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
    dash_env.pop("GPUSTATION_SIMULATE", None)
    dash_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), dash_env.get("PYTHONPATH", "")) if p
    )
    term = Terminal([sys.executable, "-m", "gpustation", "--simulate", "1"], dash_env, cols, rows)
    position = 0

    def press_key() -> float | None:
        nonlocal position
        position = 1 - position
        sent = time.monotonic()
        offset = term.press("j" if position else "k")
        got = term.wait_for(answers[position], offset, timeout=5.0)
        return None if got is None else got - sent

    idle: list[float] = []
    busy: list[float] = []
    #: (seconds after Enter, latency) of each key during a flood
    busy_at: list[tuple[float, float]] = []
    missed = 0
    catch_up: list[float] = []
    try:
        if term.wait_for("SIMULATED", 0, 60) is None:
            raise SystemExit("the dashboard did not draw its first frame in 60 s")
        offset = term.press("r")
        if term.wait_for("aa-flood", offset, 30) is None:
            raise SystemExit("the runs screen did not list the flood preset")
        term.wait_for("never", len(term.out), 1.0)  # let it settle
        for _ in range(40):
            latency = press_key()
            if latency is None:
                missed += 1
            else:
                idle.append(latency)
            time.sleep(0.02)
        rss_idle = term.vm_hwm_mib()
        seen_runs: set[str] = set()
        for _ in range(rounds):
            if position:  # back on the flood preset before launching it
                press_key()
            offset = term.press("l")
            if term.wait_for("Launch aa-flood", offset, 10) is None:
                raise SystemExit("the launch form did not open")
            # Enter before the form has focused its field would be lost: retry until it launches.
            for _ in range(10):
                term.wait_for("never", len(term.out), 0.3)
                offset = term.press("\r")
                launched = time.monotonic()
                if term.wait_for("Launching aa-flood", offset, 2.0) is not None:
                    break
            else:
                raise SystemExit("Enter in the launch form did not launch the run")
            run_dir = _newest_run(runs_root, "aa-flood", seen_runs)
            seen_runs.add(run_dir.name)
            last_line = f"{run_dir.name[-4:]} line {lines - 1} "
            deadline = launched + 180
            while time.monotonic() < deadline:
                pressed = time.monotonic() - launched
                latency = press_key()
                if latency is None:
                    missed += 1
                else:
                    busy.append(latency)
                    busy_at.append((pressed, latency))
                    if trace:
                        sent = time.monotonic() - latency
                        print(f"key {sent:.3f} +{pressed:.2f}s {1000 * latency:.0f} ms")
                seen = term.wait_for(last_line, offset, 0.0)
                if seen is not None:
                    catch_up.append(seen - launched)
                    break
                time.sleep(0.02)
            else:
                raise SystemExit("the log pane never showed the flood's last line")
            term.wait_for("never", len(term.out), 2.0)  # the run ends; the history updates
        rss_flood = term.vm_hwm_mib()
        offset = term.press("q")
        if term.wait_for("or leave", offset, 2.0) is not None:
            term.press("l")
    finally:
        term.close()
        if os.environ.get("LOG_FLOOD_DUMP"):
            Path(os.environ["LOG_FLOOD_DUMP"]).write_bytes(bytes(term.out))

    complete = True
    logs = sorted(runs_root.glob("*-aa-flood-*/output.log"))
    for log in logs:
        data = log.read_bytes()
        tag = log.parent.name[-4:].encode()
        last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
        complete = (
            complete
            and data.count(b"\n") == lines
            and data.startswith(tag + b" line 0 ")
            and last.startswith(tag + b" line %d " % (lines - 1))
        )
    complete = complete and len(logs) == rounds

    def row(name: str, values: list[float]) -> str:
        if not values:
            return f"{name:40} {'-':>8} {'-':>8} {'-':>8} {0:>6}"
        return (
            f"{name:40} {1000 * statistics.median(values):8.1f} "
            f"{1000 * percentile(values, 99):8.1f} {1000 * max(values):8.1f} {len(values):>6}"
        )

    print()
    print(f"dashboard ({cols}x{rows} pty, --simulate 1), {lines:,}-line flood, {rounds} rounds")
    print(f"{'key j/k -> preset cursor moved, ms':40} {'p50':>8} {'p99':>8} {'max':>8} {'keys':>6}")
    print(row("no run", idle))
    print(row("during the flood", busy))
    if missed:
        print(f"  keys with no visible answer within 5 s: {missed}")
    slowest = sorted(busy_at, key=lambda k: -k[1])[:5]
    print(
        "slowest keys during the flood (ms, at s after Enter): "
        + ", ".join(f"{1000 * lat:.0f} at {at:.2f}" for at, lat in slowest)
    )
    print(
        f"last line shown after launch: median {statistics.median(catch_up):.2f} s "
        f"(rounds: {', '.join(f'{c:.2f}' for c in catch_up)})"
    )
    print(f"dashboard peak RSS (VmHWM): {rss_idle:.0f} MiB before, {rss_flood:.0f} MiB after")
    print(f"every line in each run's output.log ({len(logs)} runs): {'yes' if complete else 'NO'}")
    return complete and not missed


def headless_half(root: Path, env: dict[str, str], lines: int, runs: int) -> bool:
    """The flood through ``gpustation run`` and the Tailer; print the figures."""
    flood = root / "flood.py"
    direct: list[float] = []
    gs_wall: list[float] = []
    gs_cpu: list[float] = []
    complete = True
    log_path: Path | None = None
    for _ in range(runs):
        out = root / "direct.log"
        start = time.perf_counter()
        with open(out, "wb") as fh:
            subprocess.run([sys.executable, str(flood), str(lines)], stdout=fh, check=True)
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
        got_lines = out.read_bytes().splitlines()
        complete = (
            complete
            and len(got_lines) == lines
            and got_lines[-1].startswith(b"line %d " % (lines - 1))
        )
        log_path = next((root / "data" / "runs").glob("*/output.log"))

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from gpustation.runs.tail import Tailer

    assert log_path is not None
    tail_s: list[float] = []
    for _ in range(runs):
        start = time.perf_counter()
        count = 0
        with Tailer(log_path) as tailer:
            while True:
                got = tailer.read_new(max_bytes=1 << 20)
                if not got:
                    break
                count += len(got)
        tail_s.append(time.perf_counter() - start)
    assert count == lines, count

    med = statistics.median
    print(f"{lines:,} lines, median of {runs} runs")
    print(f"{'':32} {'wall s':>8} {'CPU s':>8}")
    print(f"{'child > file':32} {med(direct):8.2f} {'':>8}")
    print(f"{'gpustation run (log to file)':32} {med(gs_wall):8.2f} {med(gs_cpu):8.2f}")
    print(f"  every line arrived, in order: {'yes' if complete else 'NO'}")
    rate = lines / med(tail_s)
    print(f"{'Tailer, 1 MiB bites':32} {med(tail_s):8.3f} {'':>8}  ({rate:,.0f} lines/s)")
    print("(CPU s: the gpustation run process with its supervisor and child)")
    return complete


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--part", choices=("headless", "dashboard", "both"), default="both")
    parser.add_argument(
        "--size",
        default="160x48",
        metavar="COLSxROWS",
        help="the dashboard's terminal size (default 160x48)",
    )
    parser.add_argument(
        "--trace", action="store_true", help="print every key of a flood as it is answered"
    )
    opts = parser.parse_args()
    cols, _, rows = opts.size.partition("x")
    if not (cols.isdigit() and rows.isdigit() and int(cols) >= 80 and int(rows) >= 24):
        parser.error(f"--size: COLSxROWS, at least 80x24, got {opts.size!r}")
    size = (int(cols), int(rows))

    ok = True
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
        if opts.part in ("headless", "both"):
            ok = headless_half(root, env, opts.lines, opts.runs) and ok
        if opts.part in ("dashboard", "both"):
            ok = dashboard_half(root, env, opts.lines, opts.runs, opts.trace, size) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
