"""The exporter under load: many concurrent scrapers, and memory over a long soak.

Starts ``gpustation serve --simulate 8`` on a loopback port and scrapes it from
``--scrapers`` threads at once, each opening a new connection per scrape as
Prometheus does, for ``--rounds`` scrapes each; prints the latency median, p95
and p99. The reference, measured in the same run, is the same exporter served
by prometheus_client's ``start_http_server`` (socketserver's default listen
backlog), started by this script in a child process.

``--soak SECONDS`` then scrapes once every ``--soak-interval`` seconds and
reads the server's RSS every ``--soak-every`` scrapes; it prints the RSS at
the start and the end and the least-squares slope, extrapolated to 24 hours
of 1 s scrapes.

    python bench/exporter_load.py --scrapers 20 --rounds 50 --soak 120
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

REFERENCE = """
import sys, threading
from prometheus_client import start_http_server
from gpustation.serve.exporter import Exporter
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend
backend = SimBackend.open(count=8, card="h200")
exporter = Exporter(Sampler(backend).sample, interval_s=1.0)
exporter.start()
start_http_server(int(sys.argv[1]), addr="127.0.0.1", registry=exporter.registry)
print("serving", file=sys.stderr, flush=True)
threading.Event().wait()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(kind: str, port: int, env: dict[str, str]) -> subprocess.Popen[str]:
    if kind == "gpustation":
        argv = [sys.executable, "-m", "gpustation", "serve", "--simulate", "8"]
        argv += ["--sim-card", "h200", "--listen", f"127.0.0.1:{port}"]
    else:
        argv = [sys.executable, "-c", REFERENCE, str(port)]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "serving" in line:
            break
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc


def scrape(port: int) -> float:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read()
    conn.close()
    assert b"DCGM_FI_DEV_GPU_TEMP" in body
    return time.perf_counter() - t0


def load(port: int, scrapers: int, rounds: int) -> list[float]:
    times: list[float] = []
    lock = threading.Lock()
    go = threading.Barrier(scrapers)

    def worker() -> None:
        go.wait()
        mine = [scrape(port) for _ in range(rounds)]
        with lock:
            times.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(scrapers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def soak(port: int, pid: int, seconds: float, interval: float, every: int) -> None:
    points: list[tuple[float, int]] = []
    t_start = time.monotonic()
    n = 0
    while time.monotonic() - t_start < seconds:
        scrape(port)
        if n % every == 0:
            points.append((time.monotonic() - t_start, rss_kib(pid)))
        n += 1
        time.sleep(interval)
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    slope = statistics.linear_regression(xs, ys).slope if len(points) > 2 else 0.0
    per_scrape = slope * interval  # KiB per scrape at this pace
    print(
        f"soak: {n} scrapes over {seconds:.0f} s; RSS {ys[0]} -> {ys[-1]} KiB; "
        f"slope {slope:.3f} KiB/s = {per_scrape:.4f} KiB/scrape; "
        f"24 h of 1 s scrapes: {per_scrape * 86400 / 1024:+.1f} MiB"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapers", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--soak", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--soak-interval", type=float, default=0.05)
    parser.add_argument("--soak-every", type=int, default=20)
    parser.add_argument("--no-reference", action="store_true")
    args = parser.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("GPUSTATION_STATE_DIR", str(Path("/tmp") / f"gs-bench-{os.getpid()}"))
    kinds = ["gpustation"] + ([] if args.no_reference else ["reference"])
    results: dict[str, float] = {}
    for kind in kinds:
        port = free_port()
        proc = start(kind, port, env)
        try:
            load(port, 2, 5)  # warm up
            times = load(port, args.scrapers, args.rounds)
            med, p95, p99 = (pct(times, q) * 1e3 for q in (0.5, 0.95, 0.99))
            results[kind] = p99
            print(
                f"{kind:>10}: {len(times)} scrapes by {args.scrapers} scrapers at once: "
                f"median {med:.1f} ms, p95 {p95:.1f} ms, p99 {p99:.1f} ms"
            )
            if kind == "gpustation" and args.soak > 0:
                soak(port, proc.pid, args.soak, args.soak_interval, args.soak_every)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    if "reference" in results:
        print(f"p99 reference / gpustation: {results['reference'] / results['gpustation']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
