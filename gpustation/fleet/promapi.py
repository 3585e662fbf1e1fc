"""Prometheus's HTTP API: the URL check, credentials and a client for instant and range queries.

http.client from the standard library, with a connect and idle time-out, a
total deadline and a size cap on every request, and every failure (refused,
timed out, an HTTP error, an answer that is not the API's JSON or not its
shape) raised as :class:`PrometheusError` naming the server (exit 6).
Credentials go only to the configured origin.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import socket
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, cast

from gpustation import jsondoc
from gpustation.errors import EXIT_UNREACHABLE, GpustationError, UsageError
from gpustation.files import read_text
from gpustation.textsafe import safe

#: the connect and idle time-out of every request
REQUEST_TIMEOUT_S = 5.0
#: the deadline of a whole request (redirects, a slow answer and all)
TOTAL_TIMEOUT_S = 15.0
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)


class PrometheusError(GpustationError):
    """Prometheus could not be reached or answered with an error."""

    exit_code = EXIT_UNREACHABLE


def check_url(text: str, option: str = "--prometheus") -> str:
    """A Prometheus base URL (http or https, a host, no credentials); UsageError otherwise."""
    shown = safe(text)
    try:
        parts = urllib.parse.urlsplit(text.strip())
        port = parts.port
    except ValueError as err:
        raise UsageError(f"{option}: {shown!r} is not a URL ({err})") from None
    if parts.scheme not in ("http", "https"):
        raise UsageError(
            f"{option}: {shown!r} must start with http:// or https:// (e.g. http://prometheus:9090)"
        )
    if not parts.hostname:
        raise UsageError(f"{option}: {shown!r} names no host")
    if parts.username is not None or parts.password is not None:
        raise UsageError(
            f"{option}: put no credentials in the URL (they would show in ps and shell "
            "history); use [fleet] prometheus_user/prometheus_password_file or "
            "prometheus_token_file in config.toml"
        )
    if parts.query or parts.fragment:
        raise UsageError(f"{option}: {shown!r}: give the server's base URL, without ?query or #")
    if port is not None and port == 0:
        raise UsageError(f"{option}: port must be 1-65535 in {shown!r}")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def read_secret(path: str, what: str) -> str:
    """The first line of a file only its owner can read (a password or a token)."""
    p = Path(path).expanduser()
    text = read_text(p, what, private=True)
    secret = text.splitlines()[0].strip() if text.strip() else ""
    if not secret:
        raise UsageError(f"{what}: {p} is empty")
    return secret


def auth_header(
    user: str | None = None, password_file: str | None = None, token_file: str | None = None
) -> str | None:
    """The Authorization header for basic auth or a bearer token (or None for neither)."""
    if token_file:
        return "Bearer " + read_secret(token_file, "prometheus_token_file")
    if user:
        password = read_secret(password_file, "prometheus_password_file") if password_file else ""
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return None


class PrometheusClient:
    """Instant and range queries against one Prometheus server (or anything with its API).

    Each request has a connect and idle time-out (``connect_timeout_s``) and a
    total deadline (``timeout_s``: a server that sends a byte now and then is
    cut off there), reads at most ``max_bytes`` and checks the answer's shape.
    The Authorization header goes only to the origin of ``url``: a redirect to
    another scheme, host or port is followed without it. :meth:`abort` ends
    every request in flight at once (quitting never waits on the network).
    """

    def __init__(
        self,
        url: str,
        authorization: str | None = None,
        timeout_s: float = TOTAL_TIMEOUT_S,
        connect_timeout_s: float = REQUEST_TIMEOUT_S,
        max_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self.url = check_url(url)
        self.timeout_s = timeout_s
        self.connect_timeout_s = min(connect_timeout_s, timeout_s)
        self.max_bytes = max_bytes
        self._origin = _origin(urllib.parse.urlsplit(self.url))
        self._headers = {"Accept": "application/json", "User-Agent": "gpustation"}
        self._authorization = authorization
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()
        self._aborted = False

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._call("/api/v1/query", params, "vector")

    def query_range(
        self, expr: str, start: float, end: float, step_s: float
    ) -> list[dict[str, Any]]:
        params = {
            "query": expr,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{step_s:g}",
        }
        return self._call("/api/v1/query_range", params, "matrix")

    def abort(self) -> None:
        """End the requests in flight and refuse new ones (from any thread)."""
        with self._lock:
            self._aborted = True
            conns = list(self._open)
        for conn in conns:
            _cut(conn)

    def _call(self, path: str, params: dict[str, str], kind: str) -> list[dict[str, Any]]:
        where = f"Prometheus at {self.url}"
        status, raw = self._fetch(self.url + path, urllib.parse.urlencode(params), where)
        if status >= 400:
            detail = _api_error(raw, self.max_bytes) or http.client.responses.get(status, "")
            raise PrometheusError(f"{where}: HTTP {status}: {safe(str(detail))}")
        try:
            doc = jsondoc.loads(raw, self.max_bytes)
        except jsondoc.DocumentError as err:
            raise PrometheusError(f"{where}: the answer is {err} (is it Prometheus?)") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            why = doc.get("error") if isinstance(doc, dict) else "not a JSON object"
            raise PrometheusError(f"{where}: query failed: {safe(str(why))}")
        data = doc.get("data")
        if not isinstance(data, dict) or data.get("resultType") != kind:
            raise PrometheusError(f"{where}: expected a {kind} result")
        result = data.get("result")
        problem = _shape_problem(result, kind)
        if problem is not None:
            raise PrometheusError(f"{where}: the answer has the wrong shape: {problem}")
        return cast("list[dict[str, Any]]", result)

    def _fetch(self, url: str, form: str, where: str) -> tuple[int, bytes]:
        """(status, body) of the POST of ``form`` to ``url``, redirects followed."""
        deadline = time.monotonic() + self.timeout_s
        method, body = "POST", form.encode()
        for _ in range(MAX_REDIRECTS + 1):
            parts = urllib.parse.urlsplit(url)
            headers = {**self._headers}
            if method == "POST":
                headers["Content-Type"] = "application/x-www-form-urlencoded"
            if self._authorization and _origin(parts) == self._origin:
                headers["Authorization"] = self._authorization
            status, location, raw = self._exchange(parts, method, body, headers, deadline, where)
            if status not in _REDIRECTS or location is None:
                return status, raw
            url = urllib.parse.urljoin(url, location)
            if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
                raise PrometheusError(f"{where}: redirected to {safe(url)!r}, not an http URL")
            if status in (301, 302, 303) and method == "POST":  # GET, the form as the query
                method, body = "GET", b""
                url = url.split("#", 1)[0] + ("&" if "?" in url else "?") + form
        raise PrometheusError(f"{where}: more than {MAX_REDIRECTS} redirects")

    def _exchange(
        self,
        parts: urllib.parse.SplitResult,
        method: str,
        body: bytes,
        headers: dict[str, str],
        deadline: float,
        where: str,
    ) -> tuple[int, str | None, bytes]:
        """One request: (status, Location, body), within the deadline and the size cap."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise PrometheusError(f"{where}: no answer within {self.timeout_s:g} s")
        timeout = min(self.connect_timeout_s, left)
        conn: http.client.HTTPConnection
        host, port = parts.hostname or "", parts.port
        try:
            if parts.scheme == "https":
                conn = http.client.HTTPSConnection(host, port, timeout=timeout)
            else:
                conn = http.client.HTTPConnection(host, port, timeout=timeout)
        except ValueError as err:
            raise PrometheusError(f"{where}: {safe(str(err))}") from None
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            _cut(conn)

        # The socket time-out bounds each wait; the watchdog bounds the whole exchange.
        watchdog = threading.Timer(left, expire)
        watchdog.daemon = True
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        with self._lock:
            self._open.add(conn)
        try:
            watchdog.start()
            conn.connect()
            with self._lock:  # an abort during the connect found no socket to cut
                if self._aborted:
                    raise PrometheusError(f"{where}: stopped")
            conn.request(method, target, body=body or None, headers=headers)
            response = conn.getresponse()
            location = response.getheader("Location")
            raw = b""
            if response.status not in _REDIRECTS or location is None:
                length = response.getheader("Content-Length")
                if length and length.strip().isdigit() and int(length) > self.max_bytes:
                    raise PrometheusError(f"{where}: answer larger than {_mib(self.max_bytes)}")
                raw = response.read(self.max_bytes + 1)
        except (OSError, http.client.HTTPException, ValueError) as err:
            raise self._failure(err, where, expired.is_set(), timeout) from None
        finally:
            watchdog.cancel()
            with self._lock:
                self._open.discard(conn)
            conn.close()
        if expired.is_set():  # a body read to its cut-off end is not the answer
            raise PrometheusError(f"{where}: no answer within {self.timeout_s:g} s")
        if self._aborted:
            raise PrometheusError(f"{where}: stopped")
        if len(raw) > self.max_bytes:
            raise PrometheusError(f"{where}: answer larger than {_mib(self.max_bytes)}")
        return response.status, location, raw

    def _failure(
        self, err: Exception, where: str, expired: bool, timeout: float
    ) -> PrometheusError:
        if expired:
            return PrometheusError(f"{where}: no answer within {self.timeout_s:g} s")
        if self._aborted:
            return PrometheusError(f"{where}: stopped")
        if isinstance(err, (ConnectionRefusedError, socket.gaierror)):
            return PrometheusError(f"{where}: cannot connect ({safe(err.strerror or str(err))})")
        if isinstance(err, TimeoutError):
            return PrometheusError(f"{where}: nothing received for {timeout:g} s (timed out)")
        return PrometheusError(f"{where}: {safe(str(err) or type(err).__name__)}")


def _cut(conn: http.client.HTTPConnection) -> None:
    """End a connection another thread may be blocked on (its recv returns at once)."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _origin(parts: urllib.parse.SplitResult) -> tuple[str, str, int]:
    default = 443 if parts.scheme == "https" else 80
    return (parts.scheme, (parts.hostname or "").lower(), parts.port or default)


def _mib(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def _shape_problem(result: Any, kind: str) -> str | None:
    """What in a vector or matrix result is not as the API documents it (None: all is)."""
    if not isinstance(result, list):
        return f"data.result is {_kind(result)}, expected a list"
    for i, item in enumerate(result):
        where = f"data.result[{i}]"
        if not isinstance(item, dict):
            return f"{where} is {_kind(item)}, expected an object"
        metric = item.get("metric")
        if not isinstance(metric, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metric.items()
        ):
            return f"{where}.metric is not an object of label strings"
        if kind == "vector":
            if not _is_sample(item.get("value")):
                return f'{where}.value is not [time, "value"]'
        else:
            values = item.get("values")
            if not isinstance(values, list) or not all(_is_sample(v) for v in values):
                return f'{where}.values is not a list of [time, "value"]'
    return None


def _is_sample(pair: Any) -> bool:
    return (
        isinstance(pair, list)
        and len(pair) == 2
        and isinstance(pair[0], (int, float))
        and not isinstance(pair[0], bool)
        and isinstance(pair[1], str)
    )


def _kind(value: Any) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return "null" if value is None else kinds.get(type(value), "a number")


def _api_error(raw: bytes, max_bytes: int) -> str | None:
    try:
        doc = jsondoc.loads(raw, max_bytes)
    except jsondoc.DocumentError:
        return None
    return str(doc.get("error")) if isinstance(doc, dict) and doc.get("error") else None


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
