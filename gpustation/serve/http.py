"""The exporter's HTTP side: ``/metrics`` on a :class:`~gpustation.serve.server.BoundedServer`.

The server (``serve/server.py``) is the standard library's ``http.server``
speaking HTTP/1.1 with keep-alive (``--keep-alive``), a thread per
connection, an idle timeout (``--idle-timeout``), a connection cap
(``--max-connections``) and back-off when the process runs out of file
descriptors. Each sample is rendered once per format
(``Exporter.rendered``), with prometheus_client's own encoder choice and
gzip rule; the figures are in bench/RESULTS.md (``bench/exporter_load.py``).

TLS (``--tls-cert``/``--tls-key``) wraps the listening socket with the
standard library's ssl; the handshake happens in each connection's own
thread. Basic authentication (``--basic-auth-file``) reads ``user:password``
lines from a file only its owner can read, as ssh does with keys, and
compares in constant time.

No ``Host`` or ``Origin`` check: Prometheus sends the target's own name as
``Host`` (whatever name, address or tunnel its configuration uses), so a list
of allowed names would break scrapers, and there is no state to change and no
cookie to ride on: a page in a browser that rebinds a name to this address
reads what any scraper that can reach the port reads, and no more once basic
authentication is on (the browser holds no credentials for it).
"""

from __future__ import annotations

import base64
import errno
import gzip
import hmac
import socket
import ssl
import threading
from collections.abc import Mapping
from http import HTTPStatus
from pathlib import Path

from prometheus_client.exposition import choose_encoder, gzip_accepted

from gpustation.errors import GpustationError, UsageError
from gpustation.files import read_text
from gpustation.serve.exporter import Exporter
from gpustation.serve.server import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_KEEP_ALIVE_S,
    DEFAULT_MAX_CONNECTIONS,
    BoundedHandler,
    BoundedServer,
)

#: (status, headers, body) for one request
Response = tuple[HTTPStatus, list[tuple[str, str]], bytes]


def load_users(path: Path) -> dict[str, str]:
    """``user:password`` lines (``#`` comments) from a file only its owner can read."""
    users: dict[str, str] = {}
    text = read_text(path, "--basic-auth-file", private=True)
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user or not password:
            raise UsageError(f"--basic-auth-file: {path} line {number}: expected user:password")
        users[user] = password
    if not users:
        raise UsageError(f"--basic-auth-file: {path} names no user")
    return users


def _authorized(header: str, users: dict[str, str]) -> bool:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return False
    expected = users.get(user)
    # compare_digest on both paths, so a wrong user costs the same as a wrong password
    return hmac.compare_digest(password.encode(), (expected or "\0" + password).encode()) and (
        expected is not None
    )


def metrics_response(
    exporter: Exporter, users: dict[str, str] | None, path: str, headers: Mapping[str, str]
) -> Response:
    """The answer to a GET of ``path``: the latest sample at ``/metrics`` (and ``/``).

    ``headers`` are the request's, by lower-case name.
    """
    if users is not None and not _authorized(headers.get("authorization", ""), users):
        return (
            HTTPStatus.UNAUTHORIZED,
            [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Basic realm="gpustation"')],
            b"unauthorized\n",
        )
    if path.partition("?")[0] == "/favicon.ico":
        return HTTPStatus.NOT_FOUND, [("Content-Type", "text/plain")], b"not found\n"
    encoder, content_type = choose_encoder(headers.get("accept", ""))
    body = exporter.rendered(encoder)
    out = [("Content-Type", content_type)]
    if gzip_accepted(headers.get("accept-encoding", "")):
        body = gzip.compress(body, compresslevel=1)
        out.append(("Content-Encoding", "gzip"))
    return HTTPStatus.OK, out, body


def _handler(exporter: Exporter, users: dict[str, str] | None) -> type[BoundedHandler]:
    class MetricsHandler(BoundedHandler):
        def do_GET(self) -> None:
            self._respond(body=True)

        def do_HEAD(self) -> None:
            self._respond(body=False)

        def _respond(self, body: bool) -> None:
            asked = {name.lower(): value for name, value in self.headers.items()}
            status, headers, content = metrics_response(exporter, users, self.path, asked)
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            if status == HTTPStatus.UNAUTHORIZED:
                self.send_header("Connection", "close")  # no kept connection without a password
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            if body:
                self.wfile.write(content)

    return MetricsHandler


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context for the certificate chain and key; UsageError naming what is wrong."""
    # read first, as every file a user names is: a missing file, a directory or a
    # FIFO is then named with its option (ssl's own error names neither)
    read_text(cert, "--tls-cert")
    read_text(key, "--tls-key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as err:
        raise UsageError(
            f"--tls-cert/--tls-key: cannot use {cert} with {key}: {err.strerror or err}"
        ) from None
    return context


def serve(
    exporter: Exporter,
    host: str,
    port: int,
    tls: ssl.SSLContext | None = None,
    users: dict[str, str] | None = None,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
) -> tuple[BoundedServer, threading.Thread]:
    """Serve the exporter over HTTP (HTTPS with ``tls``) in a daemon thread.

    UsageError for a host that does not resolve; GpustationError when the port
    cannot be had.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        why = err.strerror if isinstance(err, socket.gaierror) else "not a valid host name"
        raise UsageError(
            f"--listen: cannot resolve {host!r} ({why}); "
            "give an address such as 127.0.0.1:9400 or [::1]:9400"
        ) from None
    family, _, _, _, address = infos[0]

    class Server(BoundedServer):
        address_family = family

    try:
        httpd = Server(
            (str(address[0]), port),
            _handler(exporter, users),
            idle_timeout_s=idle_timeout_s,
            max_connections=max_connections,
            tls=tls,
            keep_alive_s=keep_alive_s,
        )
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise GpustationError(
                f"cannot listen on {host}:{port}: the port is already in use; "
                "choose another with --listen HOST:PORT"
            ) from None
        raise GpustationError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    thread = threading.Thread(target=httpd.serve_forever, name="gpustation-http", daemon=True)
    thread.start()
    return httpd, thread
