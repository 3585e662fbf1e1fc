"""The exporter's HTTP side: a threaded server and the ``/metrics`` app.

TLS (``--tls-cert``/``--tls-key``) wraps the listening socket with the
standard library's ssl; the handshake happens in each connection's own
thread, so a slow client never holds up the others. Basic authentication
(``--basic-auth-file``) reads ``user:password`` lines from a file only its
owner can read, as ssh does with keys, and compares in constant time.

prometheus_client's ``start_http_server`` listens with socketserver's default
backlog of 5 and renders the registry on every scrape; with a score of
scrapers at once (several Prometheus servers, Grafana's live queries, ad-hoc
curls) the rest wait for TCP retransmits. Here the backlog is 128 and each
sample is rendered once per format (``Exporter.rendered``), using
prometheus_client's own encoder choice and gzip rule; the figures are in
bench/RESULTS.md (``bench/exporter_load.py``).
"""

from __future__ import annotations

import base64
import errno
import gzip
import hmac
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.exposition import choose_encoder, gzip_accepted

from gpustation.errors import GpustationError, UsageError
from gpustation.files import read_text
from gpustation.serve.exporter import Exporter


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 128
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape on stderr helps no one


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


def _authorized(environ: dict[str, Any], users: dict[str, str]) -> bool:
    header = environ.get("HTTP_AUTHORIZATION", "")
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


def metrics_app(
    exporter: Exporter, users: dict[str, str] | None = None
) -> Callable[..., Iterable[bytes]]:
    """A WSGI app serving the exporter's latest sample at ``/metrics`` (and ``/``)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if users is not None and not _authorized(environ, users):
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Basic realm="gpustation"')],
            )
            return [b"unauthorized\n"]
        path = environ.get("PATH_INFO") or "/"
        if path == "/favicon.ico":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        body = exporter.rendered(encoder)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            body = gzip.compress(body, compresslevel=1)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [body]

    return app


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context for the certificate chain and key; UsageError naming what is wrong."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except FileNotFoundError as err:
        raise UsageError(f"--tls-cert/--tls-key: {err.filename}: no such file") from None
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
) -> tuple[WSGIServer, threading.Thread]:
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

    class Server(_Server):
        address_family = family

    try:
        httpd = make_server(
            str(address[0]), port, metrics_app(exporter, users), Server, handler_class=_QuietHandler
        )
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise GpustationError(
                f"cannot listen on {host}:{port}: the port is already in use; "
                "choose another with --listen HOST:PORT"
            ) from None
        raise GpustationError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    if tls is not None:
        httpd.socket = tls.wrap_socket(
            httpd.socket, server_side=True, do_handshake_on_connect=False
        )
    thread = threading.Thread(target=httpd.serve_forever, name="gpustation-http", daemon=True)
    thread.start()
    return httpd, thread
