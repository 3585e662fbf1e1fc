"""``gpustation web``'s request rules in-process, over a real socket: the Host and
Origin checks, the token swapped for a session cookie, the page's URLs built from
the address the browser used, and the cap on dashboards open at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import ClientSession, CookieJar, WSServerHandshakeError
from aiohttp.test_utils import TestServer

from gpustation.serve.web import DashboardServer, dashboard_command, url_host

TOKEN = "a-token-of-sixteen-or-more"


def _serve(
    check: Callable[[str, ClientSession, DashboardServer], Awaitable[None]], **kw: Any
) -> None:
    async def run() -> None:
        dash = DashboardServer("true", host="127.0.0.1", port=0, title="gpu <box>", **kw)
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
