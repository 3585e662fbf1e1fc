"""Fixtures for the dashboard tests: deterministic simulated GPUs and a fixed host."""

from __future__ import annotations

import asyncio
import html
import inspect
import re
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from textual.pilot import Pilot

from gpustation.telemetry.model import HostSample
from gpustation.telemetry.sim import SimBackend
from gpustation.tui.app import DashboardApp
from gpustation.tui.control import ControlScreen, ControlUI
from gpustation.tui.modes import SCREENS_BY_MODE
from gpustation.tui.runs import RunsScreen, RunsUI
from gpustation.tui.source import DataSource

START = 1_000_000.0
BUILTIN_SCREENS = [
    e for e in SCREENS_BY_MODE if e.mode in ("dashboard", "topology", "alerts", "help")
]


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests in a fresh event loop (no async plugin needed)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(pyfuncitem.obj(**{n: pyfuncitem.funcargs[n] for n in names}))
    return True


_NOTES: weakref.WeakKeyDictionary[Any, list[str]] = weakref.WeakKeyDictionary()


def record_notifications(app: Any) -> list[str]:
    """Keep the text of every notification ``app`` shows (through its public ``notify``)."""
    notes = _NOTES.get(app)
    if notes is None:
        notes = _NOTES[app] = []
        shown = app.notify

        def notify(message: str, *args: Any, **kwargs: Any) -> None:
            notes.append(str(message))
            shown(message, *args, **kwargs)

        app.notify = notify
    return notes


def notifications(app: Any) -> list[str]:
    """The notifications ``app`` has shown (recorded from its start by ``make_app``)."""
    return list(_NOTES.get(app, []))


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, t: float = START) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def fixed_host() -> HostSample:
    return HostSample(
        cpu_pct=37.5,
        cpu_per_core_pct=[12.0, 88.0, 40.0, 5.0, 60.0, 33.0, 97.0, 20.0] * 2,
        load_avg=[3.1, 2.7, 2.2],
        memory_used_mib=41_200.0,
        memory_total_mib=128_800.0,
        swap_used_mib=0.0,
        swap_total_mib=8192.0,
        disk_read_bytes_s=12_500_000.0,
        disk_write_bytes_s=3_400_000.0,
        net_rx_bytes_s=1_250_000.0,
        net_tx_bytes_s=88_000.0,
    )


class RealLookingSim(SimBackend):
    """Simulated GPUs reported as real, to exercise the kill path with a fake kill."""

    simulated = False


def make_app(
    count: int = 2,
    card: str = "rtx4090",
    clock: Callable[[], float] | None = None,
    backend_cls: type[SimBackend] = SimBackend,
    prefill: int = 0,
    **kwargs: Any,
) -> tuple[DashboardApp, SimBackend]:
    """An app on in-memory simulated GPUs with a fixed host, hostname and clock.

    ``prefill`` fills the history with that many one-second samples before the
    app starts, from a second backend with the same seed.
    """
    clk = clock or Clock()
    backend = backend_cls(count=count, card=card, seed=0, state_path=None, clock=clk)
    source = DataSource(lambda: backend, host_source=fixed_host, hostname="workstation", clock=clk)
    kwargs.setdefault("refresh_s", 10.0)
    # Only the dashboard's own screens: pictures and key tests must not change
    # when another screen registers itself.
    kwargs.setdefault("screens", BUILTIN_SCREENS)
    app = DashboardApp(source, **kwargs)
    record_notifications(app)
    if prefill:
        past = Clock(clk() - prefill)
        pre = SimBackend(count=count, card=card, seed=0, state_path=None, clock=past)
        pre_source = DataSource(
            lambda: pre, host_source=fixed_host, hostname="workstation", clock=past
        )
        for _ in range(prefill):
            app.history.add(pre_source.sample().snapshot)
            past.t += 1.0
    return app, backend


async def wait_for(pilot: Pilot[Any], condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll ``condition`` while the app runs; fail after ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            # What was on screen: a timeout in a loaded run says why it waited.
            shown = "\n".join(screen_lines(pilot.app))
            raise AssertionError(
                f"condition not met in {timeout:g} s on {type(pilot.app.screen).__name__}; "
                f"the screen:\n{shown}"
            )
        await pilot.pause(0.05)
    await pilot.pause()


async def first_frame(pilot: Pilot[Any]) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: app.frame is not None and bool(app.screen.query(".gpu-card")))  # type: ignore[attr-defined]
    await pilot.pause()


@pytest.fixture
def app_factory() -> Callable[..., tuple[DashboardApp, SimBackend]]:
    return make_app


def runs_ui(app: Any) -> RunsUI:
    """The runs screen's own RunsUI (the screen is in the app's stack once r is pressed)."""
    for screen in reversed(app.screen_stack):
        if isinstance(screen, RunsScreen):
            return screen.ui
    raise AssertionError(f"no runs screen in {app.screen_stack}")


def control_ui(app: Any) -> ControlUI:
    """The control screen's own ControlUI (the screen is in the app's stack once c is pressed)."""
    for screen in reversed(app.screen_stack):
        if isinstance(screen, ControlScreen):
            return screen.ui
    raise AssertionError(f"no control screen in {app.screen_stack}")


_SVG_TEXT = re.compile(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>')
#: the cell size Rich's SVG export draws with (rich.console.Console.export_svg)
_CELL_W, _LINE_H, _BASELINE = 20 * 0.61, 20 * 1.22, 20


def screen_lines(app: Any) -> list[str]:
    """The screen as drawn, a string per row: the text of ``app.export_screenshot()``
    put back at its cells (what a user sees, dialogs over their screen included)."""
    rows: dict[int, dict[int, str]] = {}
    for m in _SVG_TEXT.finditer(app.export_screenshot()):
        x, y = float(m.group(1)), float(m.group(2))
        text = html.unescape(m.group(3)).replace("\xa0", " ")
        rows.setdefault(round((y - _BASELINE) / _LINE_H), {})[round(x / _CELL_W)] = text
    height = app.size[1]
    out = []
    for row in range(height):
        line = ""
        for column, text in sorted(rows.get(row, {}).items()):
            line = line.ljust(column)[:column] + text
        out.append(line.rstrip())
    return out


def screen_text(app: Any) -> str:
    return "\n".join(screen_lines(app))
