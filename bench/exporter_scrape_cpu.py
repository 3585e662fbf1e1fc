"""CPU per scrape of 8 GPUs with every field: rendering a new sample, and serving one.

An exporter on 8 simulated H200s (every field the model has: GPM, NVLink,
remapped rows, MIG and the rest, as the simulator fills them) takes one
sample; then the process CPU of rendering it (what the first scrape after a
sample costs) and of a whole HTTP scrape of the cached rendering is measured
over ``--rounds`` each, and the median per scrape printed.

    python bench/exporter_scrape_cpu.py --rounds 200
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import time

from prometheus_client.exposition import generate_latest

from gpustation.serve.exporter import Exporter
from gpustation.serve.http import serve
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    backend = SimBackend(count=8, card="h200", seed=0, state_path=None)
    exporter = Exporter(Sampler(backend).sample, interval_s=3600, with_extras=False)
    exporter.sample_once()
    series = generate_latest(exporter.registry).count(b"\n")
    render = []
    for _ in range(args.rounds):
        t0 = time.process_time()
        generate_latest(exporter.registry)
        render.append(time.process_time() - t0)
    server, _ = serve(exporter, "127.0.0.1", 0)
    port = server.server_address[1]
    scrape = []
    for _ in range(args.rounds):
        t0 = time.process_time()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/metrics")
        conn.getresponse().read()
        conn.close()
        scrape.append(time.process_time() - t0)
    server.shutdown()
    print(f"{series} lines for 8 GPUs")
    print(f"render a new sample: median {statistics.median(render) * 1e3:.2f} ms of CPU")
    print(
        f"serve a scrape (cached rendering, client and server in this process): "
        f"median {statistics.median(scrape) * 1e3:.2f} ms of CPU"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
