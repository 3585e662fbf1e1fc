"""The exporter's threaded server out of file descriptors, in-process: the oldest idle
connection is closed to make room, accepting backs off, and one line says so."""

from __future__ import annotations

import errno
import itertools
import resource
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from gpustation.serve.server import BoundedHandler, BoundedServer
from tests.serve.refusing import Refusing, refusing


class Ok(BoundedHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")


def until(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def serving() -> Iterator[Callable[..., tuple[BoundedServer, Refusing]]]:
    started: list[tuple[BoundedServer, threading.Thread]] = []

    def start(handler: type[BoundedHandler] = Ok, **kw: object) -> tuple[BoundedServer, Refusing]:
        kw.setdefault("idle_timeout_s", 30)
        server = BoundedServer(("127.0.0.1", 0), handler, **kw)  # type: ignore[arg-type]
        sock = refusing(server.socket, [])
        server.socket = sock
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        started.append((server, thread))
        return server, sock

    yield start
    for server, thread in started:
        if thread.is_alive():  # shutdown() would wait for ever on a loop that died
            server.shutdown()
        server.server_close()


def get(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as resp:
        return bytes(resp.read())


def test_out_of_files_the_oldest_idle_connection_goes_and_accepting_backs_off(
    serving: Callable[..., tuple[BoundedServer, Refusing]],
) -> None:
    said: list[str] = []
    server, sock = serving(log=said.append)
    port = server.server_address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as idle:
        until(lambda: server._waiting, "the idle connection to be accepted")
        time.sleep(1.1)  # idle long enough (a second) to be the one closed
        sock.errors = [errno.EMFILE, errno.EMFILE, errno.EMFILE]
        assert get(port) == b"ok\n"
        assert idle.recv(1) == b""  # closed to make room
    gaps = [b - a for a, b in itertools.pairwise(sock.tried_at)]
    assert gaps[0] >= 0.005 and gaps[1] >= 0.01  # 5 ms, doubling
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert said == [
        f"gpustation: cannot accept connections: Too many open files (open-file limit {soft}): "
        "closing idle connections to make room and retrying with back-off (said at most once "
        "a minute). Raise the limit (ulimit -n, LimitNOFILE= in a systemd unit) or lower "
        "--max-connections"
    ]
    sock.errors = [errno.ENFILE]
    assert get(port) == b"ok\n"
    assert len(said) == 1  # within the minute: not said again


def test_without_a_log_of_its_own_it_says_so_on_stderr(
    serving: Callable[..., tuple[BoundedServer, Refusing]], capsys: pytest.CaptureFixture[str]
) -> None:
    server, sock = serving()
    sock.errors = [errno.EMFILE]
    assert get(server.server_address[1]) == b"ok\n"
    err = capsys.readouterr().err
    assert err.startswith("gpustation: cannot accept connections: Too many open files ")
    assert err.endswith("or lower --max-connections\n")


class Failing(BoundedHandler):
    def do_GET(self) -> None:
        if self.path == "/reset":
            raise ConnectionResetError("the client went away")  # the client's doing
        if self.path == "/value":
            raise ValueError("another bug")
        raise RuntimeError("a bug of the server's own")


def test_an_error_of_the_server_s_own_is_logged_once_per_kind(
    serving: Callable[..., tuple[BoundedServer, Refusing]],
) -> None:
    said: list[str] = []
    server, _sock = serving(log=said.append, handler=Failing)
    port = server.server_address[1]
    for path in ("/", "/", "/reset"):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert conn.recv(1) == b""  # closed without an answer
    until(lambda: said, "the error to be logged")
    assert len(said) == 1
    assert said[0].startswith("gpustation: a request failed (logged once per kind):\nTraceback")
    assert "RuntimeError: a bug of the server's own" in said[0]


def test_a_client_s_failure_is_not_logged_and_each_kind_of_bug_is_once(
    serving: Callable[..., tuple[BoundedServer, Refusing]],
) -> None:
    said: list[str] = []
    server, _sock = serving(log=said.append, handler=Failing)
    port = server.server_address[1]
    for path in ("/reset", "/value", "/", "/value"):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert conn.recv(1) == b""
    until(lambda: len(said) >= 2, "both kinds to be logged")
    assert [line.splitlines()[-1] for line in said] == [
        "ValueError: another bug",
        "RuntimeError: a bug of the server's own",
    ]


def request(conn: socket.socket) -> bytes:
    conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while not answer.endswith(b"ok\n"):
        chunk = conn.recv(4096)
        assert chunk, f"closed after {answer!r}"
        answer += chunk
    return answer


def test_after_an_answer_the_next_request_has_the_keep_alive_not_the_idle_timeout(
    serving: Callable[..., tuple[BoundedServer, Refusing]],
) -> None:
    short, _sock = serving(keep_alive_s=0.2)  # idle timeout 30 s
    with socket.create_connection(("127.0.0.1", short.server_address[1]), timeout=30) as conn:
        assert request(conn).startswith(b"HTTP/1.1 200 ")
        assert conn.recv(1) == b""  # closed after 0.2 s, long before 30
    long, _sock = serving(idle_timeout_s=0.3, keep_alive_s=30)
    with socket.create_connection(("127.0.0.1", long.server_address[1]), timeout=30) as conn:
        assert request(conn).startswith(b"HTTP/1.1 200 ")
        time.sleep(1.0)  # past the idle timeout, within the keep-alive
        assert request(conn).startswith(b"HTTP/1.1 200 ")
        until(lambda: long._waiting, "the kept connection to wait again")
        long.server_close()  # an idle kept connection is let go on close
        assert conn.recv(1) == b""


def test_at_the_cap_an_idle_connection_makes_room_only_after_a_second(
    serving: Callable[..., tuple[BoundedServer, Refusing]],
) -> None:
    server, _sock = serving(max_connections=1)
    port = server.server_address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as idle:
        opened = time.monotonic()
        until(lambda: server._waiting, "the idle connection to be accepted")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as second:
            assert request(second).startswith(b"HTTP/1.1 200 ")
            assert time.monotonic() - opened >= 0.95  # not one that may be sending
            assert idle.recv(1) == b""  # the idle one went to make room
    for _ in range(3):  # each connection's slot comes back when it closes
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            assert request(conn).startswith(b"HTTP/1.1 200 ")
    until(lambda: not server._waiting, "the closed connections to be forgotten")
