"""CPU cost and start-up time of the dashboard, side by side with other monitors.

Each program runs under a pseudo-terminal of 160x48 (``pty.fork``), as a
person would run it; nothing reads its screen but this script, which drains
the output as fast as it comes.

* first frame: seconds from spawn until the output (ANSI sequences stripped)
  contains the program's marker text: for gpustation the temperature of a GPU
  card (``Temp  63 C`` on a full card, ``63C  381/450W`` on a compact one),
  which is drawn only once the first sample is in; for the reference apps
  the text of their second card; for nvitop ``MiB`` (its memory column).
* CPU: user+sys seconds of the process from /proc/<pid>/stat, in its first
  5 s and over the following 20 s (steady state at the default refresh).
* sampling: the time of one sampling pass (fast fields) per GPU.

    .venv/bin/python bench/dashboard_cpu.py                  # this machine
    .venv/bin/python bench/dashboard_cpu.py --gpus 8         # 8 simulated GPUs
    .venv/bin/python bench/dashboard_cpu.py --real --nvitop  # on a GPU machine

Results go to stdout as a Markdown table (copy them into bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import pty
import re
import select
import shutil
import signal
import statistics
import struct
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ANSI = re.compile(
    rb"\x1b(\[[0-9;?<>=]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[()][0-9A-Za-z]|[=>NOMc78])"
)
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    name: str
    first_frame_s: float | None
    cpu_first5_s: float
    cpu_steady_s: float
    rss_mib: float


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields[11], [12] are utime and stime (the 14th and 15th of the whole line)
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(
    name: str,
    argv: list[str],
    marker: re.Pattern[bytes],
    env: dict[str, str],
    warmup_s: float = 5.0,
    steady_s: float = 20.0,
    cols: int = 160,
    rows: int = 48,
) -> Result:
    pid, fd = pty.fork()
    if pid == 0:  # child
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        os.execvpe(argv[0], argv, env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    start = time.monotonic()
    first: float | None = None
    tail = b""
    cpu5 = None
    cpu_end = None
    rss = 0.0
    try:
        while True:
            now = time.monotonic() - start
            if cpu5 is None and now >= warmup_s:
                cpu5 = cpu_seconds(pid)
            if now >= warmup_s + steady_s:
                cpu_end = cpu_seconds(pid)
                rss = rss_mib(pid)
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
                    tail = (tail + ANSI.sub(b"", chunk))[-20000:]
                    if marker.search(tail):
                        first = time.monotonic() - start
    finally:
        with contextlib.suppress(OSError):
            os.write(fd, b"q")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                select.select([fd], [], [], 0.1) and os.read(fd, 65536)
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    if cpu5 is None or cpu_end is None:
        raise SystemExit(f"{name}: exited before the measurement ended")
    return Result(name, first, cpu5, cpu_end - cpu5, rss)


def sampling_pass(count: int, card: str, real: bool, passes: int = 200) -> tuple[float, float]:
    """Median seconds of one fast sampling pass, total and per GPU."""
    sys.path.insert(0, str(REPO))
    from gpustation.telemetry.backend import open_backend
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


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--gpus", type=int, default=1, help="simulated GPUs (default 1)")
    ap.add_argument("--card", default="rtx4090", choices=["rtx4090", "h200"])
    ap.add_argument("--real", action="store_true", help="use the real GPUs (NVML), not simulated")
    ap.add_argument("--nvitop", action="store_true", help="also measure nvitop (if installed)")
    ap.add_argument("--no-reference", action="store_true", help="skip the reference Textual apps")
    ap.add_argument("--steady", type=float, default=20.0, help="steady-state window, s")
    args = ap.parse_args()

    env = dict(os.environ, TERM="xterm-256color", COLUMNS="160", LINES="48")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("GPUSTATION_SIMULATE", None)
    py = sys.executable
    state = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpustation-bench-{os.getpid()}"
    env["GPUSTATION_STATE_DIR"] = str(state)
    gs = [py, "-m", "gpustation"] + (
        [] if args.real else ["--simulate", str(args.gpus), "--sim-card", args.card]
    )
    label = "real GPUs" if args.real else f"{args.gpus} simulated {args.card}"
    # A GPU card's temperature: drawn only once the first sample is in (the
    # process table's header, the banner and the graph come earlier or apart).
    card = re.compile(rb"Temp +\d+ C|\d+C +[\d.]+/[\d.]+W|LOST")
    targets = [(f"gpustation ({label})", gs, card)]
    if not args.no_reference:
        ref = str(REPO / "bench" / "ref_textual_app.py")
        targets.append(("minimal Textual app + plotext", [py, ref], re.compile(rb"REFCARD B")))
        targets.append(
            ("minimal Textual app, no plot", [py, ref, "--no-plot"], re.compile(rb"REFCARD B"))
        )
    if args.nvitop:
        nvitop = shutil.which("nvitop")
        if nvitop:
            targets.append(("nvitop", [nvitop], re.compile(rb"MiB")))
        else:
            print("nvitop: not installed, skipped", file=sys.stderr)

    results = [
        measure(name, argv, marker, env, steady_s=args.steady) for name, argv, marker in targets
    ]
    total, per_gpu = sampling_pass(args.gpus, args.card, args.real)

    print(f"\n160x48 pty, default refresh (1 s), CPU over {args.steady:g} s after the first 5 s\n")
    print("| program | first full frame | CPU first 5 s | steady CPU | RSS |")
    print("|---|---|---|---|---|")
    for r in results:
        ff = f"{r.first_frame_s:.2f} s" if r.first_frame_s is not None else "never"
        print(
            f"| {r.name} | {ff} | {r.cpu_first5_s:.2f} s | {r.cpu_steady_s:.2f} s "
            f"| {r.rss_mib:.0f} MiB |"
        )
    print(
        f"\nsampling pass ({label}, fast fields, no host): {total * 1e3:.3f} ms, "
        f"{per_gpu * 1e3:.3f} ms per GPU"
    )
    shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
