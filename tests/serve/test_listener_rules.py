"""The web server's listening sockets and connection cap, in-process on real sockets."""

from __future__ import annotations

import asyncio
import errno
import itertools
import resource
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpustation.errors import GpustationError
from gpustation.serve import listener
from tests.serve.refusing import Refusing, refusing


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_a_name_with_both_families_gets_one_socket_each_on_one_port() -> None:
    names = {info[4][0] for info in socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM)}
    sockets = listener.listen_sockets("localhost", 0, 8)
    try:
        families = [s.family for s in sockets]
        assert len(families) == len(set(families)) == len(names & {"127.0.0.1", "::1"})
        ports = {s.getsockname()[1] for s in sockets}
        assert len(ports) == 1 and ports != {0}
        for s in sockets:
            assert s.type == socket.SOCK_STREAM and s.proto == socket.IPPROTO_TCP
            assert s.getblocking() is False
            assert s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
            assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
            if s.family == socket.AF_INET6:
                assert s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
        port = ports.pop()
        for s in sockets:  # each one accepts
            host = "::1" if s.family == socket.AF_INET6 else "127.0.0.1"
            with socket.create_connection((host, port), timeout=10):
                pass
    finally:
        for s in sockets:
            s.close()


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")
def test_an_ipv6_address_is_named_in_brackets_when_refused() -> None:
    (first,) = listener.listen_sockets("::1", 0, 8)
    try:
        port = first.getsockname()[1]
        assert first.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
        with pytest.raises(GpustationError) as err:
            listener.listen_sockets("::1", port, 8)
        assert str(err.value) == f"cannot listen on [::1]:{port}: Address already in use"
        # v6 only: the same port stays free on IPv4
        (v4,) = listener.listen_sockets("127.0.0.1", port, 8)
        v4.close()
    finally:
        first.close()


def test_a_port_in_use_or_a_name_that_does_not_resolve_is_refused() -> None:
    (first,) = listener.listen_sockets("127.0.0.1", 0, 8)
    try:
        port = first.getsockname()[1]
        with pytest.raises(GpustationError) as err:
            listener.listen_sockets("127.0.0.1", port, 8)
        assert str(err.value) == f"cannot listen on 127.0.0.1:{port}: Address already in use"
    finally:
        first.close()
    with pytest.raises(GpustationError) as err:
        listener.listen_sockets("no-such-host.invalid", 80, 8)
    assert str(err.value).startswith("cannot listen on no-such-host.invalid:80: ")
    assert "None" not in str(err.value)


def test_the_connection_cap_leaves_room_under_the_open_files_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1024, 4096))
    assert listener.connection_cap(100, 64) == 100
    assert listener.connection_cap(2000, 64) == 1024 - 64 - listener.BASE_RESERVE_FDS
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (60, 4096))
    assert listener.connection_cap(100, 64) == 1
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (resource.RLIM_INFINITY, 0))
    assert listener.connection_cap(5000, 64) == 5000


class Echo(asyncio.Protocol):
    """Says back what it is sent; remembers how its connection ended."""

    def __init__(self, ends: list[BaseException | None]) -> None:
        self.ends = ends

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.ends.append(exc)


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_at_the_cap_a_new_connection_waits_in_the_backlog_until_one_ends() -> None:
    async def main() -> None:
        ends: list[BaseException | None] = []
        made: list[Echo] = []

        def factory() -> asyncio.Protocol:
            made.append(Echo(ends))
            return made[-1]

        capped = listener.CappedListener(listener.listen_sockets("127.0.0.1", 0, 8), factory, 1)
        capped.start()
        try:
            r1, w1 = await asyncio.open_connection("127.0.0.1", capped.port)
            w1.write(b"one")
            assert await asyncio.wait_for(r1.readexactly(3), 30) == b"one"
            assert capped.open_connections == 1
            r2, w2 = await asyncio.open_connection("127.0.0.1", capped.port)
            w2.write(b"two")
            with pytest.raises(asyncio.TimeoutError):  # held in the kernel's backlog
                await asyncio.wait_for(r2.readexactly(3), 0.3)
            assert len(made) == 1
            w1.close()
            await w1.wait_closed()
            assert await asyncio.wait_for(r2.readexactly(3), 30) == b"two"
            assert capped.open_connections == 1 and len(made) == 2
            w2.close()
            await w2.wait_closed()
            await until(lambda: capped.open_connections == 0, "the second connection to end")
            assert ends == [None, None]
        finally:
            await capped.stop()

    asyncio.run(main())


def refusing_listener(errors: list[int]) -> Refusing:
    (real,) = listener.listen_sockets("127.0.0.1", 0, 8)
    return refusing(real, errors)


def test_out_of_files_it_waits_longer_each_time_and_says_so_once_an_episode() -> None:
    said: list[str] = []

    async def main() -> None:
        sock = refusing_listener([errno.ECONNABORTED, errno.EMFILE, errno.EMFILE, errno.EMFILE])
        capped = listener.CappedListener([sock], lambda: Echo([]), 4, warn=said.append)
        capped.start()
        try:
            await until(lambda: not sock.errors, "the refused accepts")
            r, w = await asyncio.open_connection("127.0.0.1", capped.port)
            w.write(b"x")
            assert await asyncio.wait_for(r.readexactly(1), 30) == b"x"
            # a second episode, with one connection open
            sock.errors = [errno.ENFILE]
            r2, w2 = await asyncio.open_connection("127.0.0.1", capped.port)
            w2.write(b"y")
            assert await asyncio.wait_for(r2.readexactly(1), 30) == b"y"
            assert capped.open_connections == 2
            for writer in (w, w2):
                writer.close()
                await writer.wait_closed()
        finally:
            await capped.stop()
        gaps = [b - a for a, b in itertools.pairwise(sock.tried_at[:4])]
        assert gaps[0] < listener.FIRST_PAUSE_S  # a peer gone is no reason to wait
        assert gaps[1] >= listener.FIRST_PAUSE_S and gaps[2] >= 2 * listener.FIRST_PAUSE_S

    asyncio.run(main())
    advice = "waiting for some to close (raise the open-files limit, `ulimit -n`, or lower "
    assert said == [
        f"gpustation: cannot accept connections (Too many open files) with 0 open; {advice}"
        "--max-connections)",
        f"gpustation: cannot accept connections (Too many open files in system) with 1 open; "
        f"{advice}--max-connections)",
    ]


def test_without_a_listener_of_its_own_the_warning_goes_to_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def main() -> None:
        sock = refusing_listener([errno.EMFILE])
        capped = listener.CappedListener([sock], lambda: Echo([]), 4)
        capped.start()
        try:
            await until(lambda: not sock.errors, "the refused accept")
            r, w = await asyncio.open_connection("127.0.0.1", capped.port)
            w.write(b"x")
            assert await asyncio.wait_for(r.readexactly(1), 30) == b"x"
            w.close()
            await w.wait_closed()
        finally:
            await capped.stop()

    asyncio.run(main())
    assert capsys.readouterr().err.startswith(
        "gpustation: cannot accept connections (Too many open files) with 0 open; "
    )


def test_the_cap_reads_this_process_s_own_open_files_limit() -> None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 10**9
    expected = (
        want if soft == resource.RLIM_INFINITY else max(1, soft - 16 - listener.BASE_RESERVE_FDS)
    )
    assert listener.connection_cap(want, 16) == expected


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")
def test_each_address_a_name_resolves_to_gets_one_socket_on_one_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a name with both families, one of them twice (as a hosts file can list it)
    v4 = (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", 0))
    v6 = (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("::1", 0, 0, 0))

    real = socket.getaddrinfo

    def resolve(host: str, port: int, *args: Any, **kw: Any) -> list[Any]:
        if host != "both.test":
            return real(host, port, *args, **kw)
        return [(f, k, p, c, (a[0], port, *a[2:])) for f, k, p, c, a in (v4, v4, v6)]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    port = 0
    for _asked in ("a free port", "that port by number"):
        sockets = listener.listen_sockets("both.test", port, 8)
        try:
            assert [s.family for s in sockets] == [socket.AF_INET, socket.AF_INET6]
            ports = {s.getsockname()[1] for s in sockets}
            assert len(ports) == 1 and ports != {0}
            port = ports.pop()
            for host in ("127.0.0.1", "::1"):
                with socket.create_connection((host, port), timeout=10):
                    pass
        finally:
            for s in sockets:
                s.close()


def test_a_name_that_does_not_resolve_is_named_with_the_resolver_s_words() -> None:
    try:
        socket.getaddrinfo("no-such-host.invalid", 80, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        words = err.strerror
    else:
        pytest.skip("this resolver answers for .invalid")
    with pytest.raises(GpustationError) as raised:
        listener.listen_sockets("no-such-host.invalid", 80, 8)
    assert str(raised.value) == f"cannot listen on no-such-host.invalid:80: {words}"


def test_a_connection_reset_by_its_client_ends_with_the_reset() -> None:
    async def main() -> None:
        ends: list[BaseException | None] = []
        capped = listener.CappedListener(
            listener.listen_sockets("127.0.0.1", 0, 8), lambda: Echo(ends), 4
        )
        capped.start()
        try:
            with socket.create_connection(("127.0.0.1", capped.port), timeout=30) as conn:
                conn.sendall(b"x")
                await asyncio.to_thread(conn.recv, 1)  # the server has it
                # no lingering: close() sends a reset instead of an orderly end
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await until(lambda: bool(ends), "the reset connection to end")
            assert isinstance(ends[0], ConnectionResetError)
            assert capped.open_connections == 0
        finally:
            await capped.stop()

    asyncio.run(main())


def test_a_listener_stopped_before_it_started_closes_its_sockets() -> None:
    sockets = listener.listen_sockets("127.0.0.1", 0, 8)
    asyncio.run(listener.CappedListener(sockets, lambda: Echo([]), 4).stop())
    assert [s.fileno() for s in sockets] == [-1]
