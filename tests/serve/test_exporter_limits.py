"""The exporter's limits, over real sockets: idle and slow clients are let go, the
connection cap holds, running out of file descriptors neither spins nor floods
the log, TLS connections are kept alive and a silent TLS client blocks no one."""

from __future__ import annotations

import base64
import http.client
import os
import resource
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpustation.serve.exporter import Exporter
from gpustation.serve.http import serve, tls_context
from gpustation.serve.server import BoundedHandler, BoundedServer
from tests.conftest import child_env, gpustation_cmd
from tests.fleet.sshd import free_port
from tests.serve.test_exporter import _frozen, _self_signed

Server = tuple[BoundedServer, int]


def _until(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:g} s: {what}")
        time.sleep(0.02)


@pytest.fixture
def exporter() -> Exporter:
    _, sampler = _frozen()
    exporter = Exporter(sampler.sample, interval_s=60, with_extras=False)
    exporter.sample_once()
    return exporter


@pytest.fixture
def start(exporter: Exporter) -> Iterator[Callable[..., Server]]:
    servers: list[BoundedServer] = []

    def started(**kwargs: object) -> Server:
        server, _ = serve(exporter, "127.0.0.1", 0, **kwargs)  # type: ignore[arg-type]
        servers.append(server)
        return server, server.server_address[1]

    yield started
    for server in servers:
        server.shutdown()
        server.server_close()


def _closed_by_server(sock: socket.socket, within: float) -> float:
    """Seconds until the server closed ``sock`` (read EOF); fails after ``within``."""
    t0 = time.monotonic()
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        pytest.fail(f"the server kept an idle connection open for {within:g} s")
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def test_a_connection_that_sends_nothing_is_closed_after_the_idle_timeout(
    start: Callable[..., Server],
) -> None:
    _, port = start(idle_timeout_s=0.5)
    with socket.create_connection(("127.0.0.1", port)) as idle:
        waited = _closed_by_server(idle, within=10)
    assert 0.4 <= waited < 5
    # the server still answers
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert b"DCGM_FI_DEV_GPU_TEMP" in resp.read()


def test_a_client_that_dribbles_its_request_is_closed_at_the_deadline(
    start: Callable[..., Server],
) -> None:
    # a byte every 0.1 s resets any per-read timeout; the deadline is for the whole request
    _, port = start(idle_timeout_s=1.0)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 200
    with socket.create_connection(("127.0.0.1", port)) as slow:
        t0 = time.monotonic()
        try:
            for byte in request:
                slow.sendall(bytes([byte]))
                time.sleep(0.1)  # the client's pace, not a wait for the server
                if time.monotonic() - t0 > 10:
                    pytest.fail("the server kept a dribbling client for 10 s")
        except (BrokenPipeError, ConnectionResetError):
            pass
        else:
            pytest.fail("the whole dribbled request was taken in")
        assert time.monotonic() - t0 < 5


def test_a_second_request_on_a_tls_connection_needs_no_second_handshake(
    start: Callable[..., Server], tmp_path: Path
) -> None:
    cert, key = _self_signed(tmp_path)
    tls = tls_context(cert, key)
    _, port = start(tls=tls)
    trust = ssl.create_default_context(cafile=str(cert))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=trust, timeout=30)
    try:
        sockets = []
        for _ in range(2):
            conn.request("GET", "/metrics", headers={"Connection": "keep-alive"})
            resp = conn.getresponse()
            assert resp.status == 200 and resp.version == 11
            assert b"DCGM_FI_DEV_GPU_TEMP" in resp.read()
            sockets.append(conn.sock)
    finally:
        conn.close()
    assert sockets[0] is sockets[1]  # http.client reconnects silently when a server closes
    assert tls.session_stats()["accept_good"] == 1


def test_a_kept_connection_waits_keep_alive_for_its_next_request_then_is_closed(
    start: Callable[..., Server],
) -> None:
    _, port = start(idle_timeout_s=0.3, keep_alive_s=2.0)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        conn.getresponse().read()
        first = conn.sock
        time.sleep(0.8)  # longer than the idle timeout of a new connection
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 200 and conn.sock is first
        waited = _closed_by_server(conn.sock, within=10)
    finally:
        conn.close()
    assert 1.5 <= waited < 5


def test_requests_on_a_kept_connection_do_not_wait_for_delayed_acknowledgements(
    start: Callable[..., Server],
) -> None:
    # With Nagle's algorithm on, each response's second write waits for the
    # client's delayed acknowledgement (40 ms or more on Linux).
    _, port = start()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        conn.getresponse().read()
        t0 = time.monotonic()
        for _ in range(20):
            conn.request("GET", "/metrics")
            conn.getresponse().read()
        took = time.monotonic() - t0
    finally:
        conn.close()
    assert took < 0.4, f"20 requests on one connection took {took:.2f} s"


@pytest.mark.parametrize("how", ["keep-alive 0", "no password"])
def test_without_keep_alive_or_a_password_the_connection_is_closed_after_the_response(
    start: Callable[..., Server], tmp_path: Path, how: str
) -> None:
    from gpustation.serve.http import load_users

    users = tmp_path / "users"
    users.write_text("prom:s3cret\n")
    users.chmod(0o600)
    kwargs = {"keep_alive_s": 0.0} if how == "keep-alive 0" else {"users": load_users(users)}
    _, port = start(**kwargs)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(10)
        answer = b""
        while chunk := sock.recv(65536):  # the server closes: recv ends
            answer += chunk
    head = answer.partition(b"\r\n\r\n")[0].lower()
    assert b"connection: close" in head
    assert head.startswith(b"http/1.1 200" if how == "keep-alive 0" else b"http/1.1 401")


def test_a_silent_tls_client_blocks_no_scrape_and_is_let_go(
    start: Callable[..., Server], tmp_path: Path
) -> None:
    cert, key = _self_signed(tmp_path)
    _, port = start(tls=tls_context(cert, key), idle_timeout_s=1.5)
    trust = ssl.create_default_context(cafile=str(cert))
    with socket.create_connection(("127.0.0.1", port)) as silent:
        with socket.create_connection(("127.0.0.1", port)) as half:
            half.sendall(b"\x16\x03\x01\x02\x00\x01")  # the start of a ClientHello, then nothing
            t0 = time.monotonic()
            with urllib.request.urlopen(
                f"https://127.0.0.1:{port}/metrics", context=trust, timeout=10
            ) as resp:
                assert b"DCGM_FI_DEV_GPU_TEMP" in resp.read()
            assert time.monotonic() - t0 < 1.5  # before either stalled handshake timed out
            _closed_by_server(half, within=10)
        _closed_by_server(silent, within=10)


def test_at_the_cap_the_oldest_idle_connection_makes_room(
    start: Callable[..., Server],
) -> None:
    _, port = start(idle_timeout_s=60, max_connections=3)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert b"DCGM_FI_DEV_GPU_TEMP" in resp.read()
        _closed_by_server(idle[0], within=10)
    finally:
        for sock in idle:
            sock.close()


def test_at_the_cap_with_every_connection_busy_the_next_waits_its_turn() -> None:
    entered = threading.Semaphore(0)
    release = threading.Event()

    class Slow(BoundedHandler):
        def do_GET(self) -> None:
            entered.release()
            release.wait(30)
            self.send_response(200)
            self.send_header("Content-Length", "3")
            self.end_headers()
            self.wfile.write(b"ok\n")

    server = BoundedServer(("127.0.0.1", 0), Slow, idle_timeout_s=30, max_connections=2)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    statuses: list[int] = []

    def get() -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as resp:
            statuses.append(resp.status)

    clients = [threading.Thread(target=get) for _ in range(3)]
    try:
        for client in clients:
            client.start()
        for _ in range(2):
            assert entered.acquire(timeout=30)
        # a third is not taken in while both slots are busy with requests
        assert not entered.acquire(timeout=0.5)
        release.set()
        assert entered.acquire(timeout=30)
        for client in clients:
            client.join(timeout=30)
    finally:
        release.set()
        server.shutdown()
        server.server_close()
    assert statuses == [200, 200, 200]


# ---- the real command --------------------------------------------------------------


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sockets(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except OSError:
            pass  # closed meanwhile
    return count


def _serve_child(
    tmp_path: Path, *args: str, nofile: int | None = None
) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    log = tmp_path / "serve.log"

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with open(log, "wb") as err:
        proc = subprocess.Popen(
            gpustation_cmd("serve", "--simulate", "1", "--listen", f"127.0.0.1:{port}", *args),
            env=child_env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
            preexec_fn=limit,
        )
    _until("serve says it is serving", lambda: b"serving" in log.read_bytes() or bool(proc.poll()))
    assert proc.poll() is None, log.read_text()
    return proc, port, log


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def test_serve_holds_no_more_connections_than_its_cap(tmp_path: Path) -> None:
    proc, port, _ = _serve_child(tmp_path, "--max-connections", "3", "--idle-timeout", "60")
    base = _sockets(proc.pid)
    most = [base]
    done = threading.Event()

    def watch() -> None:  # the most sockets the server holds at any moment
        while not done.wait(0.005):  # a sample every few milliseconds
            most.append(_sockets(proc.pid))

    watcher = threading.Thread(target=watch)
    watcher.start()
    clients = []
    try:
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(10)]
        for old in clients[:7]:  # each newcomer closed the oldest idle one
            _closed_by_server(old, within=10)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert b"DCGM_FI_DEV_GPU_TEMP" in resp.read()
    finally:
        done.set()
        watcher.join()
        for sock in clients:
            sock.close()
        _end(proc)
    assert max(most) - base <= 3


def test_out_of_file_descriptors_serve_neither_spins_nor_floods_and_scrapes_get_through(
    tmp_path: Path,
) -> None:
    users = tmp_path / "users"
    users.write_text("prom:s3cret\n")
    users.chmod(0o600)
    proc, port, log = _serve_child(
        tmp_path, "--idle-timeout", "2", "--basic-auth-file", str(users), nofile=64
    )
    cpu0, t0 = _cpu_s(proc.pid), time.monotonic()
    base = _sockets(proc.pid)
    idle: list[socket.socket] = []
    try:
        for _ in range(150):  # more than the 64 descriptors the server may open
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        _until(
            "serve says it ran out of descriptors", lambda: b"open-file limit" in log.read_bytes()
        )
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics",
            headers={"Authorization": "Basic " + base64.b64encode(b"prom:s3cret").decode()},
        )
        scraped: list[bytes] = []

        def scrape() -> bool:
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:
                    scraped.append(resp.read())
            except OSError:
                return False
            return True

        _until("an authorised scrape succeeds", scrape, timeout=60)
        assert b"DCGM_FI_DEV_GPU_TEMP" in scraped[0]
        # the idle ones time out and the server's descriptors come back
        _until("idle connections are let go", lambda: _sockets(proc.pid) <= base + 2, timeout=60)
        used, wall = _cpu_s(proc.pid) - cpu0, time.monotonic() - t0
    finally:
        for sock in idle:
            sock.close()
        _end(proc)
    assert wall >= 2  # at least one idle timeout, a spin would burn it all
    assert used < 0.25 * wall, f"{used:.2f} s of CPU in {wall:.1f} s"
    text = log.read_text()
    assert "Traceback" not in text
    assert len(text.splitlines()) <= 4, text


_BUSY_SERVER = """
import resource, sys, threading
resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))
from gpustation.serve.server import BoundedHandler, BoundedServer
release = threading.Event()

class Busy(BoundedHandler):
    def do_GET(self):
        release.wait()
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"ok\\n")

server = BoundedServer(("127.0.0.1", 0), Busy, idle_timeout_s=60, max_connections=1000)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(server.server_address[1], flush=True)
sys.stdin.readline()
release.set()
sys.stdin.readline()
"""


def test_out_of_descriptors_with_none_idle_the_accept_loop_backs_off(tmp_path: Path) -> None:
    # every connection is busy with a request: nothing to close, only waiting helps
    log = tmp_path / "server.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BUSY_SERVER],
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    assert proc.stdin is not None and proc.stdout is not None
    clients: list[socket.socket] = []
    try:
        port = int(proc.stdout.readline())
        for _ in range(60):  # more than the 40 descriptors the server may open
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            clients.append(sock)
        _until("the server runs out of descriptors", lambda: b"open-file limit" in log.read_bytes())
        cpu0, t0 = _cpu_s(proc.pid), time.monotonic()
        time.sleep(2.0)  # the window measured, not a wait for the server
        used, wall = _cpu_s(proc.pid) - cpu0, time.monotonic() - t0
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        for sock in clients:  # once the busy ones end, the waiting ones are all served
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        for sock in clients:
            sock.close()
        proc.kill()
        proc.wait(timeout=30)
    assert used < 0.2 * wall, f"{used:.2f} s of CPU in {wall:.1f} s"
    text = log.read_text()
    assert "Traceback" not in text and len(text.splitlines()) == 1, text


@pytest.mark.parametrize(
    ("option", "value"),
    [("--idle-timeout", "0"), ("--keep-alive", "-1"), ("--max-connections", "0")],
)
def test_a_limit_out_of_range_is_a_usage_error_naming_it(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpustation import cli
    from gpustation.errors import EXIT_USAGE

    assert cli.main(["serve", "--simulate", "1", option, value]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert option in err and "between" in err
