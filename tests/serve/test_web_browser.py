"""``gpustation web`` in a real browser: headless Chromium through chromedriver.

textual-serve draws the terminal with xterm.js on a canvas, so the page has no
text to read. The test reads what the browser itself received: a script added
before the page's own wraps its WebSocket and keeps every byte of terminal
output, and pyte (a terminal emulator) turns those bytes into the screen the
canvas shows. Keys go the way a user's do: typed into xterm's input, sent by
the page over its websocket to the dashboard.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil
import pytest

from gpustation.control import journal
from gpustation.telemetry.sim import SimBackend, machine_path
from tests.tools import missing, tool

from .webserver import WebServer

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

try:
    import pyte
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError as err:  # pragma: no cover - the test extra installs them
    selenium_missing: str | None = f"{err.name} (pip install '.[test]')"
else:
    selenium_missing = None

WAIT_S = 90.0

#: keeps the terminal bytes the page receives, and the size it asked for
CAPTURE = """
(() => {
  const Native = window.WebSocket;
  const gs = (window.__gs = { bytes: [], size: null, events: [] });
  function Capturing(url, protocols) {
    const ws = protocols === undefined ? new Native(url) : new Native(url, protocols);
    ws.addEventListener("open", () => gs.events.push("open"));
    ws.addEventListener("close", () => gs.events.push("close"));
    const query = new URL(url).searchParams;
    gs.size = [Number(query.get("width")), Number(query.get("height"))];
    ws.addEventListener("message", (event) => {
      if (typeof event.data !== "string") {
        const bytes = new Uint8Array(event.data);
        for (let i = 0; i < bytes.length; i++) gs.bytes.push(bytes[i]);
      }
    });
    const send = ws.send.bind(ws);
    ws.send = (data) => {
      try {
        const message = JSON.parse(data);
        if (message[0] === "resize") gs.size = [message[1].width, message[1].height];
      } catch (err) {}
      send(data);
    };
    return ws;
  }
  Capturing.prototype = Native.prototype;
  window.WebSocket = Capturing;
})();
"""
TAKE = (
    "const g = window.__gs; const b = g ? g.bytes : []; if (g) g.bytes = []; "
    "return [b, g ? g.size : null];"
)


class BrowserTerminal:
    """The dashboard as the browser shows it: its screen text, and keys typed into it."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.screen: Any = None
        self.stream: Any = None

    def text(self) -> str:
        data, size = self.driver.execute_script(TAKE)
        if size is None or not size[0]:
            return ""
        columns, lines = int(size[0]), int(size[1])
        if self.screen is None:
            self.screen = pyte.Screen(columns, lines)
            self.stream = pyte.ByteStream(self.screen)
        elif (self.screen.columns, self.screen.lines) != (columns, lines):
            self.screen.resize(lines, columns)
        self.stream.feed(bytes(data))
        return "\n".join(self.screen.display)

    def wait_for(self, *needles: str, timeout: float = WAIT_S) -> str:
        """The screen once it shows every one of ``needles``."""
        try:
            WebDriverWait(self.driver, timeout, poll_frequency=0.2).until(
                lambda _: all(n in self.text() for n in needles)
            )
        except TimeoutException:
            raise AssertionError(f"never on screen: {needles}\n{self.text()}") from None
        return self.text()

    def press(self, keys: str) -> None:
        box = self.driver.find_element(By.CSS_SELECTOR, ".xterm-helper-textarea")
        box.send_keys(keys)


@contextmanager
def chromium(*args: str) -> Iterator[Any]:
    """Headless Chromium with the terminal capture on every page; ``args`` added."""
    if selenium_missing is not None:
        missing(selenium_missing)
    binary = tool("chromium", "apt install chromium")
    chromedriver = tool("chromedriver", "apt install chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", *args):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,1000")
    browser = webdriver.Chrome(service=Service(chromedriver), options=options)
    browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CAPTURE})
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def driver() -> Iterator[Any]:
    with chromium() as browser:
        yield browser


def power_limits() -> list[float | None]:
    """The simulated cards' power limits, from the state the served dashboards share."""
    sim = SimBackend(count=2, card="rtx4090", state_path=machine_path("rtx4090", 2))
    return [g.power_limit_w for g in sim.read_gpus([0, 1], slow=False)]


def dashboards_of(web: WebServer) -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process(web.proc.pid).children(recursive=True)
        if "gpustation" in " ".join(p.cmdline())
    ]


def wait_gone(processes: list[psutil.Process], timeout: float = 60.0) -> None:
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    assert not alive, f"dashboards left running: {alive}"


def test_the_served_dashboard_is_read_only_in_the_browser(driver: Any) -> None:
    with WebServer("--simulate", "2") as web:
        web.wait_listening()
        url = web.url()
        before = power_limits()

        driver.get(web.base + "/")  # no token: refused, and nothing is started
        assert "needs its token" in driver.find_element(By.TAG_NAME, "body").text
        assert dashboards_of(web) == []

        driver.get(url)
        term = BrowserTerminal(driver)
        term.wait_for("SIMULATED", "READ-ONLY", "GPU 0 RTX 4090", "GPU 1 RTX 4090")
        served = dashboards_of(web)
        assert served and any("--read-only" in p.cmdline() for p in served)

        term.press("c")
        term.wait_for("Profiles", "power limit 450 W")
        term.press("w")
        term.wait_for("read-only: no power-limit changes")
        term.press("3")  # the balanced profile
        term.wait_for("read-only: no power, fan or profile changes")
        assert "Power cap for GPU" not in term.text()
        assert power_limits() == before == [450.0, 450.0]
        assert list(journal.read_entries()) == []
        assert web.stop() == 0
    wait_gone(served)


def test_with_allow_control_the_browser_sets_a_power_limit(driver: Any) -> None:
    from gpustation.tui.control.dialogs import POWER_STEP_W

    lowered = 450.0 - POWER_STEP_W
    with WebServer("--simulate", "2", "--allow-control") as web:
        web.wait_listening()
        driver.get(web.url())
        term = BrowserTerminal(driver)
        term.wait_for("SIMULATED", "GPU 0 RTX 4090")
        assert "READ-ONLY" not in term.text()
        term.press("c")
        term.wait_for("Profiles", "power limit 450 W")
        term.press("w")
        term.wait_for("Power cap for GPU 0", "(now 450 W)")
        term.press("-")
        term.wait_for(f"{lowered:g} W (")
        term.press(Keys.ENTER)
        term.wait_for("reverts by itself")
        term.press("y")
        WebDriverWait(driver, WAIT_S, poll_frequency=0.2).until(
            lambda _: power_limits()[0] == lowered
        )
        term.wait_for(f"Last: kept GPU 0 power limit 450 W -> {lowered:g} W")
        assert power_limits()[1] == 450.0
        assert [(e.gpu, e.what, e.new) for e in journal.read_entries()] == [
            (0, "power_limit", lowered)
        ]
