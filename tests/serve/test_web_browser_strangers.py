"""``gpustation web`` against strangers, in a real headless Chromium.

A page served from another port of this host, a name that resolves here but
is not the server's (DNS rebinding), the token left in the address bar, one
dashboard process per socket: what a browser does with each.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpustation.control import journal
from tests.conftest import child_env

from .test_web_browser import (
    CAPTURE,
    WAIT_S,
    BrowserTerminal,
    chromium,
    dashboards_of,
    power_limits,
)
from .webserver import WebServer, free_port

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def sessions_of(web: WebServer) -> list[psutil.Process]:
    """The server's children: one per dashboard session (its shell, or the dashboard itself)."""
    children: list[psutil.Process] = psutil.Process(web.proc.pid).children()
    return children


#: a page that opens the dashboard's websocket and, if it ever opens, lowers GPU 0's power
ATTACK = """<!doctype html>
<script>
const seen = (window.seen = []);
const ws = new WebSocket("ws://127.0.0.1:PORT/ws?width=120&height=40");
const keys = ["c", "w", "-", "\\r", "y"];
ws.onopen = () => {
  seen.push("open");
  keys.forEach((key, i) =>
    setTimeout(() => ws.send(JSON.stringify(["stdin", key])), 4000 + 1500 * i));
};
ws.onclose = () => seen.push("close");
</script>
"""


def new_tab(driver: Any) -> None:
    """A new tab, current, with the terminal capture (a tab of its own needs it again)."""
    driver.switch_to.new_window("tab")
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CAPTURE})


def wait_until(condition: Any, what: str, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened within {timeout:g} s: {what}")
        time.sleep(0.1)


class PageServer:
    """``python -m http.server`` on another loopback port, serving ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                str(self.port),
                "--directory",
                str(folder),
            ],
            env=child_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def __enter__(self) -> PageServer:
        import urllib.request

        def up() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=5):
                    return True
            except OSError:
                return False

        wait_until(up, "http.server listening")
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.mark.parametrize(
    "args", [["--allow-control"], ["--no-token"]], ids=["token-control", "no-token"]
)
def test_a_page_on_another_port_cannot_open_the_dashboard(args: list[str], tmp_path: Path) -> None:
    with WebServer("--simulate", "2", *args) as web, chromium() as driver:
        web.wait_listening()
        url = web.url()
        (tmp_path / "index.html").write_text(ATTACK.replace("PORT", str(web.port)))
        driver.get(url)
        # The token is gone from the address bar; the cookie holds something else.
        assert driver.current_url == f"{web.base}/"
        cookies = driver.get_cookies()
        if "--no-token" in args:
            assert cookies == []
        else:
            (cookie,) = cookies
            assert cookie["name"] == f"gpustation_web_{web.port}"
            assert cookie["value"] != web.token() and web.token() not in cookie["value"]
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        BrowserTerminal(driver).wait_for("SIMULATED", "GPU 0 RTX 4090")
        own = sessions_of(web)
        assert len(own) == 1
        before = power_limits()

        with PageServer(tmp_path) as pages:
            driver.get(f"http://127.0.0.1:{pages.port}/")
            seen = wait_until(
                lambda: driver.execute_script("return window.seen.slice()") or None,
                "the foreign page's socket answered",
            )
        assert seen == ["close"]  # refused: it never opened
        # The foreign page started no dashboard of its own.
        assert {p.pid for p in sessions_of(web)} <= {p.pid for p in own}
        assert power_limits() == before == [450.0, 450.0]
        assert list(journal.read_entries()) == []


def test_a_name_that_resolves_here_but_is_not_the_server_is_refused() -> None:
    # Chromium resolves evil.example to loopback, as a rebinding DNS server would.
    with (
        WebServer("--simulate", "2") as web,
        chromium("--host-resolver-rules=MAP evil.example 127.0.0.1") as driver,
    ):
        web.wait_listening()
        token = web.token()
        for path in (f"/?token={token}", "/", "/static/js/textual.js", "/ws"):
            driver.get(f"http://evil.example:{web.port}{path}")
            body = driver.find_element("tag name", "body").text
            assert "does not answer to 'evil.example:" in body, path
        assert driver.get_cookies() == []
        assert dashboards_of(web) == []
        driver.get(web.url())  # the server's own name still works
        BrowserTerminal(driver).wait_for("SIMULATED")


def test_without_a_token_the_sessions_are_capped() -> None:
    with (
        WebServer("--simulate", "2", "--no-token", "--max-sessions", "2") as web,
        chromium() as driver,
    ):
        web.wait_listening()
        url = web.url()
        for n in (1, 2):
            if n > 1:
                new_tab(driver)
            driver.get(url)
            BrowserTerminal(driver).wait_for("SIMULATED")
            assert len(sessions_of(web)) == n
        new_tab(driver)
        driver.get(url)
        events = wait_until(
            lambda: driver.execute_script("return window.__gs.events.slice()") or None,
            "the third socket answered",
        )
        assert events == ["close"]  # refused before a dashboard was started
        assert len(sessions_of(web)) == 2
        driver.close()  # the refused tab
        driver.switch_to.window(driver.window_handles[0])
        driver.close()  # a served one: its session ends and a new one fits
        driver.switch_to.window(driver.window_handles[0])
        wait_until(lambda: len(sessions_of(web)) == 1, "the closed tab's dashboard ended")
        new_tab(driver)
        driver.get(url)
        BrowserTerminal(driver).wait_for("SIMULATED")
        assert len(sessions_of(web)) == 2
