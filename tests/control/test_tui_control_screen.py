"""What the control screen shows while a change waits to be kept, and after a revert."""

from __future__ import annotations

import asyncio
from typing import Any

from textual.screen import Screen

from gpustation.telemetry.model import HostSample
from gpustation.tui.app import DashboardApp
from gpustation.tui.control import KeepChangeDialog
from gpustation.tui.source import DataSource
from gpustation.tui.widgets import LiveText
from tests.control.conftest import RecordingSim
from tests.control.test_tui_control import open_control, open_keep_dialog, wait_until
from tests.tui.conftest import control_ui


def gpu_lines(app: DashboardApp) -> str:
    """The control screen's GPU lines, read while a dialog may be above it."""
    screen: Screen[Any] = next(s for s in reversed(app.screen_stack) if not s.is_modal)
    return screen.query_one("#control-gpus", LiveText).plain


def test_the_screen_behind_the_keep_dialog_shows_the_new_limit_and_the_revert_reads_forwards(
    sim: RecordingSim,
) -> None:
    async def scenario() -> None:
        source = DataSource(lambda: sim, host_source=HostSample, hostname="test-host")
        # Slow sampling: what the screen shows must not wait for the next scheduled pass.
        app = DashboardApp(source, refresh_s=10.0)
        async with app.run_test(size=(160, 48)) as pilot:
            await open_control(pilot, app)
            ui = control_ui(app)
            ui.confirm_timeout_s = 120.0  # a loaded machine must not time out the test
            assert "GPU 0" in gpu_lines(app) and "power limit 450 W" in gpu_lines(app)
            await pilot.press("w", "minus", "enter")
            await open_keep_dialog(pilot, app)
            await wait_until(
                pilot, lambda: "power limit 440 W" in gpu_lines(app), "the new limit behind"
            )
            assert isinstance(app.screen, KeepChangeDialog)  # still asking
            await pilot.press("n")
            await wait_until(pilot, lambda: ui.last_outcome is not None, "the revert")
            assert ui.last_outcome == "reverted GPU 0 power limit to 450 W (from 440 W)"
            await wait_until(
                pilot, lambda: "power limit 440 W" not in gpu_lines(app), "the old limit back"
            )
            assert "power limit 450 W" in gpu_lines(app).split("GPU 1")[0]

    asyncio.run(scenario())


def test_a_reverted_limit_is_said_as_what_it_went_back_to(sim: RecordingSim) -> None:
    from gpustation.control.live import LiveControl

    live = LiveControl(sim, [0, 1], confirm_timeout_s=120.0)
    try:
        change = live.set_power_limit(0, 400.0)
        assert change.description == "GPU 0 power limit 450 W -> 400 W"
        assert change.reverted_text == "GPU 0 power limit to 450 W (from 400 W)"
    finally:
        live.close()
