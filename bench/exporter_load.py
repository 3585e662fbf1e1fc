"""The exporter under load: many concurrent scrapers, and memory over a long soak.

Starts ``gpustation serve --simulate 8`` on a loopback port and scrapes it from
``--scrapers`` threads at once, for ``--rounds`` scrapes each; prints the
latency median, p95 and p99. Each scraper opens one client connection before
the start and reuses it while the server keeps it open, as a running
Prometheus does; when the server closes it, the next scrape connects (and
with ``--tls`` handshakes) again, and that time is part of the scrape's.

Measured in the same run, one after the other:

* ``gpustation``: HTTP/1.1 with keep-alive (the default ``--keep-alive``);
* ``one-per-scrape``: the same with ``--keep-alive 0``, a connection (and a
  TLS handshake) per scrape, as the HTTP/1.0 exporter did;
* ``reference``: the same exporter served by prometheus_client's
  ``start_http_server`` (socketserver's default listen backlog, HTTP/1.0),
  started by this script in a child process (``--no-reference`` leaves it out).

``--tls`` serves all of them over TLS with a self-signed certificate made by
``openssl`` for the run.

``--soak SECONDS`` then scrapes once every ``--soak-interval`` seconds and
reads the server's RSS every ``--soak-every`` scrapes; it prints the RSS at
the start and the end and the least-squares slope, extrapolated to 24 hours
of 1 s scrapes.

    python bench/exporter_load.py --scrapers 20 --rounds 50 --soak 120
    python bench/exporter_load.py --tls --scrapers 20 --rounds 50
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
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
tls = dict(certfile=sys.argv[2], keyfile=sys.argv[3]) if len(sys.argv) > 3 else {}
start_http_server(int(sys.argv[1]), addr="127.0.0.1", registry=exporter.registry, **tls)
print("serving", file=sys.stderr, flush=True)
threading.Event().wait()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def start(
    kind: str, port: int, env: dict[str, str], tls: tuple[Path, Path] | None
) -> subprocess.Popen[str]:
    if kind == "reference":
        argv = [sys.executable, "-c", REFERENCE, str(port)]
        argv += [str(tls[0]), str(tls[1])] if tls else []
    else:
        argv = [sys.executable, "-m", "gpustation", "serve", "--simulate", "8"]
        argv += ["--sim-card", "h200", "--listen", f"127.0.0.1:{port}"]
        argv += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])] if tls else []
        argv += ["--keep-alive", "0"] if kind == "one-per-scrape" else []
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "serving" in line:
            break
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc


class Scraper:
    """One client connection, reused while the server keeps it open."""

    def __init__(self, port: int, trust: ssl.SSLContext | None) -> None:
        if trust is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        else:
            self.conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=trust)

    def scrape(self) -> float:
        t0 = time.perf_counter()
        # http.client connects again by itself when the server closed the last one
        self.conn.request("GET", "/metrics")
        body = self.conn.getresponse().read()
        assert b"DCGM_FI_DEV_GPU_TEMP" in body
        return time.perf_counter() - t0


def scrape(port: int, trust: ssl.SSLContext | None = None) -> float:
    scraper = Scraper(port, trust)
    try:
        return scraper.scrape()
    finally:
        scraper.conn.close()


def load(port: int, scrapers: int, rounds: int, trust: ssl.SSLContext | None) -> list[float]:
    times: list[float] = []
    lock = threading.Lock()
    go = threading.Barrier(scrapers)

    def worker() -> None:
        scraper = Scraper(port, trust)
        scraper.conn.connect()  # open before the start, as a running Prometheus has it
        go.wait()
        mine = [scraper.scrape() for _ in range(rounds)]
        scraper.conn.close()
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


def soak(
    port: int,
    pid: int,
    seconds: float,
    interval: float,
    every: int,
    trust: ssl.SSLContext | None = None,
) -> None:
    points: list[tuple[float, int]] = []
    t_start = time.monotonic()
    n = 0
    while time.monotonic() - t_start < seconds:
        scrape(port, trust)
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
    parser.add_argument("--tls", action="store_true", help="serve over TLS (openssl makes a cert)")
    parser.add_argument("--soak", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--soak-interval", type=float, default=0.05)
    parser.add_argument("--soak-every", type=int, default=20)
    parser.add_argument("--no-reference", action="store_true")
    args = parser.parse_args()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("GPUSTATION_STATE_DIR", str(Path("/tmp") / f"gs-bench-{os.getpid()}"))
    kinds = ["gpustation", "one-per-scrape"] + ([] if args.no_reference else ["reference"])
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        tls = self_signed(Path(folder)) if args.tls else None
        trust = ssl.create_default_context(cafile=str(tls[0])) if tls else None
        for kind in kinds:
            port = free_port()
            proc = start(kind, port, env, tls)
            try:
                load(port, 2, 5, trust)  # warm up
                times = load(port, args.scrapers, args.rounds, trust)
                med, p95, p99 = (pct(times, q) * 1e3 for q in (0.5, 0.95, 0.99))
                results[kind] = p99
                print(
                    f"{kind:>14}{' (TLS)' if tls else ''}: {len(times)} scrapes by "
                    f"{args.scrapers} scrapers at once: median {med:.1f} ms, "
                    f"p95 {p95:.1f} ms, p99 {p99:.1f} ms",
                    flush=True,
                )
                if kind == "gpustation" and args.soak > 0:
                    soak(port, proc.pid, args.soak, args.soak_interval, args.soak_every, trust)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    for kind in kinds[1:]:
        print(f"p99 {kind} / gpustation: {results[kind] / results['gpustation']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
