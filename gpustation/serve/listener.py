"""Accepting connections without being starved: a cap, and a pause when out of files.

asyncio's own server accepts as fast as connections come and, out of file
descriptors, logs a traceback for each failed ``accept()``; a few hundred idle
sockets then take every descriptor, flood the log and keep the loop busy. Here
one task accepts, one connection at a time, only while fewer than the cap are
open: the rest wait in the kernel's backlog, costing nothing, and an accept
refused for lack of descriptors waits (longer each time, one line of log for
the whole episode) instead of retrying at once.

The connections themselves are aiohttp's: :class:`CappedListener` takes any
protocol factory (``AppRunner.server``) and hands it accepted sockets through
``loop.connect_accepted_socket``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import resource
import socket
import sys
from collections.abc import Callable
from typing import Any

from gpustation.errors import GpustationError

#: accept() failures that mean "no resources now", worth waiting out
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: accept() failures of one connection (the peer gave up first), not of the server
PEER_GONE = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM})
FIRST_PAUSE_S = 0.05
LONGEST_PAUSE_S = 1.0
#: descriptors the server keeps for itself beyond its connections (log, pipes, libraries)
BASE_RESERVE_FDS = 48


def connection_cap(wanted: int, reserve: int) -> int:
    """``wanted``, lowered so that it and ``reserve`` fit under the open-files limit."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - reserve - BASE_RESERVE_FDS))


def listen_sockets(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening, non-blocking sockets on every address ``host`` names (port 0: one free port)."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as err:
        raise GpustationError(f"cannot listen on {where}: {err.strerror or err}") from None
    sockets: list[socket.socket] = []
    seen: set[tuple[Any, ...]] = set()
    try:
        for family, kind, proto, _name, address in infos:
            if (family, address[:2]) in seen:
                continue
            seen.add((family, address[:2]))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                # v4 gets its own socket when the name has both; never one for two
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:  # every address on the first one's port
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError as err:
        for sock in sockets:
            sock.close()
        raise GpustationError(f"cannot listen on {where}: {err.strerror or err}") from None
    return sockets


class _Counted(asyncio.Protocol):
    """A connection's protocol, handing its slot back when the connection ends."""

    def __init__(self, inner: asyncio.Protocol, release: Callable[[], None]) -> None:
        self.inner = inner
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        if self._release is not None:
            self._release()
            self._release = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self.inner.connection_lost(exc)
        finally:
            self.release()


class CappedListener:
    """Serves ``factory``'s protocol on ``sockets``, at most ``cap`` connections at once."""

    def __init__(
        self,
        sockets: list[socket.socket],
        factory: Callable[[], asyncio.Protocol],
        cap: int,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.sockets = sockets
        self.factory = factory
        self.cap = cap
        self._slots = asyncio.Semaphore(cap)
        self._open = 0
        self._warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def open_connections(self) -> int:
        return self._open

    @property
    def port(self) -> int:
        return int(self.sockets[0].getsockname()[1])

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._accept_loop(s)) for s in self.sockets]

    async def stop(self) -> None:
        """Stop accepting and close the listening sockets; open connections stay."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sock in self.sockets:
            sock.close()

    def _released(self) -> None:
        self._open -= 1
        self._slots.release()

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        pause = FIRST_PAUSE_S
        starved = False
        while True:
            await self._slots.acquire()
            try:
                conn, _peer = await loop.sock_accept(sock)
            except OSError as err:
                self._slots.release()
                if err.errno in PEER_GONE:
                    continue
                if err.errno not in OUT_OF_RESOURCES:
                    raise
                if not starved:
                    self._warn(
                        f"gpustation: cannot accept connections ({err.strerror}) with "
                        f"{self._open} open; waiting for some to close (raise the open-files "
                        "limit, `ulimit -n`, or lower --max-connections)"
                    )
                    starved = True
                await asyncio.sleep(pause)
                pause = min(pause * 2, LONGEST_PAUSE_S)
                continue
            pause = FIRST_PAUSE_S
            starved = False
            self._open += 1
            counted = _Counted(self.factory(), self._released)

            def protocol(counted: _Counted = counted) -> asyncio.Protocol:
                return counted

            try:
                await loop.connect_accepted_socket(protocol, conn)
            except OSError:
                conn.close()
                counted.release()
