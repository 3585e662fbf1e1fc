"""A threaded HTTP/1.1 server that idle, slow or many clients cannot starve.

The standard library's ``http.server`` and ``socketserver`` do the protocol
(HTTP/1.1 with keep-alive, so a scraper over TLS pays one handshake per
connection rather than one per scrape) and a thread per connection. What they
lack for an endpoint on a network, this module adds around their hooks
(``get_request``, ``service_actions``, ``close_request``, ``handle_error``):

* **deadlines**: a new connection has ``idle_timeout_s`` from being accepted
  (the TLS handshake included) until its first request's headers are in; a
  kept-alive one has ``keep_alive_s`` from the end of each response until the
  next request's are (long enough for a scrape interval, so that a scraper
  over TLS keeps its connection; 0 closes after each response). Each read and
  write also times out, so a client that neither sends nor reads is let go.
  The deadlines are kept by the accept thread, which shuts the socket of a
  connection past its own: a client that dribbles a byte at a time gains
  nothing.
* **a connection cap**: at most ``max_connections`` at once. At the cap the
  connection that has waited longest for its next request (a second or more)
  is closed to make room (a scraper between two scrapes reconnects next
  time), so idle clients cannot hold every slot; with none waiting the server
  stops accepting until one ends, and new clients wait in the listen backlog.
* **out of file descriptors** (``EMFILE`` and its kin): the oldest waiting
  connection is closed and accepting backs off (5 ms doubling to 1 s, as Go's
  ``net/http`` does) instead of retrying at once; one line a minute says so.
* **quiet**: a client's failure (reset, timeout, a failed handshake) only
  ends its connection; an error of the server's own is logged once per kind.

TLS: the listening socket is wrapped without handshaking on accept; each
connection's handshake runs in its own thread under the deadline, so a slow
or silent TLS client never holds up the accept loop.
"""

from __future__ import annotations

import errno
import resource
import socket
import ssl
import sys
import threading
import time
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn
from typing import Any

DEFAULT_IDLE_TIMEOUT_S = 10.0
DEFAULT_KEEP_ALIVE_S = 120.0
DEFAULT_MAX_CONNECTIONS = 64

# accept() failures that mean "no file descriptor or buffer right now"
_OUT_OF_FILES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_BACKOFF_FIRST_S = 0.005
_BACKOFF_MAX_S = 1.0
_REPORT_EVERY_S = 60.0
# a connection that has waited this long for its request may be closed to make
# room; a client sends its request within milliseconds of connecting
_EVICTABLE_AFTER_S = 1.0


class _Closing(OSError):
    """The server is shutting down while waiting for a free connection slot."""


class BoundedServer(ThreadingMixIn, HTTPServer):
    """``HTTPServer`` with request deadlines, a connection cap and EMFILE back-off.

    ``log`` receives one line for what the operator should know (out of file
    descriptors, an error of the server's own); it defaults to stderr.
    """

    daemon_threads = True
    # socketserver's backlog of 5 leaves a crowd of scrapers to SYN retransmits
    request_queue_size = 128
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        tls: ssl.SSLContext | None = None,
        log: Callable[[str], None] | None = None,
        keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
    ) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.keep_alive_s = keep_alive_s
        self.max_connections = max_connections
        self._log = log or _stderr
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        # connection -> (monotonic time it began waiting, by which its request must be in)
        self._waiting: dict[socket.socket, tuple[float, float]] = {}
        self._closing = threading.Event()
        self._backoff_s = 0.0
        self._reported_at: float | None = None
        self._errors_logged: set[str] = set()
        super().__init__(address, handler)
        if tls is not None:
            self.socket = tls.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )

    # ---- the accept loop ----------------------------------------------------
    def serve_forever(self, poll_interval: float | None = None) -> None:
        # deadlines are checked between accepts: often enough for the shortest timeout
        shortest = min(t for t in (self.idle_timeout_s, self.keep_alive_s) if t > 0)
        poll = min(0.5, shortest / 4) if poll_interval is None else poll_interval
        super().serve_forever(poll)

    def shutdown(self) -> None:
        self._closing.set()
        super().shutdown()

    def server_close(self) -> None:
        # Idle keep-alive connections would hold the join below for their timeout.
        self._closing.set()
        with self._lock:
            for conn in list(self._waiting):
                self._cut(conn)
        super().server_close()

    def service_actions(self) -> None:
        self._expire()

    def get_request(self) -> tuple[Any, Any]:
        self._take_slot()
        try:
            conn, address = self.socket.accept()
        except OSError as err:
            self._slots.release()
            if err.errno in _OUT_OF_FILES:
                self._out_of_files(err)
            raise
        self._backoff_s = 0.0
        self.wait_for_request(conn, self.idle_timeout_s)
        return conn, address

    def _take_slot(self) -> None:
        """Block until a connection may be accepted, closing an idle one at the cap."""
        tick = min(0.1, self.idle_timeout_s / 4)
        while not self._slots.acquire(blocking=False):
            self._evict_oldest()
            if self._slots.acquire(timeout=tick):
                return
            if self._closing.is_set():
                raise _Closing("shutting down")
            self._expire()

    def _out_of_files(self, err: OSError) -> None:
        self._evict_oldest()
        now = time.monotonic()
        if self._reported_at is None or now - self._reported_at >= _REPORT_EVERY_S:
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            self._log(
                f"gpustation: cannot accept connections: {err.strerror or err} "
                f"(open-file limit {soft}): closing idle connections to make room and "
                "retrying with back-off (said at most once a minute). Raise the limit "
                "(ulimit -n, LimitNOFILE= in a systemd unit) or lower --max-connections"
            )
            self._reported_at = now
        self._backoff_s = min(_BACKOFF_MAX_S, max(_BACKOFF_FIRST_S, self._backoff_s * 2))
        self._closing.wait(self._backoff_s)

    # ---- deadlines ------------------------------------------------------------
    def wait_for_request(self, conn: socket.socket, timeout_s: float) -> None:
        """``conn`` waits for a request, which must be in within ``timeout_s`` from now
        (or from when it began waiting, if it already was)."""
        now = time.monotonic()
        with self._lock:
            self._waiting.setdefault(conn, (now, now + timeout_s))
            if self._closing.is_set():
                self._cut(conn)

    def request_in(self, conn: socket.socket) -> None:
        """``conn``'s request headers are in: it is busy, not idle."""
        with self._lock:
            self._waiting.pop(conn, None)

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [conn for conn, (_, deadline) in self._waiting.items() if deadline <= now]
            for conn in late:
                self._cut(conn)

    def _evict_oldest(self) -> None:
        """Close the connection that has waited longest for a request, if it has waited
        long enough that it is not one whose request is on its way."""
        latest_since = time.monotonic() - min(_EVICTABLE_AFTER_S, self.idle_timeout_s / 2)
        with self._lock:
            if self._waiting:
                oldest = min(self._waiting, key=lambda conn: self._waiting[conn][0])
                if self._waiting[oldest][0] <= latest_since:
                    self._cut(oldest)

    def _cut(self, conn: socket.socket) -> None:
        """Shut ``conn`` down (under the lock): its thread sees the end and closes it."""
        del self._waiting[conn]
        try:
            # the plain socket's shutdown: it wakes a read blocked inside TLS too
            socket.socket.shutdown(conn, socket.SHUT_RDWR)
        except OSError:
            pass  # already gone

    def close_request(self, request: Any) -> None:
        with self._lock:  # so that _cut never shuts a descriptor reused after this close
            self._waiting.pop(request, None)
            super().close_request(request)
        self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, OSError):
            return  # the client's doing (reset, timeout, a failed handshake): only it is closed
        kind = type(err).__name__
        if kind not in self._errors_logged:
            self._errors_logged.add(kind)
            self._log(
                f"gpustation: a request failed (logged once per kind):\n{traceback.format_exc()}"
            )


class BoundedHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive under the server's deadlines; subclasses add ``do_GET``."""

    protocol_version = "HTTP/1.1"
    server_version = "gpustation"
    sys_version = ""
    # headers and body go out as two writes; on a kept connection Nagle would hold
    # the second until the client's delayed acknowledgement
    disable_nagle_algorithm = True
    server: BoundedServer
    _served = 0

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.idle_timeout_s)  # each read and write

    def handle(self) -> None:
        if isinstance(self.connection, ssl.SSLSocket):
            try:
                self.connection.do_handshake()
            except OSError:
                return  # plain HTTP on the TLS port, a bad certificate, silence: only this one
        super().handle()

    def handle_one_request(self) -> None:
        wait_s = self.server.keep_alive_s if self._served else self.server.idle_timeout_s
        self.connection.settimeout(wait_s)
        self.server.wait_for_request(self.connection, wait_s)
        super().handle_one_request()
        self._served += 1

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self.server.request_in(self.connection)
        self.connection.settimeout(self.server.idle_timeout_s)
        return ok

    def end_headers(self) -> None:
        if self.server.keep_alive_s <= 0 and not self.close_connection:
            self.send_header("Connection", "close")
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape on stderr helps no one


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
