"""A real Prometheus on loopback, the exporters it scrapes, and a server of recorded output.

Used by tests/fleet/test_prometheus.py and bench/prom_fleet_bench.py. Every
wait is on a condition (``/-/ready``, the targets' health), bounded in time.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.conftest import child_env, gpustation_cmd
from tests.fleet.sshd import free_port


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read())


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll ``check`` (every 0.1 s, at most ``timeout`` s); RuntimeError when it never holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if check():
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not within {timeout:.0f} s")


class LoopbackPrometheus:
    """``/usr/bin/prometheus`` on a free 127.0.0.1 port, its TSDB in ``workdir``.

    Targets are read from a file_sd file, so they can be changed while it runs.
    """

    def __init__(self, binary: str, workdir: Path, scrape_interval: str = "1s") -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.scrape_interval = scrape_interval
        self.proc: subprocess.Popen[bytes] | None = None
        self.targets_file = workdir / "targets.json"

    def set_targets(self, groups: dict[str, list[str]]) -> None:
        """job -> ["127.0.0.1:PORT", ...]; "127.0.0.1:PORT/PATH@INSTANCE" gives a target
        its own metrics path and instance label (many fake hosts behind one port)."""
        doc = []
        for job, targets in groups.items():
            for target in targets:
                target, _, instance = target.partition("@")
                address, _, path = target.partition("/")
                labels = {"job": job}
                if path:
                    labels["__metrics_path__"] = "/" + path
                if instance:
                    labels["instance"] = instance
                doc.append({"targets": [address], "labels": labels})
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.targets_file)

    def start(self, groups: dict[str, list[str]]) -> None:
        self.set_targets(groups)
        config = self.workdir / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {self.scrape_interval}\n"
            f"  scrape_timeout: {self.scrape_interval}\n"
            "scrape_configs:\n"
            "  - job_name: gpu\n"
            "    file_sd_configs:\n"
            f"      - files: ['{self.targets_file}']\n"
            "        refresh_interval: 1s\n"
        )
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(self.workdir / "prometheus.log").open("wb"),
            start_new_session=True,
        )
        wait_for("Prometheus ready", self._ready)

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            log = (self.workdir / "prometheus.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"prometheus exited with {self.proc.returncode}: {log}")
        return http_get(self.url + "/-/ready").startswith(b"Prometheus")

    def targets(self) -> list[dict[str, object]]:
        doc = json.loads(http_get(self.url + "/api/v1/targets?state=active"))
        return list(doc["data"]["activeTargets"])

    def wait_targets(self, count: int, health: str = "up", timeout: float = 60.0) -> None:
        """Until ``count`` targets have ``health`` (up, down) and Prometheus has their samples."""
        wait_for(
            f"{count} targets {health}",
            lambda: sum(1 for t in self.targets() if t["health"] == health) >= count,
            timeout,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)


def start_exporter(
    state_dir: Path, count: int = 2, interval: float = 0.5, card: str | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """``gpustation serve --simulate COUNT`` on a free loopback port (its own simulated machine)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = subprocess.Popen(
        gpustation_cmd(
            "serve", "--simulate", str(count), "--interval", str(interval),
            "--listen", f"127.0.0.1:{port}", *(["--sim-card", card] if card else []),
        ),
        env=child_env(GPUSTATION_STATE_DIR=str(state_dir)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for("exporter /metrics", lambda: proc.poll() is None and bool(
        http_get(f"http://127.0.0.1:{port}/metrics")))  # fmt: skip
    return proc, port


def stop_process(proc: subprocess.Popen[bytes], kill: bool = False) -> None:
    if proc.poll() is None:
        proc.kill() if kill else proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


class RecordedExporter:
    """Serves fixed text at any ``/metrics...`` path from one thread (a light fake exporter).

    ``pages`` maps a path to its body; ``/metrics`` is the default page.
    """

    def __init__(self, pages: dict[str, bytes]) -> None:
        self.pages = pages
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.pages.get(self.path.split("?")[0])
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> RecordedExporter:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ScriptedApi:
    """A Prometheus API look-alike on loopback whose answer a test sets (``answer``).

    ``answer(handler)`` writes the whole response itself: a good answer, a
    wrong one, a trickle, a redirect. Every request's path and headers are
    kept in ``seen`` (the Authorization header among them).
    """

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler], None] | None = None) -> None:
        self.answer = answer or (lambda h: send_json(h, empty_vector()))
        self.seen: list[tuple[str, dict[str, str]]] = []
        #: set by stop(): an answer that trickles ends on it
        self.stopped = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                outer.seen.append((self.path, dict(self.headers.items())))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                with contextlib.suppress(OSError):
                    outer.answer(self)
                self.close_connection = True

            do_GET = do_POST = _any

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> ScriptedApi:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ScriptedApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def empty_vector() -> bytes:
    return b'{"status":"success","data":{"resultType":"vector","result":[]}}'


def send_json(handler: BaseHTTPRequestHandler, body: bytes, status: int = 200) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
