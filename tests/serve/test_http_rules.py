"""The exporter's HTTP answers stated exactly, in-process: a scrape in the format and
encoding asked, the password asked for and its refusal, HEAD, the connection kept or
closed, and the words when the port cannot be had."""

from __future__ import annotations

import base64
import errno
import gzip
import http.client
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from gpustation.errors import GpustationError
from gpustation.serve.exporter import Exporter
from gpustation.serve.http import metrics_response, serve
from gpustation.serve.server import BoundedServer
from gpustation.telemetry.model import GpuSample, Snapshot

#: the text format Prometheus has always read
TEXT = "text/plain; version=0.0.4; charset=utf-8"
USERS = {"alice": "pw"}
ALICE = "Basic " + base64.b64encode(b"alice:pw").decode()


def one_card() -> Snapshot:
    return Snapshot(hostname="box", time=5.0, gpus=[GpuSample(index=0, temperature_c=40.0)])


@pytest.fixture
def exporter() -> Exporter:
    exporter = Exporter(one_card, with_extras=False)
    exporter.sample_once()
    return exporter


def test_a_scrape_is_the_latest_sample_in_the_format_and_encoding_asked(
    exporter: Exporter,
) -> None:
    text = exporter.rendered(generate_latest)
    assert b"DCGM_FI_DEV_GPU_TEMP" in text
    plain = (200, [("Content-Type", TEXT)], text)
    for path in ("/metrics", "/", "/metrics?name[]=up"):  # any other path, query or not
        assert metrics_response(exporter, None, path, {}) == plain
    asked = {"accept": "application/openmetrics-text; version=1.0.0"}
    status, headers, body = metrics_response(exporter, None, "/metrics", asked)
    assert (status, body) == (200, exporter.rendered(openmetrics.generate_latest))
    [(name, value)] = headers  # prometheus_client's words for the format, and no gzip
    assert name == "Content-Type" and value.startswith("application/openmetrics-text; ")
    status, headers, body = metrics_response(
        exporter, None, "/metrics", {"accept-encoding": "br, gzip"}
    )
    assert status == 200 and gzip.decompress(body) == text
    assert headers == [("Content-Type", TEXT), ("Content-Encoding", "gzip")]
    assert metrics_response(exporter, USERS, "/metrics", {"authorization": ALICE}) == plain
    wrong = "Basic " + base64.b64encode(b"alice:no").decode()
    assert metrics_response(exporter, USERS, "/metrics", {"authorization": wrong})[0] == 401
    assert metrics_response(exporter, USERS, "/favicon.ico", {})[0] == 401  # even the icon


@pytest.fixture
def serving(exporter: Exporter) -> Iterator[Callable[..., int]]:
    started: list[tuple[BoundedServer, threading.Thread]] = []

    def start(**kw: float) -> int:
        server, thread = serve(exporter, "127.0.0.1", 0, users=USERS, **kw)  # type: ignore[arg-type]
        started.append((server, thread))
        return int(server.server_address[1])

    yield start
    for server, thread in started:
        if thread.is_alive():  # shutdown() would wait for ever on a loop that died
            server.shutdown()
        server.server_close()


def test_head_says_what_get_would_send_without_the_body(serving: Callable[..., int]) -> None:
    ask = f"/metrics HTTP/1.1\r\nHost: box\r\nAuthorization: {ALICE}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", serving()), timeout=30) as conn:
        conn.sendall(f"HEAD {ask}GET {ask}".encode())  # one after the other on one connection
        stream = b""
        while True:
            head, _, rest = stream.partition(b"\r\n\r\n")
            got_head, _, body = rest.partition(b"\r\n\r\n")
            length = re.search(rb"Content-Length: (\d+)", got_head)
            if length and len(body) >= int(length[1]):
                break
            chunk = conn.recv(65536)
            assert chunk, f"closed after {stream!r}"
            stream += chunk
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert rest.startswith(b"HTTP/1.1 200 OK\r\n")  # no body between the two answers
    assert f"Content-Length: {len(body)}".encode() in head.split(b"\r\n")
    assert b"DCGM_FI_DEV_GPU_TEMP" in body


def test_a_refused_scrape_closes_its_connection(serving: Callable[..., int]) -> None:
    with socket.create_connection(("127.0.0.1", serving()), timeout=30) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: box\r\n\r\n")
        answer = b""
        while chunk := conn.recv(4096):  # the server closes: no password, no kept connection
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 401 Unauthorized" and body == b"unauthorized\n"
    assert b"Connection: close" in lines and b"Content-Length: 13" in lines
    assert b'WWW-Authenticate: Basic realm="gpustation"' in lines


def test_a_connection_is_kept_unless_keep_alive_is_0(serving: Callable[..., int]) -> None:
    for keep_alive_s, kept in ((0.9, True), (0.0, False)):
        conn = http.client.HTTPConnection(
            "127.0.0.1", serving(keep_alive_s=keep_alive_s), timeout=30
        )
        conn.request("GET", "/metrics", headers={"Authorization": ALICE})
        got = conn.getresponse()
        got.read()
        assert got.headers["Connection"] == (None if kept else "close")
        assert (conn.sock is not None) == kept  # http.client closes on "close"
        conn.close()


def test_a_connection_that_sends_nothing_is_let_go_after_the_idle_timeout(
    serving: Callable[..., int],
) -> None:
    with socket.create_connection(("127.0.0.1", serving(idle_timeout_s=0.2)), timeout=30) as c:
        assert c.recv(1) == b""  # closed by the server, well before the 30 s here


def test_a_port_that_cannot_be_had_is_named_with_why(exporter: Exporter) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(GpustationError) as raised:
            serve(exporter, "127.0.0.1", port)
    assert str(raised.value) == (
        f"cannot listen on 127.0.0.1:{port}: the port is already in use; "
        "choose another with --listen HOST:PORT"
    )
    # an address of no interface here (TEST-NET-1): nothing is sent, bind() refuses
    with pytest.raises(GpustationError) as raised:
        serve(exporter, "192.0.2.1", 9400)
    assert str(raised.value) == (
        f"cannot listen on 192.0.2.1:9400: {os.strerror(errno.EADDRNOTAVAIL)}"
    )
