"""The Prometheus client against real loopback HTTP servers that misbehave.

Each server answers as a test scripts it: nested JSON, wrong shapes, a body
trickled a byte at a time, a body larger than the cap, redirects to its own
origin and to another port. The client must answer every one with a
PrometheusError naming the server, within its deadline, and send the
Authorization header only to the origin it was configured with.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from gpustation import cli
from gpustation.errors import EXIT_UNREACHABLE, UsageError
from gpustation.fleet.fleet import load_fleet_config
from gpustation.fleet.promapi import PrometheusClient, PrometheusError
from gpustation.fleet.prometheus import PrometheusFleet
from gpustation.fleet.ssh import DOWN
from tests.conftest import child_env, gpustation_cmd
from tests.fleet.promserver import ScriptedApi, empty_vector, send_json

pytestmark = pytest.mark.timeout(120)
AUTH = "Basic YWxpY2U6czNjcmV0"


@pytest.fixture
def api() -> Iterator[ScriptedApi]:
    with ScriptedApi() as server:
        yield server


@pytest.fixture
def other() -> Iterator[ScriptedApi]:
    """A second server on another port: another origin."""
    with ScriptedApi() as server:
        yield server


def answering(body: bytes) -> Callable[[BaseHTTPRequestHandler], None]:
    return lambda h: send_json(h, body)


def vector(result: object) -> bytes:
    doc = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return json.dumps(doc).encode()


def test_nested_json_is_a_message_naming_the_server(api: ScriptedApi) -> None:
    api.answer = answering(b"[" * 100_000)
    with pytest.raises(PrometheusError) as err:
        PrometheusClient(api.url).query("up")
    assert str(err.value).startswith(f"Prometheus at {api.url}: ")
    assert "nested deeper than" in str(err.value)
    api.answer = answering(vector([{"metric": {}, "value": [1.0, "1"]}])[:-2] + b"[" * 100_000)
    with pytest.raises(PrometheusError, match="nested deeper than"):
        PrometheusClient(api.url).query("up")


@pytest.mark.parametrize(
    ("result", "says"),
    [
        ({"a": 1}, "data.result is an object, expected a list"),
        ([7], "data.result[0] is a number, expected an object"),
        ([{"metric": ["instance"], "value": [1, "2"]}], "data.result[0].metric is not an object"),
        ([{"metric": {"instance": 3}, "value": [1, "2"]}], "data.result[0].metric is not an"),
        ([{"metric": {}, "value": [1, "2"]}, {"metric": {}, "value": "2"}], "result[1].value"),
        ([{"metric": {}, "value": [1, 2, 3]}], "data.result[0].value is not [time"),
        ([{"metric": {}, "value": ["x", "2"]}], "data.result[0].value is not [time"),
    ],
)
def test_a_wrong_shape_is_a_message_naming_the_server(
    api: ScriptedApi, result: object, says: str
) -> None:
    api.answer = answering(vector(result))
    with pytest.raises(PrometheusError) as err:
        PrometheusClient(api.url).query("up")
    assert str(err.value).startswith(f"Prometheus at {api.url}: the answer has the wrong shape")
    assert says in str(err.value)


def test_a_wrong_shape_shows_in_the_fleet_not_as_a_traceback(
    api: ScriptedApi, capsys: pytest.CaptureFixture[str]
) -> None:
    api.answer = answering(vector([{"metric": [], "value": {}}]))
    with PrometheusFleet(PrometheusClient(api.url), interval=0.2) as fleet:
        states = fleet.wait_first(20)
    assert [s.state for s in states] == [DOWN]
    assert states[0].error is not None and "wrong shape" in states[0].error
    assert api.url in states[0].error
    assert "Traceback" not in capsys.readouterr().err


def _trickle(
    api: ScriptedApi, headers_too: bool = False
) -> Callable[[BaseHTTPRequestHandler], None]:
    """An answer sent a byte a second (its headers too, with ``headers_too``)."""

    def answer(h: BaseHTTPRequestHandler) -> None:
        if headers_too:
            data = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n"
        else:
            h.send_response(200)
            h.send_header("Content-Length", "1000000")
            h.end_headers()
            h.wfile.flush()
            data = b'{"status":"success"' + b" " * 1_000_000
        for byte in data:
            if api.stopped.wait(1.0):
                return
            h.wfile.write(bytes([byte]))
            h.wfile.flush()

    return answer


@pytest.mark.parametrize("headers_too", [False, True], ids=["body", "headers"])
def test_a_trickling_server_meets_the_total_deadline(api: ScriptedApi, headers_too: bool) -> None:
    api.answer = _trickle(api, headers_too)
    client = PrometheusClient(api.url, timeout_s=2.5, connect_timeout_s=5)
    began = time.monotonic()
    with pytest.raises(PrometheusError) as err:
        client.query("up")
    took = time.monotonic() - began
    assert str(err.value) == f"Prometheus at {api.url}: no answer within 2.5 s"
    assert 2.4 <= took < 6, took


def test_an_answer_larger_than_the_cap_is_refused(api: ScriptedApi) -> None:
    def endless(h: BaseHTTPRequestHandler) -> None:  # no length: read until the cap
        h.send_response(200)
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(b'{"status":"success","data":{"result":["')
        for _ in range(64):
            h.wfile.write(b"x" * (1 << 16))

    api.answer = endless
    with pytest.raises(PrometheusError) as err:
        PrometheusClient(api.url, max_bytes=1 << 20).query("up")
    assert str(err.value) == f"Prometheus at {api.url}: answer larger than 1 MiB"

    def announced(h: BaseHTTPRequestHandler) -> None:  # refused from its length alone
        h.send_response(200)
        h.send_header("Content-Length", str(1 << 40))
        h.end_headers()

    api.answer = announced
    with pytest.raises(PrometheusError, match="answer larger than 1 MiB"):
        PrometheusClient(api.url, max_bytes=1 << 20).query("up")


def _redirect(status: int, to: str) -> Callable[[BaseHTTPRequestHandler], None]:
    def answer(h: BaseHTTPRequestHandler) -> None:
        if h.path.startswith("/behind/"):
            send_json(h, vector([{"metric": {"instance": "a:1"}, "value": [1.5, "1"]}]))
            return
        h.send_response(status)
        h.send_header("Location", to + "/behind" + h.path)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return answer


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_credentials_never_follow_a_redirect_to_another_origin(
    api: ScriptedApi, other: ScriptedApi, status: int
) -> None:
    other.answer = answering(empty_vector())
    api.answer = _redirect(status, other.url)
    client = PrometheusClient(api.url, authorization=AUTH)
    assert client.query("up") == []  # followed, and answered by the other server
    assert [h.get("Authorization") for _, h in api.seen] == [AUTH]
    assert other.seen and all("Authorization" not in h for _, h in other.seen), other.seen
    # the same host on another port is another origin too
    api.seen.clear()
    other.seen.clear()
    api.answer = _redirect(status, f"http://localhost:{other.port}")
    client.query("up")
    assert other.seen and all("Authorization" not in h for _, h in other.seen)


@pytest.mark.parametrize("status", [302, 307])
def test_a_same_origin_redirect_keeps_working_with_credentials(
    api: ScriptedApi, status: int
) -> None:
    api.answer = _redirect(status, api.url)
    client = PrometheusClient(api.url, authorization=AUTH)
    got = client.query("up")
    assert got == [{"metric": {"instance": "a:1"}, "value": [1.5, "1"]}]
    paths = [p for p, _ in api.seen]
    assert paths[0] == "/api/v1/query" and paths[1].startswith("/behind/api/v1/query")
    if status == 302:  # asked again with GET: the query travels in the URL
        assert "query=up" in paths[1]
    assert [h.get("Authorization") for _, h in api.seen] == [AUTH, AUTH]


def test_a_redirect_loop_ends_with_a_message(api: ScriptedApi) -> None:
    def loop(h: BaseHTTPRequestHandler) -> None:
        h.send_response(307)
        h.send_header("Location", "/api/v1/query")
        h.send_header("Content-Length", "0")
        h.end_headers()

    api.answer = loop
    with pytest.raises(PrometheusError, match=f"Prometheus at {api.url}: more than 5 redirects"):
        PrometheusClient(api.url).query("up")


def test_the_fleet_screen_quits_promptly_while_a_host_trickles(api: ScriptedApi) -> None:
    api.answer = _trickle(api)
    asyncio.run(_quit_while_trickling(api))


async def _quit_while_trickling(api: ScriptedApi) -> None:
    from gpustation.tui.fleet.screen import FleetApp

    fleet = PrometheusFleet(PrometheusClient(api.url, timeout_s=60), interval=0.5)
    app = FleetApp([], fleet=fleet)
    async with app.run_test(size=(120, 30)) as pilot:
        deadline = time.monotonic() + 20
        while not api.seen and time.monotonic() < deadline:
            await pilot.pause(0.05)
        assert api.seen, "no request reached the server"
        began = time.monotonic()
        await pilot.press("q")
    # leaving run_test waits until the app has exited (its unmount closes the fleet)
    took = time.monotonic() - began
    assert fleet._thread is not None and not fleet._thread.is_alive()
    assert took < 3.0, f"quitting took {took:.1f} s while a host trickled"


def test_a_watch_ends_promptly_on_sigterm_while_a_host_trickles(api: ScriptedApi) -> None:
    api.answer = _trickle(api)
    proc = subprocess.Popen(
        gpustation_cmd("snapshot", "--prometheus", api.url, "--watch", "1", "--json"),
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not api.seen and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert api.seen, "no request reached the server"
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert took < 3.0, f"the watch took {took:.1f} s to end while a host trickled"


def test_the_deadline_is_set_in_config_and_named_in_the_message(
    api: ScriptedApi, gpustation_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    api.answer = _trickle(api)
    config = gpustation_dirs["config"] / "config.toml"
    config.write_text(f'[fleet]\nprometheus = "{api.url}"\nprometheus_timeout = 2\n')
    began = time.monotonic()
    assert cli.main(["snapshot", "--prometheus", api.url, "--json"]) == EXIT_UNREACHABLE
    took = time.monotonic() - began
    doc = json.loads(capsys.readouterr().out)
    assert doc["hosts"][0]["error"] == f"Prometheus at {api.url}: no answer within 2 s"
    assert took < 8, took
    config.write_text('[fleet]\nprometheus_timeout = "soon"\n')
    with pytest.raises(UsageError, match="prometheus_timeout must be a number of seconds"):
        load_fleet_config()
    config.write_text("[fleet]\nprometheus_timeout = 0\n")
    with pytest.raises(UsageError, match=r"prometheus_timeout must be 0\.1 to 600 seconds"):
        load_fleet_config()
