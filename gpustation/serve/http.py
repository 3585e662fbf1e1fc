"""The exporter's HTTP side: a threaded server and the ``/metrics`` app.

prometheus_client's ``start_http_server`` listens with socketserver's default
backlog of 5 and renders the registry on every scrape; with a score of
scrapers at once (several Prometheus servers, Grafana's live queries, ad-hoc
curls) the rest wait for TCP retransmits. Here the backlog is 128 and each
sample is rendered once per format (``Exporter.rendered``), using
prometheus_client's own encoder choice and gzip rule; the figures are in
bench/RESULTS.md (``bench/exporter_load.py``).
"""

from __future__ import annotations

import errno
import gzip
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.exposition import choose_encoder, gzip_accepted

from gpustation.errors import GpustationError, UsageError
from gpustation.serve.exporter import Exporter


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 128
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape on stderr helps no one


def metrics_app(exporter: Exporter) -> Callable[..., Iterable[bytes]]:
    """A WSGI app serving the exporter's latest sample at ``/metrics`` (and ``/``)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
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


def serve(exporter: Exporter, host: str, port: int) -> tuple[WSGIServer, threading.Thread]:
    """Serve the exporter over HTTP in a daemon thread.

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
            str(address[0]), port, metrics_app(exporter), Server, handler_class=_QuietHandler
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
