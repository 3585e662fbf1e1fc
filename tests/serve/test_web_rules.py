"""``gpustation web``'s request rules in-process, over a real socket: the Host and
Origin checks, the token swapped for a session cookie, the page's URLs built from
the address the browser used, and the cap on dashboards open at once."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import ClientSession, CookieJar, WSServerHandshakeError, web
from aiohttp.test_utils import TestServer, make_mocked_request

from gpustation.serve.web import DashboardServer, dashboard_command, url_host

TOKEN = "a-token-of-sixteen-or-more"


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def _serve(
    check: Callable[[str, ClientSession, DashboardServer], Awaitable[None]],
    command: str = "true",
    **kw: Any,
) -> None:
    async def run() -> None:
        dash = DashboardServer(command, host="127.0.0.1", port=0, title="gpu <box>", **kw)
        server = TestServer(dash.make_app(), host="127.0.0.1")
        await server.start_server()
        try:
            async with ClientSession(cookie_jar=CookieJar(unsafe=True)) as session:
                await check(f"http://127.0.0.1:{server.port}", session, dash)
        finally:
            await server.close()

    asyncio.run(run())


def test_the_token_is_swapped_for_a_session_cookie_and_the_page_names_this_address() -> None:
    async def check(base: str, session: ClientSession, dash: DashboardServer) -> None:
        async with session.get(f"{base}/?fontsize=20&token=wrong", allow_redirects=False) as r:
            assert r.status == 403
            assert "this address needs its token" in await r.text()
        async with session.get(f"{base}/?fontsize=20&token={TOKEN}", allow_redirects=False) as r:
            assert r.status == 303
            assert r.headers["Location"] == "/?fontsize=20"
            assert r.headers["Cache-Control"] == "no-store"
            cookie = r.cookies[dash.cookie]
            assert cookie.value != TOKEN and dash.keys.valid(cookie.value)
            assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
            assert int(cookie["max-age"]) == int(dash.keys.lifetime_s)
        async with session.get(f"{base}/?fontsize=20") as r:
            assert r.status == 200
            page = await r.text()
        host = base.removeprefix("http://")
        assert f'data-session-websocket-url="ws://{host}/ws"' in page
        assert f'href="http://{host}/static/css/xterm.css"' in page
        assert 'data-font-size="20"' in page
        assert "<div>gpu &lt;box&gt;</div>" in page

    _serve(check, token=TOKEN)


def test_without_a_cookie_or_token_every_route_is_refused() -> None:
    async def check(base: str, session: ClientSession, dash: DashboardServer) -> None:
        for path in ("/", "/static/", "/download/x"):
            async with session.get(base + path) as r:
                assert r.status == 403, path
                assert await r.text() == (
                    "gpustation web: this address needs its token; open the URL "
                    "gpustation web printed when it started (…/?token=…)\n"
                )
        session.cookie_jar.update_cookies({dash.cookie: "made-up"})
        async with session.get(base + "/") as r:
            assert r.status == 403

    _serve(check, token=TOKEN)


def test_a_foreign_host_or_origin_is_refused() -> None:
    async def check(base: str, session: ClientSession, dash: DashboardServer) -> None:
        async with session.get(base + "/", headers={"Host": "evil.example"}) as r:
            assert r.status == 421
            assert await r.text() == (
                "gpustation web: this server does not answer to 'evil.example'; open the "
                "address gpustation web printed when it started\n"
            )
        async with session.get(base + "/", headers={"Origin": "http://evil.example"}) as r:
            assert r.status == 403
            assert "'http://evil.example' is another" in await r.text()
        async with session.get(base + "/", headers={"Origin": base}) as r:
            assert r.status == 200  # its own page
        async with session.get(base + "/") as r:
            assert r.status == 200  # no token asked for: served
        try:
            async with session.ws_connect(base + "/ws", origin="http://evil.example"):
                raise AssertionError("a foreign page opened the dashboard")
        except WSServerHandshakeError as err:
            assert err.status == 403

    _serve(check, token=None)


def test_dashboards_past_the_cap_are_told_to_close_one() -> None:
    async def check(base: str, session: ClientSession, dash: DashboardServer) -> None:
        dash.sessions = 2
        try:
            async with session.ws_connect(base + "/ws", origin=base):
                raise AssertionError("a third dashboard opened")
        except WSServerHandshakeError as err:
            assert err.status == 503
        assert dash.sessions == 2

    _serve(check, token=None, max_sessions=2)


def test_the_server_keeps_what_it_was_given() -> None:
    dash = DashboardServer("cmd", host="0.0.0.0", port=8765, token=TOKEN, title="t")
    assert (dash.token, dash.max_sessions, dash.sessions, dash.cookie) == (
        TOKEN,
        4,
        0,
        "gpustation_web_8765",
    )
    assert "localhost" in dash.names or "127.0.0.1" in dash.names
    named = DashboardServer("cmd", "127.0.0.1", 1, None, "t", names=frozenset({"box"}))
    assert named.names == frozenset({"box"})
    assert url_host("::1") == "[::1]" and url_host("box") == "box"
    assert dashboard_command(["--refresh", "1"], True, python="/py").endswith(
        "-m gpustation --read-only --refresh 1"
    )


def test_the_server_answers_until_sigterm_and_closes_idle_connections(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpustation.serve import web as web_mod

    monkeypatch.setattr(web_mod, "connection_cap", lambda wanted, reserve: wanted - 1)
    dash = DashboardServer("true", "127.0.0.1", 0, TOKEN, "t", max_sessions=2)
    seen: dict[str, Any] = {}

    def probe(port: int) -> None:
        try:
            idle = socket.create_connection(("127.0.0.1", port), timeout=30)
            began = time.monotonic()
            seen["idle_end"] = idle.recv(1)  # sends nothing: closed at the idle timeout
            seen["idle_s"] = time.monotonic() - began
            idle.close()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30):
                pass
        except urllib.error.HTTPError as err:
            seen["status"] = err.code
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_ready(port: int) -> None:
        seen["port"] = port
        threading.Thread(target=probe, args=(port,), daemon=True).start()

    asyncio.run(
        asyncio.wait_for(
            web_mod.serve_until_stopped(dash, on_ready, idle_timeout_s=0.5, max_connections=20),
            120,
        )
    )
    assert seen["status"] == 403 and seen["idle_end"] == b""
    assert 0.4 <= seen["idle_s"] < 20
    assert capsys.readouterr().err == (
        "gpustation: at most 19 connections at once, not 20: the open-files limit leaves "
        "room for no more (`ulimit -n` raises it)\n"
    )
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", seen["port"]), timeout=5)


def test_an_open_dashboard_counts_until_it_closes_and_past_the_cap_the_refusal_says_why() -> None:
    async def check(base: str, session: ClientSession, dash: DashboardServer) -> None:
        first = await session.ws_connect(base + "/ws", origin=base)
        try:
            await _until(lambda: dash.sessions == 1, "the first dashboard to count")
            async with session.get(base + "/ws", headers={"Origin": base}) as r:
                assert r.status == 503
                assert await r.text() == (
                    "gpustation web: 1 dashboards are open, the most --max-sessions allows; "
                    "close one (its browser tab) and reload\n"
                )
            assert dash.sessions == 1
        finally:
            await first.close()
        await _until(lambda: dash.sessions == 0, "the closed dashboard to stop counting")
        second = await session.ws_connect(base + "/ws", origin=base)
        try:
            await _until(lambda: dash.sessions == 1, "the next dashboard to count")
        finally:
            await second.close()
        await _until(lambda: dash.sessions == 0, "the second dashboard to stop counting")

    _serve(check, token=None, max_sessions=1, command="cat > /dev/null")


def test_the_page_s_font_size_is_16_unless_a_number_is_asked_for() -> None:
    async def check(base: str, session: ClientSession, dash: DashboardServer) -> None:
        for query, size in (("", "16"), ("?fontsize=big", "16"), ("?fontsize=12", "12")):
            async with session.get(f"{base}/{query}") as r:
                assert r.status == 200
                assert f'data-font-size="{size}"' in await r.text()

    _serve(check, token=None)


def test_a_connection_cap_the_open_files_limit_allows_is_taken_without_a_word(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gpustation.serve import web as web_mod

    dash = DashboardServer("true", "127.0.0.1", 0, None, "t", max_sessions=1)
    seen: dict[str, Any] = {}

    def on_ready(port: int) -> None:
        def probe() -> None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as resp:
                    seen["status"] = resp.status
            finally:
                os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=probe, daemon=True).start()

    asyncio.run(
        asyncio.wait_for(web_mod.serve_until_stopped(dash, on_ready, max_connections=5), 120)
    )
    assert seen["status"] == 200
    assert capsys.readouterr().err == ""


def test_a_page_served_over_https_opens_its_websocket_over_tls() -> None:
    async def page(sslcontext: ssl.SSLContext | None) -> str:
        dash = DashboardServer("true", host="127.0.0.1", port=0, title="t", token=None)
        app = dash.make_app()
        asked = make_mocked_request(
            "GET", "/", headers={"Host": "box:8443"}, app=app, sslcontext=sslcontext
        )
        answer = await dash.handle_index(asked)
        assert isinstance(answer, web.Response) and answer.text is not None
        return answer.text

    over_tls = asyncio.run(page(ssl.create_default_context()))
    assert 'data-session-websocket-url="wss://box:8443/ws"' in over_tls
    assert "https://box:8443/static/js/textual.js" in over_tls
    plain = asyncio.run(page(None))
    assert 'data-session-websocket-url="ws://box:8443/ws"' in plain
    assert "http://box:8443/static/js/textual.js" in plain


def test_each_open_dashboard_counts() -> None:
    async def check(base: str, session: ClientSession, dash: DashboardServer) -> None:
        first = await session.ws_connect(base + "/ws", origin=base)
        second = await session.ws_connect(base + "/ws", origin=base)
        try:
            await _until(lambda: dash.sessions == 2, "both dashboards to count")
        finally:
            await first.close()
            await second.close()
        await _until(lambda: dash.sessions == 0, "the closed dashboards to stop counting")

    _serve(check, token=None, max_sessions=2, command="cat > /dev/null")
