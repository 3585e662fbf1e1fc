"""Prometheus's HTTP API: the URL check, credentials and a client for instant and range queries.

urllib from the standard library, a time-out on every request, and every
failure (refused, timed out, an HTTP error, an answer that is not the API's
JSON) raised as :class:`PrometheusError` with a message for the user (exit 6).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from gpustation.errors import EXIT_UNREACHABLE, GpustationError, UsageError
from gpustation.files import read_text
from gpustation.textsafe import safe

REQUEST_TIMEOUT_S = 5.0
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


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
    """Instant and range queries against one Prometheus server (or anything with its API)."""

    def __init__(
        self, url: str, authorization: str | None = None, timeout_s: float = REQUEST_TIMEOUT_S
    ) -> None:
        self.url = check_url(url)
        self.timeout_s = timeout_s
        self._headers = {"Accept": "application/json", "User-Agent": "gpustation"}
        if authorization:
            self._headers["Authorization"] = authorization

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

    def _call(self, path: str, params: dict[str, str], kind: str) -> list[dict[str, Any]]:
        body = urllib.parse.urlencode(params).encode()
        request = urllib.request.Request(
            self.url + path,
            data=body,
            headers={**self._headers, "Content-Type": "application/x-www-form-urlencoded"},
            method="POST",
        )
        where = f"Prometheus at {self.url}"
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as err:
            detail = _api_error(err.read(65536)) or err.reason
            raise PrometheusError(f"{where}: HTTP {err.code}: {safe(str(detail))}") from None
        except urllib.error.URLError as err:
            reason = getattr(err.reason, "strerror", None) or err.reason
            raise PrometheusError(f"{where}: cannot connect ({safe(str(reason))})") from None
        except (OSError, ValueError) as err:  # time-outs, resets, a malformed reply
            raise PrometheusError(f"{where}: {safe(str(err) or type(err).__name__)}") from None
        if len(raw) > MAX_RESPONSE_BYTES:
            raise PrometheusError(f"{where}: answer larger than {MAX_RESPONSE_BYTES >> 20} MiB")
        try:
            doc = json.loads(raw)
        except ValueError:
            raise PrometheusError(f"{where}: the answer is not JSON (is it Prometheus?)") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            why = doc.get("error") if isinstance(doc, dict) else None
            raise PrometheusError(f"{where}: query failed: {safe(str(why))}")
        data = doc.get("data")
        if not isinstance(data, dict) or data.get("resultType") != kind:
            raise PrometheusError(f"{where}: expected a {kind} result")
        result = data.get("result")
        return [r for r in result if isinstance(r, dict)] if isinstance(result, list) else []


def _api_error(raw: bytes) -> str | None:
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return str(doc.get("error")) if isinstance(doc, dict) and doc.get("error") else None


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
