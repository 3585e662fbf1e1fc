"""``gpustation web`` against idle connections, real sockets: timeouts, a cap, a files limit."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import psutil
import pytest

from tests.conftest import child_env

from .test_web import fetch_once
from .webserver import WebServer, free_port

pytestmark = pytest.mark.timeout(180)

IDLE_S = 1.5


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {timeout:g} s: {what}")
        time.sleep(0.05)


def server_connections(pid: int, port: int) -> int:
    """Connections the server process holds open on ``port``."""
    return sum(
        1
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


@contextmanager
def idle_sockets(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections to ``port`` that send nothing."""
    with ExitStack() as stack:
        socks = []
        for _ in range(count):
            s = stack.enter_context(socket.socket())
            s.settimeout(30)
            s.connect(("127.0.0.1", port))
            socks.append(s)
        yield socks


def closed_by_peer(s: socket.socket) -> bool:
    s.settimeout(0.0)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_connections_that_send_nothing_or_too_little_are_closed_after_the_timeout() -> None:
    with WebServer("--simulate", "2", "--idle-timeout", str(IDLE_S)) as web:
        web.wait_listening()
        web.url()
        with idle_sockets(web.port, 10) as socks:
            opened = time.monotonic()
            socks[0].sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
            wait_until(lambda: all(closed_by_peer(s) for s in socks), 30, "idle ones closed")
            waited = time.monotonic() - opened
        assert waited >= IDLE_S * 0.8  # closed by the timeout, not at once
        # A connection that asked is answered and kept alive until it idles too.
        status, _, _ = fetch_once(web.url())
        assert status == 303


def test_the_connection_cap_holds_and_the_next_one_waits_its_turn() -> None:
    cap = 8
    with WebServer(
        "--simulate",
        "2",
        "--max-sessions",
        "2",
        "--max-connections",
        str(cap),
        "--idle-timeout",
        str(IDLE_S),
    ) as web:
        web.wait_listening()
        url = web.url()
        with idle_sockets(web.port, cap + 6):
            wait_until(lambda: server_connections(web.proc.pid, web.port) == cap, 30, "cap full")
            started = time.monotonic()
            # More wait in the kernel's backlog: the count stays at the cap...
            while time.monotonic() - started < IDLE_S / 2:
                assert server_connections(web.proc.pid, web.port) <= cap
                time.sleep(0.05)
            # ... and an authorised request is answered once idle ones time out.
            status, _, _ = fetch_once(url)
            assert status == 303


def test_out_of_files_the_server_neither_spins_nor_floods_its_log() -> None:
    # The cap asked for is far above what the lowered limit allows: the server
    # keeps its connections under the limit, and what comes beyond waits.
    limit = 128
    with WebServer(
        "--simulate",
        "2",
        "--max-connections",
        "1000",
        "--idle-timeout",
        "4",
        open_files=limit,
    ) as web:
        web.wait_listening()
        url = web.url()
        assert "connections at once, not 1000: the open-files limit" in web.output
        logged = len(web.output)
        cpu = web.cpu_s()
        with idle_sockets(web.port, 100):
            wait_until(
                lambda: server_connections(web.proc.pid, web.port) >= limit // 4, 30, "accepted"
            )
            held = time.monotonic()
            status, _, _ = fetch_once(url)  # waits for idle ones to time out
            assert status == 303
            waited = time.monotonic() - held
            assert server_connections(web.proc.pid, web.port) < limit
        used = web.cpu_s() - cpu
        assert used < 1.0, f"{used:.2f} s of CPU in {waited:.1f} s"
        assert "Traceback" not in web.output
        assert len(web.output) - logged < 400, web.output[logged:]


#: a CappedListener with a cap above the files limit: each connection is greeted, then idles
LISTENER = """
import asyncio, sys
from gpustation.serve.listener import CappedListener, listen_sockets

class Greet(asyncio.Protocol):
    def connection_made(self, transport):
        transport.write(b"hi")

async def main():
    sockets = listen_sockets("127.0.0.1", int(sys.argv[1]), 64)
    CappedListener(sockets, Greet, cap=10_000).start()
    print("listening", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_an_accept_refused_for_lack_of_files_waits_and_says_so_once() -> None:
    import resource

    port = free_port()
    limit = 64

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    proc = subprocess.Popen(
        [sys.executable, "-c", LISTENER, str(port)],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lower,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "listening\n"
        server = psutil.Process(proc.pid)
        with idle_sockets(port, limit + 20) as socks:
            wait_until(
                lambda: server_connections(proc.pid, port) >= limit - 16, 30, "files used up"
            )
            before = sum(server.cpu_times()[:2])
            started = time.monotonic()
            while time.monotonic() - started < 2.0:  # a window to measure CPU over
                time.sleep(0.1)
            used = sum(server.cpu_times()[:2]) - before
            assert used < 0.3, f"{used:.2f} s of CPU while out of files"
            # Closing some frees files: the waiting connections are greeted.
            for s in socks[:30]:
                s.close()
            late = socks[-1]
            late.settimeout(30)
            assert late.recv(2) == b"hi"
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err
    assert err.count("cannot accept connections (Too many open files)") == 1, err
