"""CPU cost and start-up time of the dashboard, side by side with other monitors.

Each program runs under a pseudo-terminal of 160x48 (``pty.fork``), as a
person would run it; nothing reads its screen but this script, which drains
the output as fast as it comes.

* first frame: seconds from spawn until the program's screen shows its marker
  text. The output is played onto a virtual 160x48 screen
  (:class:`VirtualScreen`: cursor moves, erases and repeats applied, other
  escape sequences dropped) and the marker is looked for in the screen's rows,
  so text that a curses program writes in pieces, or updates one changed cell
  at a time, still matches. Markers: for gpustation the temperature of a GPU
  card (``Temp  63 C`` on a full card, ``63C  381/450W`` on a compact one),
  drawn only once the first sample is in; for the reference apps the text of
  their second card; for nvitop a GPU's memory ``used / total`` in any unit
  (``0B / 140.4GiB`` on an idle H200: a bare ``MiB`` may never be printed).
  The table names the marker that matched and the text it matched.
* CPU: user+sys seconds of the process from /proc/<pid>/stat, in its first
  5 s and over the following 20 s (steady state at the default refresh).
* RSS: resident memory at the end of the window.
* sampling: the time of one sampling pass (fast fields) per GPU.

The programs are measured in alternation, ``--rounds`` times (default 3),
after one unmeasured warm-up round; the table gives each one's medians and
its rounds. Python code runs byte-compiled, as an installed program does:
gpustation's (and its dependencies') compiled files go to a cache of the
benchmark's own, written in the warm-up round; nvitop uses its install's.
With nvitop measured, the last lines hold gpustation to the targets of
``gpustation/tui/budget.py`` against nvitop's figures of the same run.

    .venv/bin/python bench/dashboard_cpu.py                  # this machine
    .venv/bin/python bench/dashboard_cpu.py --gpus 8         # 8 simulated GPUs
    .venv/bin/python bench/dashboard_cpu.py --real --nvitop  # on a GPU machine

Results go to stdout as a Markdown table (copy them into bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import codecs
import os
import re
import select
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ptyrun import quit_and_reap, spawn  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")

# One escape sequence (CSI with its parameters, OSC/DCS strings, two- and
# three-byte escapes) or one control character, as text (the stream is decoded).
_ESCAPE = re.compile(
    r"\x1b\[([0-9:;?<>=]*)[ -/]*([@-~])"
    r"|\x1b[\]P_^][^\x07\x1b]*(?:\x07|\x1b\\)"
    r"|\x1b[()*+#%][0-9A-Za-z@]"
    r"|\x1b([0-9A-Za-z=<>@\\^_`~])"
    r"|([\x00-\x1f\x7f])"
)
# The start of an escape sequence that a read cut in two: kept for the next read.
_PARTIAL = re.compile(
    r"\x1b(?:\[[0-9:;?<>= -/]*|[\]P_^](?:[^\x07\x1b]|\x1b(?=[^\\]))*\x1b?|[()*+#%])?\Z"
)


class VirtualScreen:
    """Just enough of a terminal to read what a program has put on screen.

    Output is applied as a terminal would: printable text at the cursor,
    absolute and relative cursor moves, line feeds, erases (ED, EL, ECH) and
    character repeat (REP, which ncurses uses for runs of one character).
    Colours and modes are dropped. A curses program writes only the cells that
    changed and skips blanks with cursor moves, so matching the raw stream,
    even with escapes stripped, misses text that is there on screen.
    """

    def __init__(self, cols: int = 160, rows: int = 48) -> None:
        self.cols, self.rows = cols, rows
        self.cells = [[" "] * cols for _ in range(rows)]
        self.x = self.y = 0
        self._saved = (0, 0)
        self._last = " "
        self._pending = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data: bytes) -> None:
        """Apply a chunk of output (sequences may be split between chunks)."""
        text = self._pending + self._decoder.decode(data)
        cut = _PARTIAL.search(text)
        self._pending = text[cut.start() :] if cut else ""
        if cut:
            text = text[: cut.start()]
        pos = 0
        for m in _ESCAPE.finditer(text):
            if m.start() > pos:
                self._put(text[pos : m.start()])
            pos = m.end()
            params, final, esc, ctrl = m.group(1, 2, 3, 4)
            if final is not None:
                self._csi(params, final)
            elif esc is not None:
                self._esc(esc)
            elif ctrl is not None:
                self._control(ctrl)
        if pos < len(text):
            self._put(text[pos:])

    def text(self) -> str:
        """The screen's rows, trailing blanks removed, one per line."""
        return "\n".join("".join(row).rstrip() for row in self.cells)

    def _put(self, s: str) -> None:
        for ch in s:
            if self.x >= self.cols:  # auto-wrap at the right margin
                self.x = 0
                self._down()
            self.cells[self.y][self.x] = ch
            self.x += 1
            self._last = ch

    def _down(self) -> None:
        if self.y < self.rows - 1:
            self.y += 1
        else:  # scroll up one line
            del self.cells[0]
            self.cells.append([" "] * self.cols)

    def _move(self, x: int | None = None, y: int | None = None) -> None:
        if x is not None:
            self.x = max(0, min(self.cols - 1, x))
        if y is not None:
            self.y = max(0, min(self.rows - 1, y))

    def _control(self, ch: str) -> None:
        if ch == "\r":
            self.x = 0
        elif ch in "\n\x0b\x0c":
            self._down()
        elif ch == "\b":
            self.x = max(0, self.x - 1)
        elif ch == "\t":
            self.x = min(self.cols - 1, (self.x // 8 + 1) * 8)

    def _esc(self, ch: str) -> None:
        if ch == "7":
            self._saved = (self.x, self.y)
        elif ch == "8":
            self.x, self.y = self._saved
        elif ch in "DE":
            self._down()
            if ch == "E":
                self.x = 0
        elif ch == "M":
            self.y = max(0, self.y - 1)
        elif ch == "c":
            self.__init__(self.cols, self.rows)  # type: ignore[misc]

    def _csi(self, params: str, final: str) -> None:
        if params.startswith(("?", ">", "<", "=")):
            return  # private modes (alternate screen, mouse, cursor keys ...)
        args = [int(a) if a.isdigit() else 0 for a in params.split(";")] if params else []
        n = args[0] if args and args[0] else 1
        row = self.cells[self.y]
        if final in "Hf":
            r = args[0] if args and args[0] else 1
            c = args[1] if len(args) > 1 and args[1] else 1
            self._move(c - 1, r - 1)
        elif final == "A":
            self._move(y=self.y - n)
        elif final in "Be":
            self._move(y=self.y + n)
        elif final in "Ca":
            self._move(x=self.x + n)
        elif final == "D":
            self._move(x=self.x - n)
        elif final in "EF":
            self._move(0, self.y + (n if final == "E" else -n))
        elif final in "G`":
            self._move(x=n - 1)
        elif final == "d":
            self._move(y=n - 1)
        elif final == "X":
            row[self.x : self.x + n] = [" "] * len(row[self.x : self.x + n])
        elif final == "b":
            self._put(self._last * n)
        elif final == "K":
            mode = args[0] if args else 0
            lo, hi = {0: (self.x, self.cols), 1: (0, self.x + 1)}.get(mode, (0, self.cols))
            row[lo:hi] = [" "] * (hi - lo)
        elif final == "J":
            mode = args[0] if args else 0
            if mode == 0:
                self._csi("0", "K")
                rows = range(self.y + 1, self.rows)
            elif mode == 1:
                self._csi("1", "K")
                rows = range(self.y)
            else:
                rows = range(self.rows)
            for y in rows:
                self.cells[y] = [" "] * self.cols
        elif final == "P":  # delete characters, the rest of the line moves left
            del row[self.x : self.x + n]
            row.extend([" "] * (self.cols - len(row)))
        elif final == "@":  # insert blanks
            row[self.x : self.x] = [" "] * n
            del row[self.cols :]


@dataclass(frozen=True)
class Marker:
    """Text that shows a program's first full frame: a label and a pattern."""

    label: str
    pattern: re.Pattern[str]


def find_marker(screen: VirtualScreen, markers: list[Marker]) -> tuple[Marker, str] | None:
    """The first marker shown on ``screen`` and the text it matched, or None."""
    text = screen.text()
    for marker in markers:
        m = marker.pattern.search(text)
        if m:
            return marker, m.group(0)
    return None


#: gpustation: a GPU card's temperature, drawn only once the first sample is in
#: (the process table's header, the banner and the graph come earlier or apart)
GPUSTATION_MARKERS = [
    Marker("a full GPU card's temperature", re.compile(r"Temp +\d+ C")),
    Marker("a compact GPU card's temperature and power", re.compile(r"\d+C +[\d.]+/[\d.]+W")),
    Marker("a lost GPU's card", re.compile(r"LOST")),
]
_SIZE = r"\d+(?:\.\d+)?(?:B|KiB|MiB|GiB|TiB)"
#: nvitop: a GPU's memory in its device table, ``used / total`` in whatever unit
#: nvitop's bytes2human chose (``0B / 140.4GiB``, ``520.0MiB / 23.99GiB``); its
#: header (``Driver Version``) is drawn in the same frame, kept as a fallback
NVITOP_MARKERS = [
    Marker("a GPU's memory used / total", re.compile(_SIZE + r" / " + _SIZE)),
    Marker("nvitop's header", re.compile(r"Driver Version: *\S+")),
]
REFERENCE_MARKERS = [Marker("the second card", re.compile(r"REFCARD B"))]


@dataclass
class Result:
    name: str
    first_frame_s: float | None
    marker: str | None
    cpu_first5_s: float
    cpu_steady_s: float
    rss_mib: float
    #: resident MiB by mapping (a file, [heap], anonymous memory) at the end, largest first
    rss_by_mapping: list[tuple[str, float]] = field(default_factory=list)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields[11], [12] are utime and stime (the 14th and 15th of the whole line)
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def rss_by_mapping(pid: int, top: int = 8) -> list[tuple[str, float]]:
    """The ``top`` mappings holding most of the process's resident memory, in MiB."""
    sizes: dict[str, int] = {}
    name = "?"
    try:
        lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if parts and "-" in parts[0] and not parts[0].endswith(":"):
            name = parts[5] if len(parts) > 5 else "[anonymous]"
        elif parts and parts[0] == "Rss:":
            sizes[name] = sizes.get(name, 0) + int(parts[1])
    ranked = sorted(sizes.items(), key=lambda kv: -kv[1])[:top]
    return [(n, kib / 1024) for n, kib in ranked]


def measure(
    name: str,
    argv: list[str],
    markers: list[Marker],
    env: dict[str, str],
    warmup_s: float = 5.0,
    steady_s: float = 20.0,
    cols: int = 160,
    rows: int = 48,
) -> Result:
    pid, fd = spawn(argv, env, cols, rows)
    start = time.monotonic()
    first: float | None = None
    found = ""
    screen = VirtualScreen(cols, rows)
    cpu5 = None
    cpu_end = None
    rss = 0.0
    mappings: list[tuple[str, float]] = []
    try:
        while True:
            now = time.monotonic() - start
            if cpu5 is None and now >= warmup_s:
                cpu5 = cpu_seconds(pid)
            if now >= warmup_s + steady_s:
                cpu_end = cpu_seconds(pid)
                rss = rss_mib(pid)
                mappings = rss_by_mapping(pid)
                break
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                if first is None:
                    screen.feed(chunk)
                    hit = find_marker(screen, markers)
                    if hit is not None:
                        first = time.monotonic() - start
                        found = f"{hit[0].label} ({hit[1]!r})"
    finally:
        quit_and_reap(pid, fd, grace_s=5)
    if cpu5 is None or cpu_end is None:
        raise SystemExit(f"{name}: exited before the measurement ended")
    return Result(name, first, found or None, cpu5, cpu_end - cpu5, rss, mappings)


def sampling_pass(
    count: int, card: str, real: bool, passes: int = 200, fake: bool = False
) -> tuple[float, float]:
    """Median seconds of one fast sampling pass, total and per GPU (``fake``: on the
    fake pynvml)."""
    sys.path.insert(0, str(REPO))
    if fake:
        sys.path.insert(0, str(REPO / "tests" / "fake_nvml"))
        real = True
    from gpustation.telemetry.registry import open_backend
    from gpustation.telemetry.sampler import Sampler

    backend = open_backend() if real else open_backend(simulate=count, sim_card=card)
    try:
        sampler = Sampler(backend, with_host=False, slow_interval_s=1e9)
        sampler.sample(slow=True)
        times = []
        for _ in range(passes):
            t0 = time.perf_counter()
            sampler.sample(slow=False)
            times.append(time.perf_counter() - t0)
        n = max(1, len(sampler.gpus))
        med = statistics.median(times)
        return med, med / n
    finally:
        backend.close()


def median_result(name: str, rounds: list[Result]) -> Result:
    """Each measure's median over the rounds (first frame: over the rounds that saw it)."""
    seen = [r.first_frame_s for r in rounds if r.first_frame_s is not None]
    return Result(
        name,
        statistics.median(seen) if seen else None,
        next((r.marker for r in rounds if r.marker), None),
        statistics.median(r.cpu_first5_s for r in rounds),
        statistics.median(r.cpu_steady_s for r in rounds),
        statistics.median(r.rss_mib for r in rounds),
        rounds[-1].rss_by_mapping,
    )


def verdict(ours: Result, nvitop: Result) -> list[str]:
    """gpustation against the targets of gpustation/tui/budget.py, nvitop's figures beside."""
    sys.path.insert(0, str(REPO))
    from gpustation.tui import budget

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b > 0 else "n/a"

    lines = []
    cpu_ok = ours.cpu_steady_s <= budget.STEADY_CPU_VS_NVITOP * nvitop.cpu_steady_s
    lines.append(
        f"* steady CPU {ours.cpu_steady_s:.2f} s against nvitop's {nvitop.cpu_steady_s:.2f} s "
        f"({ratio(ours.cpu_steady_s, nvitop.cpu_steady_s)}; target "
        f"{budget.STEADY_CPU_VS_NVITOP:g}x): {'met' if cpu_ok else 'NOT met'}"
    )
    ff, nff = ours.first_frame_s, nvitop.first_frame_s
    ff_ok = ff is not None and ff < budget.FIRST_FRAME_S
    lines.append(
        f"* first full frame {'never' if ff is None else f'{ff:.2f} s'} (nvitop "
        f"{'never' if nff is None else f'{nff:.2f} s'}; target under "
        f"{budget.FIRST_FRAME_S:g} s): {'met' if ff_ok else 'NOT met'}"
    )
    rss_ok = ours.rss_mib <= budget.RSS_VS_NVITOP * nvitop.rss_mib
    lines.append(
        f"* RSS {ours.rss_mib:.0f} MiB against nvitop's {nvitop.rss_mib:.0f} MiB "
        f"({ratio(ours.rss_mib, nvitop.rss_mib)}; target {budget.RSS_VS_NVITOP:g}x): "
        f"{'met' if rss_ok else 'NOT met'}"
    )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--gpus", type=int, default=1, help="simulated GPUs (default 1)")
    ap.add_argument("--card", default="rtx4090", choices=["rtx4090", "h200"])
    ap.add_argument("--real", action="store_true", help="use the real GPUs (NVML), not simulated")
    ap.add_argument(
        "--fake-nvml",
        action="store_true",
        help="the NVML backend on the test suite's fake pynvml (an RTX 4090 and an H200): "
        "the XID watcher, GPM and per-process SM run as on real GPUs",
    )
    ap.add_argument("--nvitop", action="store_true", help="also measure nvitop (if installed)")
    ap.add_argument("--no-reference", action="store_true", help="skip the reference Textual apps")
    ap.add_argument("--steady", type=float, default=20.0, help="steady-state window, s")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds: 1 or more")

    base = dict(os.environ, TERM="xterm-256color", COLUMNS="160", LINES="48")
    base.pop("GPUSTATION_SIMULATE", None)
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    state = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpustation-bench-{os.getpid()}"
    base["GPUSTATION_STATE_DIR"] = str(state / "state")
    env = dict(base, PYTHONPYCACHEPREFIX=str(state / "pycache"))
    fake = [str(REPO / "tests" / "fake_nvml")] if args.fake_nvml else []
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (*fake, str(REPO), env.get("PYTHONPATH", "")) if p
    )
    py = sys.executable
    gs = [py, "-m", "gpustation"] + (
        []
        if args.real or args.fake_nvml
        else ["--simulate", str(args.gpus), "--sim-card", args.card]
    )
    label = (
        "real GPUs"
        if args.real
        else "fake pynvml, 2 GPUs"
        if args.fake_nvml
        else f"{args.gpus} simulated {args.card}"
    )
    ours = f"gpustation ({label})"
    targets = [(ours, gs, GPUSTATION_MARKERS, env)]
    if not args.no_reference:
        ref = str(REPO / "bench" / "ref_textual_app.py")
        targets.append(("minimal Textual app + plotext", [py, ref], REFERENCE_MARKERS, env))
        targets.append(
            ("minimal Textual app, no plot", [py, ref, "--no-plot"], REFERENCE_MARKERS, env)
        )
    if args.nvitop:
        nvitop = shutil.which("nvitop")
        if nvitop:
            targets.append(("nvitop", [nvitop], NVITOP_MARKERS, base))
        else:
            print("nvitop: not installed, skipped", file=sys.stderr)

    try:
        for name, argv, markers, target_env in targets:  # warm-up: compiled files, disk cache
            measure(name, argv, markers, target_env, warmup_s=3.0, steady_s=0.0)
        rounds: dict[str, list[Result]] = {name: [] for name, *_ in targets}
        for _ in range(args.rounds):
            for name, argv, markers, target_env in targets:
                rounds[name].append(measure(name, argv, markers, target_env, steady_s=args.steady))
        total, per_gpu = sampling_pass(args.gpus, args.card, args.real, fake=args.fake_nvml)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    results = {name: median_result(name, rs) for name, rs in rounds.items()}

    print(
        f"\n160x48 pty, default refresh (1 s), CPU over {args.steady:g} s after the first 5 s; "
        f"medians of {args.rounds} alternated rounds (each round's figures after them)\n"
    )
    print("| program | first full frame | CPU first 5 s | steady CPU | RSS |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        each = rounds[name]
        ff = f"{r.first_frame_s:.2f} s" if r.first_frame_s is not None else "never"
        ffs = "/".join("-" if x.first_frame_s is None else f"{x.first_frame_s:.2f}" for x in each)
        print(
            f"| {r.name} | {ff} ({ffs}) | {r.cpu_first5_s:.2f} s "
            f"({'/'.join(f'{x.cpu_first5_s:.2f}' for x in each)}) | {r.cpu_steady_s:.2f} s "
            f"({'/'.join(f'{x.cpu_steady_s:.2f}' for x in each)}) | {r.rss_mib:.0f} MiB "
            f"({'/'.join(f'{x.rss_mib:.0f}' for x in each)}) |"
        )
    print("\nfirst full frame marked by:")
    for r in results.values():
        print(f"* {r.name}: {r.marker or 'no marker seen'}")
    print("\nresident memory by mapping, MiB (the last round):")
    for r in results.values():
        print(f"* {r.name}: " + ", ".join(f"{n} {mib:.1f}" for n, mib in r.rss_by_mapping))
    print(
        f"\nsampling pass ({label}, fast fields, no host): {total * 1e3:.3f} ms, "
        f"{per_gpu * 1e3:.3f} ms per GPU"
    )
    if "nvitop" in results:
        print("\nagainst nvitop (targets: gpustation/tui/budget.py):")
        for line in verdict(results[ours], results["nvitop"]):
            print(line)


if __name__ == "__main__":
    main()
