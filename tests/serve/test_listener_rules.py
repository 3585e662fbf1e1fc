"""The web server's listening sockets and connection cap, in-process on real sockets."""

from __future__ import annotations

import resource
import socket

import pytest

from gpustation.errors import GpustationError
from gpustation.serve import listener


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
