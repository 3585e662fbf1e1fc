"""The fleet read from Prometheus at 64 and 256 hosts x 8 GPUs: first frame, refresh, CPU.

A real Prometheus (Debian's /usr/bin/prometheus) on loopback scrapes N fake
hosts through file service discovery. One light process serves every host's
``/metrics/NNN`` page (tests/fleet/promserver.py ``RecordedExporter``): half
are the recording of dcgm-exporter on an 8-GPU H100 (tests/fixtures), half
the output of a real ``gpustation serve --simulate 8 --sim-card h200``
captured once, each page with its own Hostname/hostname and instance label.

Measured for each size, in this process:

* first frame: ``PrometheusFleet.start()`` -> the first ``states()`` in which
  every host is up with its 8 GPUs (the discovery query included);
* one refresh pass, one a second (three instant queries; the values only of
  the hosts scraped since the last pass): wall time and this process's CPU,
  median and p90 over ``--passes`` passes;
* Prometheus's own CPU (from /proc, psutil), in % of a core while the passes
  run and then while it only scrapes;
* the dashboard (``FleetApp`` on the Prometheus source, Textual's headless
  driver, 160x48): time to the first screen showing every host, and this
  process's CPU per second over ``--seconds`` (poller thread included).

    .venv/bin/python bench/prom_fleet_bench.py                  # 64 and 256 hosts
    .venv/bin/python bench/prom_fleet_bench.py --hosts 64 --passes 10

Prints a Markdown section for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpustation.fleet.prometheus import PrometheusClient, PrometheusFleet  # noqa: E402
from gpustation.fleet.ssh import UP  # noqa: E402
from tests.fleet.promserver import (  # noqa: E402
    LoopbackPrometheus,
    RecordedExporter,
    http_get,
    start_exporter,
    stop_process,
    wait_for,
)

DCGM = (REPO / "tests" / "fixtures" / "dcgm-exporter-h100.prom").read_text()


def gpustation_page(work: Path) -> str:
    """One real exporter's output for 8 simulated H200s."""
    proc, port = start_exporter(work / "sim", count=8, interval=1.0, card="h200")
    try:
        return http_get(f"http://127.0.0.1:{port}/metrics").decode()
    finally:
        stop_process(proc)


def pages(count: int, sim_text: str) -> tuple[dict[str, bytes], list[str]]:
    bodies: dict[str, bytes] = {}
    names: list[str] = []
    for n in range(count):
        host = f"node-{n:03d}"
        if n % 2:
            text = re.sub(r'hostname="[^"]*"', f'hostname="{host}"', sim_text)
        else:
            text = DCGM.replace('Hostname="dgx-h100-07"', f'Hostname="{host}"')
        bodies[f"/metrics/{n:03d}"] = text.encode()
        names.append(host)
    return bodies, names


def complete(fleet: PrometheusFleet, count: int) -> bool:
    states = fleet.states()
    return len(states) == count and all(
        st.state == UP and st.snapshot is not None and len(st.snapshot.gpus) == 8 for st in states
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def dashboard(url: str, count: int, seconds: float) -> tuple[float, float]:
    from gpustation.tui.fleet.screen import FleetApp, FleetScreen

    me = psutil.Process()
    fleet = PrometheusFleet(PrometheusClient(url), interval=1.0)
    app = FleetApp([], refresh_s=1.0, fleet=fleet)
    began = time.monotonic()
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(int(120 / 0.05)):
            screen = app.screen
            if (
                isinstance(screen, FleetScreen)
                and sum(1 for r in screen.rows if r.gpu is not None and r.status == "up")
                == 8 * count
            ):
                break
            await pilot.pause(0.05)
        first = time.monotonic() - began
        t0 = me.cpu_times()
        w0 = time.monotonic()
        await pilot.pause(seconds)
        t1 = me.cpu_times()
        cpu = (t1.user + t1.system - t0.user - t0.system) / (time.monotonic() - w0)
    return first, cpu


def measure(
    binary: str, work: Path, count: int, sim_text: str, args: argparse.Namespace
) -> dict[str, float]:
    bodies, _ = pages(count, sim_text)
    fake = RecordedExporter(bodies).start()
    prom = LoopbackPrometheus(binary, work / f"prom-{count}", scrape_interval=args.scrape)
    (work / f"prom-{count}").mkdir()
    try:
        prom.start(
            {
                "gpu": [
                    f"127.0.0.1:{fake.port}/metrics/{n:03d}@node-{n:03d}:9400" for n in range(count)
                ]
            }
        )
        prom.wait_targets(count, timeout=180)
        pp = psutil.Process(prom.proc.pid)  # type: ignore[union-attr]
        client = PrometheusClient(prom.url, timeout_s=30)
        wait_for(
            "every host's series",
            lambda: len(client.query("count by (instance) (DCGM_FI_DEV_GPU_TEMP)")) == count,
            120,
        )
        # first frame: a fresh source, from start() to every host complete
        fleet = PrometheusFleet(client, interval=1.0)
        began = time.monotonic()
        fleet.start()
        wait_for("first complete frame", lambda: complete(fleet, count), 120)
        first = time.monotonic() - began
        fleet.close()
        # refresh passes, synchronously on this thread
        fleet = PrometheusFleet(client, interval=1.0)
        fleet.poll_once()
        walls, cpus = [], []
        p0, w0 = pp.cpu_times(), time.monotonic()
        for _ in range(args.passes):
            c0, t0 = time.process_time(), time.monotonic()
            fleet.poll_once()
            walls.append(time.monotonic() - t0)
            cpus.append(time.process_time() - c0)
            time.sleep(max(0.0, 1.0 - walls[-1]))  # passes at the dashboard's 1 s refresh
        p1, w1 = pp.cpu_times(), time.monotonic()
        prom_with = (p1.user + p1.system - p0.user - p0.system) / (w1 - w0)
        time.sleep(args.passes / 2)  # the same Prometheus, scraping with nobody asking
        p2, w2 = pp.cpu_times(), time.monotonic()
        prom_alone = (p2.user + p2.system - p1.user - p1.system) / (w2 - w1)
        down = [s.error for s in fleet.states() if s.state != UP]
        if down:
            print(f"warning: {len(down)} of {count} hosts down after the passes: {down[0]}")
        dash_first, dash_cpu = asyncio.run(dashboard(prom.url, count, args.seconds))
        return {
            "first": first,
            "wall_med": statistics.median(walls),
            "wall_p90": pct(walls, 0.9),
            "cpu_med": statistics.median(cpus),
            "cpu_p90": pct(cpus, 0.9),
            "prom_with": prom_with,
            "prom_alone": prom_alone,
            "dash_first": dash_first,
            "dash_cpu": dash_cpu,
        }
    finally:
        prom.stop()
        fake.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hosts", type=int, action="append", help="fleet sizes (default 64 and 256)"
    )
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0, help="dashboard CPU window")
    parser.add_argument(
        "--scrape",
        default="5s",
        help="Prometheus scrape interval (default 5s: at 256 hosts one Python process "
        "serving every page falls behind a 2 s interval on two cores)",
    )
    args = parser.parse_args()
    sizes = args.hosts or [64, 256]
    from tests.tools import tool

    binary = tool("prometheus", "Debian: prometheus")
    rows = []
    with tempfile.TemporaryDirectory(prefix="gs-prom-bench-") as tmp:
        work = Path(tmp)
        sim_text = gpustation_page(work)
        for count in sizes:
            rows.append((count, measure(binary, work, count, sim_text, args)))
    print("## Fleet from Prometheus (bench/prom_fleet_bench.py)\n")
    print(
        f"{platform.node()}, {psutil.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"prometheus scrape {args.scrape}, {args.passes} passes, "
        f"dashboard window {args.seconds:g} s; half the hosts dcgm-exporter's "
        "recording, half gpustation serve's output, 8 GPUs each.\n"
    )
    print(
        "| hosts x GPUs | first frame | refresh pass (median / p90) "
        "| fleet CPU per pass (median / p90) | Prometheus CPU (passes / scraping only) "
        "| dashboard first screen | dashboard CPU |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for count, r in rows:
        ms = {k: f"{v * 1000:.0f}" for k, v in r.items()}
        print(
            f"| {count} x 8 | {ms['first']} ms | {ms['wall_med']} / {ms['wall_p90']} ms "
            f"| {ms['cpu_med']} / {ms['cpu_p90']} ms "
            f"| {r['prom_with'] * 100:.0f} % / {r['prom_alone'] * 100:.0f} % of a core "
            f"| {r['dash_first']:.2f} s | {r['dash_cpu'] * 100:.0f} % of a core |"
        )


if __name__ == "__main__":
    main()
