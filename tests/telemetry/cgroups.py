"""Real cgroups named as the container runtimes, systemd and Slurm name theirs,
with a real process moved into each, and a runtime API answering over a Unix socket."""

from __future__ import annotations

import json
import os
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

CGROUP = Path("/sys/fs/cgroup")


def v2_root() -> Path | None:
    """Where this machine's cgroup v2 tree is mounted (hybrid hosts: ``unified``)."""
    for root in (CGROUP, CGROUP / "unified"):
        if (root / "cgroup.controllers").exists():
            return root
    return None


def v1_systemd_root() -> Path | None:
    root = CGROUP / "systemd"
    return root if (root / "cgroup.procs").exists() else None


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )


@contextmanager
def process_in_cgroup(path: str, v1: bool = False) -> Iterator[int]:
    """A child process moved into the cgroup ``path`` (made here, removed after)."""
    root = v1_systemd_root() if v1 else v2_root()
    if root is None or os.geteuid() != 0 or not os.access(root, os.W_OK):
        pytest.skip(f"no writable cgroup {'v1 name=systemd' if v1 else 'v2'} tree here")
    made: list[Path] = []
    target = root
    for part in path.strip("/").split("/"):
        target = target / part
        if not target.exists():
            target.mkdir()
            made.append(target)
    child = _sleeper()
    try:
        (target / "cgroup.procs").write_text(f"{child.pid}\n")
        yield child.pid
    finally:
        child.kill()
        child.wait()
        for directory in reversed(made):
            # the kernel empties a cgroup of a dead process a moment after it is reaped
            for _ in range(200):
                try:
                    directory.rmdir()
                    break
                except OSError:
                    threading.Event().wait(0.01)


class _ApiHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        request = self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        server: ContainerApi = self.server  # type: ignore[assignment]
        server.requests.append(request.decode())
        if server.silent:
            server.release.wait(5)
            return
        body = json.dumps(server.containers).encode()
        try:
            self._send(body)
        except ConnectionError:
            pass  # a client that stopped reading (over its cap)

    def _send(self, body: bytes) -> None:
        self.wfile.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for start in range(0, len(body), 4096):
            chunk = body[start : start + 4096]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        self.wfile.write(b"0\r\n\r\n")


class ContainerApi(socketserver.ThreadingUnixStreamServer):
    """Docker's (and Podman's) ``GET /containers/json`` on a Unix socket."""

    daemon_threads = True

    def __init__(self, path: Path, containers: Sequence[Mapping[str, object]]) -> None:
        self.containers = containers
        self.requests: list[str] = []
        self.silent = False
        self.release = threading.Event()
        super().__init__(str(path), _ApiHandler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()


@contextmanager
def container_api(path: Path, containers: Sequence[Mapping[str, object]]) -> Iterator[ContainerApi]:
    api = ContainerApi(path, containers)
    try:
        yield api
    finally:
        api.close()
