"""Fleet of simulated hosts over loopback ssh: CPU cost and end-to-end latency.

A real sshd on 127.0.0.1 (the test suite's helper, tests/fleet/sshd.py) serves
N fake hosts; each runs this checkout's ``gpustation snapshot --json --watch``
on simulated GPUs, so the whole path is real: ssh client, sshd, remote
gpustation, JSON Lines, parsing, the fleet screen.

Three measurements:

* stream latency: remote snapshot ``time`` -> the moment the local stream
  thread has parsed it (median, p99), with the fleet running headless.
* fleet process CPU: the local process (stream threads) and its ssh clients,
  over ``--seconds``, read from /proc via psutil.
* dashboard: ``gpustation --host box1 ... --refresh 1`` under a 160x48 pty:
  time to the first frame showing every host up, CPU of the dashboard process
  in its first 5 s and over the next ``--seconds``, its ssh clients' CPU, and
  the display latency: snapshot ``time`` -> the screen's timer showing it
  (measured in-process with Textual's headless driver).

Everything runs on one machine: the "remote" gpustation processes share its
cores with the dashboard, which inflates latency on a small machine.

    .venv/bin/python bench/fleet_bench.py                 # 8 hosts, 20 s windows
    .venv/bin/python bench/fleet_bench.py --hosts 4 --seconds 10

Needs openssh-server (/usr/sbin/sshd). Prints a Markdown section for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import re
import select
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ptyrun import quit_and_reap, spawn  # noqa: E402

sys.path.insert(0, str(REPO))

from gpustation.fleet.fleet import Fleet  # noqa: E402
from gpustation.fleet.ssh import UP, HostState, HostStream  # noqa: E402
from tests.fleet.sshd import LoopbackSshd, sshd_available  # noqa: E402

ANSI = re.compile(
    rb"\x1b(\[[0-9;?<>=]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[()][0-9A-Za-z]|[=>NOMc78])"
)


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def children_cpu_s(proc: psutil.Process, name: str = "ssh") -> float:
    total = 0.0
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.name() == name:
                total += cpu_s(child)
    return total


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def wait_all_up(fleet: Fleet, timeout: float = 120.0) -> float:
    t0 = time.monotonic()
    for stream in fleet.streams.values():
        st = stream.wait(lambda s: s.state == UP, max(0.0, timeout - (time.monotonic() - t0)))
        if st.state != UP:
            raise SystemExit(f"{st.name} did not come up: {st.state} {st.error}")
    return time.monotonic() - t0


def stream_latency(hosts: list[str], seconds: float) -> dict[str, float]:
    """Headless fleet: latency per snapshot and CPU of this process and its ssh clients."""
    latencies: list[float] = []
    recording = False

    def on_update(stream: HostStream, st: HostState) -> None:
        if recording and st.state == UP and st.snapshot is not None and st.received_at:
            latencies.append(st.received_at - st.snapshot.time)

    me = psutil.Process()
    fleet = Fleet(hosts, interval=1.0, on_update=on_update)
    with fleet:
        up_s = wait_all_up(fleet)
        time.sleep(2)  # let every remote settle into its cadence
        cpu0, ssh0 = cpu_s(me), children_cpu_s(me)
        recording = True
        time.sleep(seconds)
        recording = False
        cpu1, ssh1 = cpu_s(me), children_cpu_s(me)
    return {
        "up_s": up_s,
        "n": float(len(latencies)),
        "median_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * pct(latencies, 0.99),
        "cpu_s": cpu1 - cpu0,
        "ssh_cpu_s": ssh1 - ssh0,
    }


def dashboard_cpu(
    hosts: list[str], env: dict[str, str], seconds: float, warmup: float = 5.0
) -> dict[str, float]:
    """Run the fleet dashboard under a 160x48 pty and read its CPU from /proc."""
    argv = [sys.executable, "-m", "gpustation", "--refresh", "1"]
    for h in hosts:
        argv += ["--host", h]
    marker = re.compile(rf"{len(hosts)}/{len(hosts)} hosts up".encode())
    rows, cols = 48, 160
    pid, fd = spawn(argv, env, cols, rows)
    proc = psutil.Process(pid)
    start = time.monotonic()
    first: float | None = None
    tail = b""
    marks: dict[str, float] = {}
    try:
        while True:
            now = time.monotonic() - start
            if "cpu5" not in marks and now >= warmup:
                marks["cpu5"], marks["ssh5"] = cpu_s(proc), children_cpu_s(proc)
            if now >= warmup + seconds:
                marks["cpu_end"], marks["ssh_end"] = cpu_s(proc), children_cpu_s(proc)
                marks["rss_mib"] = proc.memory_info().rss / 2**20
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
        quit_and_reap(pid, fd, grace_s=10)
    if "cpu_end" not in marks:
        raise SystemExit("the dashboard exited before the measurement ended")
    return {
        "first_frame_s": first if first is not None else float("nan"),
        "cpu_first5_s": marks["cpu5"],
        "cpu_steady_s": marks["cpu_end"] - marks["cpu5"],
        "ssh_steady_s": marks["ssh_end"] - marks["ssh5"],
        "rss_mib": marks["rss_mib"],
    }


def display_latency(hosts: list[str], seconds: float) -> dict[str, float]:
    """Snapshot time -> the fleet screen's timer showing it, headless, in-process."""
    from gpustation.tui.fleet.screen import FleetApp, FleetScreen

    shown: dict[str, float] = {}
    latencies: list[float] = []

    class TimedScreen(FleetScreen):
        def refresh_rows(self) -> None:
            super().refresh_rows()
            now = time.time()
            for st in self.fleet.states():
                if st.snapshot is not None and shown.get(st.name) != st.snapshot.time:
                    if st.name in shown:  # skip the first: it predates the window
                        latencies.append(now - st.snapshot.time)
                    shown[st.name] = st.snapshot.time

    class TimedApp(FleetApp):
        def on_mount(self) -> None:
            self.fleet.start()
            self._started = True
            self.push_screen(TimedScreen(self.fleet, self.refresh_s))

    fleet = Fleet(hosts, interval=1.0)
    app = TimedApp([], fleet=fleet)

    async def run() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            wait_all_up(fleet)
            await pilot.pause(2.0)
            latencies.clear()
            await pilot.pause(seconds)

    asyncio.run(run())
    return {
        "n": float(len(latencies)),
        "median_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * pct(latencies, 0.99),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--hosts", type=int, default=8, help="simulated hosts (default 8)")
    ap.add_argument("--seconds", type=float, default=20.0, help="measurement window, s")
    args = ap.parse_args()
    if not sshd_available():
        raise SystemExit("needs openssh-server (/usr/sbin/sshd) and the ssh client")

    with tempfile.TemporaryDirectory(
        prefix="gpustation-fleet-bench-", ignore_cleanup_errors=True
    ) as tmp:
        sshd = LoopbackSshd(Path(tmp) / "sshd", aliases=args.hosts)
        with sshd:
            os.environ.update(sshd.env())
            for kind in ("CONFIG", "DATA", "STATE"):
                d = Path(tmp) / kind.lower()
                d.mkdir()
                os.environ[f"GPUSTATION_{kind}_DIR"] = str(d)
            env = dict(os.environ, TERM="xterm-256color", COLUMNS="160", LINES="48")
            env["PYTHONPATH"] = str(REPO)
            hosts = sshd.aliases
            s = stream_latency(hosts, args.seconds)
            d = dashboard_cpu(hosts, env, args.seconds)
            u = display_latency(hosts, args.seconds)

    cores = os.cpu_count()
    print(f"\n## Fleet over loopback ssh ({args.hosts} simulated hosts x 2 GPUs)\n")
    print(
        f"{time.strftime('%Y-%m-%d')}, {platform.node()}: {cores} cores, "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"OpenSSH sshd on 127.0.0.1; every host streams `snapshot --json --watch 1`."
    )
    print(
        f"Command: `.venv/bin/python bench/fleet_bench.py --hosts {args.hosts}"
        f" --seconds {args.seconds:g}`\n"
    )
    print("| measure | value |")
    print("|---|---|")
    print(f"| all hosts up after start (headless) | {s['up_s']:.2f} s |")
    print(
        f"| stream latency, remote snapshot -> parsed locally | median {s['median_ms']:.0f} ms,"
        f" p99 {s['p99_ms']:.0f} ms ({s['n']:.0f} snapshots) |"
    )
    print(
        f"| display latency, remote snapshot -> fleet screen | median {u['median_ms']:.0f} ms,"
        f" p99 {u['p99_ms']:.0f} ms ({u['n']:.0f} snapshots) |"
    )
    w = f"{args.seconds:g} s"
    print(f"| headless fleet process CPU over {w} | {s['cpu_s']:.2f} s |")
    print(f"| its {args.hosts} ssh clients' CPU over {w} | {s['ssh_cpu_s']:.2f} s |")
    print(f"| dashboard: first frame with all hosts up | {d['first_frame_s']:.2f} s |")
    print(f"| dashboard CPU, first 5 s | {d['cpu_first5_s']:.2f} s |")
    print(f"| dashboard CPU over the next {w} | {d['cpu_steady_s']:.2f} s |")
    print(f"| dashboard's ssh clients' CPU over {w} | {d['ssh_steady_s']:.2f} s |")
    print(f"| dashboard RSS | {d['rss_mib']:.0f} MiB |")


if __name__ == "__main__":
    main()
