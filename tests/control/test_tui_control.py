"""The control screen of the dashboard: changes revert unless confirmed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from unittest.mock import ANY

import pytest
from textual.pilot import Pilot
from textual.widgets import Label, Static

from gpustation.telemetry.model import HostSample
from gpustation.tui.app import DashboardApp
from gpustation.tui.control import (
    ControlScreen,
    JournalScreen,
    KeepChangeDialog,
    PowerCapDialog,
)
from gpustation.tui.source import DataSource
from gpustation.tui.widgets import LiveText
from tests.control.conftest import RecordingSim, journal_entries
from tests.tui.conftest import control_ui, notifications, record_notifications

TIMEOUT_S = 30.0


def make_app(sim: RecordingSim) -> DashboardApp:
    source = DataSource(lambda: sim, host_source=HostSample, hostname="test-host")
    app = DashboardApp(source, refresh_s=0.25)
    record_notifications(app)
    return app


async def wait_until(pilot: Pilot[int], condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if condition():
            return
        await pilot.pause(0.05)
    app = pilot.app
    notes = notifications(app)
    pytest.fail(f"timed out waiting for {what}; notifications: {notes}")


def limits(sim: RecordingSim) -> list[float | None]:
    return [g.power_limit_w for g in sim.read_gpus([0, 1], slow=False)]


def fan_modes(sim: RecordingSim) -> set[str]:
    return {m for g in sim.read_gpus([0, 1], slow=False) for m in g.fan_control}


def curve_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("gpustation-fan-curve")]


async def open_control(pilot: Pilot[int], app: DashboardApp) -> None:
    await wait_until(pilot, lambda: app.latest is not None, "the first sample")
    await pilot.press("c")
    await wait_until(pilot, lambda: isinstance(app.screen, ControlScreen), "the control screen")


async def open_keep_dialog(pilot: Pilot[int], app: DashboardApp) -> KeepChangeDialog:
    """Wait until the keep dialog is mounted and counting down: its keys work from then."""

    def ready() -> bool:
        screen = app.screen
        return isinstance(screen, KeepChangeDialog) and "reverts by itself" in screen.countdown

    await wait_until(pilot, ready, "the keep dialog")
    dialog = app.screen
    assert isinstance(dialog, KeepChangeDialog)
    return dialog


def test_an_unconfirmed_profile_reverts_by_itself(sim: RecordingSim) -> None:
    async def scenario() -> None:
        app = make_app(sim)
        async with app.run_test(size=(160, 48)) as pilot:
            await open_control(pilot, app)
            ui = control_ui(app)
            ui.confirm_timeout_s = 1.0
            await pilot.press("3")  # balanced: 78 % power and its fan curve
            await wait_until(pilot, lambda: ("reverted", "profile balanced") in ui.events, "revert")
            assert ui.events == [("asked", "profile balanced"), ("reverted", "profile balanced")]
            assert limits(sim) == [450.0, 450.0]
            assert fan_modes(sim) == {"auto"}
            assert ui.pending is None
            assert not curve_threads()
        # It took effect at once (power, then the curve took the fans), then came back.
        entries = [(e.gpu, e.what, e.previous, e.new) for e in journal_entries()]
        assert entries[:2] == [
            (0, "power_limit", 450.0, 351.0),
            (1, "power_limit", 450.0, 351.0),
        ]
        assert any(what == "fan_speed" for _, what, _, _ in entries)
        power_back = [e for e in entries if e[1] == "power_limit"][2:]
        assert power_back == [(0, "power_limit", 351.0, 450.0), (1, "power_limit", 351.0, 450.0)]
        assert sum(what == "fan_auto" for _, what, _, _ in entries) == 4

    asyncio.run(scenario())


def test_a_confirmed_profile_stays_and_the_curve_stops_with_the_app(
    sim: RecordingSim,
) -> None:
    async def scenario() -> None:
        app = make_app(sim)
        async with app.run_test(size=(160, 48)) as pilot:
            await open_control(pilot, app)
            ui = control_ui(app)
            ui.confirm_timeout_s = 120.0  # a loaded machine must not time out the test
            await pilot.press("3")
            await open_keep_dialog(pilot, app)
            await pilot.press("y")
            await wait_until(pilot, lambda: ui.events[-1:] == [("kept", ANY)], "keep")
            assert limits(sim) == [351.0, 351.0]
            await wait_until(
                pilot, lambda: fan_modes(sim) == {"manual"}, "the curve to take the fans"
            )
            assert ui.live is not None and ui.live.curve_running
            await wait_until(pilot, lambda: bool(ui.live and ui.live.last_poll), "a curve poll")
            state = app.screen.query_one("#control-state", LiveText)
            assert "Fan curve 'balanced' running" in state.plain
        # Closing the dashboard handed the fans back; the power cap stays (it was kept).
        assert fan_modes(sim) == {"auto"}
        assert limits(sim) == [351.0, 351.0]
        assert not curve_threads()

    asyncio.run(scenario())


def test_the_deadline_reverts_while_the_ui_thread_is_frozen(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    restored = threading.Event()
    set_power_limit = sim.control.set_power_limit

    def watched(index: int, watts: float) -> None:
        set_power_limit(index, watts)
        if watts == 450.0:
            restored.set()

    monkeypatch.setattr(sim.control, "set_power_limit", watched)

    async def scenario() -> None:
        app = make_app(sim)
        async with app.run_test(size=(160, 48)) as pilot:
            await open_control(pilot, app)
            ui = control_ui(app)
            ui.confirm_timeout_s = 0.5
            await pilot.press("w", "minus", "enter")  # the change is made in a worker
            await wait_until(
                pilot, lambda: restored.is_set() or ui.pending is not None, "the change"
            )
            # Block the UI thread now (this test runs on it): no timer, no
            # dialog, no message is handled until the revert has happened.
            assert restored.wait(TIMEOUT_S), "the change was not reverted"
            assert [c for c in sim.set_calls if c[0] == "power"] == [
                ("power", 0, 440.0),
                ("power", 0, 450.0),
            ]
            # Once the UI runs again it hears of it; no dialog asks about it any more.
            await wait_until(pilot, lambda: ui.events[-1:] == [("reverted", ANY)], "the news")
            assert not isinstance(app.screen, KeepChangeDialog)
            assert ui.pending is None

    asyncio.run(scenario())


def test_quitting_during_the_countdown_reverts(sim: RecordingSim) -> None:
    async def scenario() -> None:
        app = make_app(sim)
        async with app.run_test(size=(160, 48)) as pilot:
            await open_control(pilot, app)
            ui = control_ui(app)
            ui.confirm_timeout_s = 120.0  # a loaded machine must not time out the test
            await pilot.press("2")  # quiet: 70 % and a fan curve
            await wait_until(pilot, lambda: ("asked", "profile quiet") in ui.events, "the question")
            assert limits(sim) == [315.0, 315.0]
        assert limits(sim) == [450.0, 450.0]
        assert fan_modes(sim) == {"auto"}
        assert not curve_threads()

    asyncio.run(scenario())


def test_power_cap_dialog_steps_within_the_range(sim: RecordingSim) -> None:
    async def scenario() -> None:
        app = make_app(sim)
        async with app.run_test(size=(160, 48)) as pilot:
            await open_control(pilot, app)
            ui = control_ui(app)
            ui.confirm_timeout_s = 120.0  # a loaded machine must not time out the test
            await pilot.press("g")  # select GPU 1
            await pilot.press("w")
            await wait_until(pilot, lambda: isinstance(app.screen, PowerCapDialog), "the dialog")
            dialog = app.screen
            assert isinstance(dialog, PowerCapDialog)
            assert "Valid range 150-600 W" in str(dialog.query_one("#power-range", Label).content)
            await pilot.press("minus", "minus", "minus")
            assert dialog.watts == 420.0
            for _ in range(30):  # far past the top: held at the card's maximum
                await pilot.press("plus")
            assert dialog.watts == 600.0
            await pilot.press("minus", "enter")
            await open_keep_dialog(pilot, app)
            await pilot.press("y")
            await wait_until(pilot, lambda: ui.events[-1:] == [("kept", ANY)], "keep")
        assert limits(sim) == [450.0, 590.0]
        assert sim.set_calls == [("power", 1, 590.0)]

    asyncio.run(scenario())


def test_revert_now_and_the_journal_screen(sim: RecordingSim) -> None:
    async def scenario() -> None:
        app = make_app(sim)
        async with app.run_test(size=(160, 48)) as pilot:
            await open_control(pilot, app)
            ui = control_ui(app)
            ui.confirm_timeout_s = 120.0  # a loaded machine must not time out the test
            await pilot.press("w", "minus", "enter")
            await open_keep_dialog(pilot, app)
            assert limits(sim)[0] == 440.0
            await pilot.press("n")
            await wait_until(
                pilot, lambda: (ui.last_outcome or "").startswith("reverted"), "revert"
            )
            assert limits(sim)[0] == 450.0
            await pilot.press("j")
            await wait_until(pilot, lambda: isinstance(app.screen, JournalScreen), "the journal")
            await wait_until(
                pilot,
                lambda: (
                    "440 W -> 450 W" in str(app.screen.query_one("#journal-text", Static).content)
                ),
                "the journal text",
            )

    asyncio.run(scenario())


def test_profiles_are_in_the_command_palette(sim: RecordingSim) -> None:
    async def scenario() -> None:
        app = make_app(sim)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.latest is not None, "the first sample")
            titles = [c.title for c in app.get_system_commands(app.screen)]
            for name in ("stock", "quiet", "balanced", "performance"):
                assert f"Apply profile {name}" in titles
            assert "Set power cap" in titles and "Show control journal" in titles

    asyncio.run(scenario())


def test_a_profile_from_the_palette_is_applied_by_the_control_screen(sim: RecordingSim) -> None:
    async def scenario() -> None:
        app = make_app(sim)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.latest is not None, "the first sample")
            assert app.current_mode == "dashboard"
            (apply,) = [
                c
                for c in app.get_system_commands(app.screen)
                if c.title == "Apply profile balanced"
            ]
            apply.callback()
            await open_keep_dialog(pilot, app)
            assert app.current_mode == "control"
            ui = control_ui(app)
            assert ui.pending is not None and "balanced" in ui.pending.description
            await pilot.press("n")
            await wait_until(pilot, lambda: limits(sim) == [450.0, 450.0], "the revert")

    asyncio.run(scenario())


def test_quitting_with_a_kept_curve_asks_and_can_leave_a_controller_running(
    sim: RecordingSim,
) -> None:
    from gpustation.control.fancurve import running_controllers, stop_controllers
    from gpustation.tui.control.dialogs import QuitFansDialog

    async def scenario(choice: str) -> None:
        app = make_app(sim)
        async with app.run_test(size=(160, 48)) as pilot:
            await open_control(pilot, app)
            ui = control_ui(app)
            ui.confirm_timeout_s = 120.0
            await pilot.press("3")
            await open_keep_dialog(pilot, app)
            await pilot.press("y")
            await wait_until(pilot, lambda: ui.events[-1:] == [("kept", ANY)], "keep")
            await wait_until(pilot, lambda: fan_modes(sim) == {"manual"}, "the curve")
            await pilot.press("q")
            await wait_until(pilot, lambda: isinstance(app.screen, QuitFansDialog), "the question")
            await pilot.press(choice)
            await wait_until(pilot, lambda: not app.is_running, "the dashboard to quit")

    asyncio.run(scenario("h"))
    assert fan_modes(sim) == {"auto"} and running_controllers([0, 1], True) == {}
    asyncio.run(scenario("l"))
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not running_controllers([0, 1], True) and time.monotonic() < deadline:
            time.sleep(0.1)  # polling for the controller process's lock
        assert set(running_controllers([0, 1], True)) == {0, 1}
        deadline = time.monotonic() + TIMEOUT_S
        while fan_modes(sim) != {"manual"} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fan_modes(sim) == {"manual"}  # the controller drives them now
    finally:
        stop_controllers([0, 1], True)
    assert fan_modes(sim) == {"auto"}
