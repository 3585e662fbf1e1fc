"""The dashboard's screens as modes: factory functions, loaded when first shown."""

from __future__ import annotations

import subprocess
import sys

from gpustation.tui.modes import SCREENS_BY_MODE, ScreenEntry, runs_screen
from gpustation.tui.runs import RunsScreen

from .conftest import BUILTIN_SCREENS, make_app, wait_for

# A dashboard built and asked for its keys and help, as at start-up.
STARTUP = """
import sys
from gpustation.tui.app import DashboardApp
app = DashboardApp(autostart=False)
app.all_bindings()
late = ("gpustation.tui.runs", "gpustation.tui.control")
print(sorted(m for m in sys.modules if m.startswith(late)))
"""


def test_start_up_imports_neither_the_runs_nor_the_control_screen() -> None:
    result = subprocess.run(
        [sys.executable, "-c", STARTUP], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_screen_entry_names_its_class_through_a_function() -> None:
    entries = {e.mode: e for e in SCREENS_BY_MODE}
    assert entries["runs"].screen is runs_screen
    assert runs_screen() is RunsScreen


async def test_an_entry_whose_module_is_missing_is_left_out() -> None:
    missing = ScreenEntry(
        "nowhere", "z", "Nowhere", "a screen not installed", runs_screen, requires="gpustation.nope"
    )
    app, _ = make_app(screens=[*BUILTIN_SCREENS, missing])
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.frame is not None)
        assert "nowhere" not in app.MODES
        await pilot.press("z")
        assert app.current_mode == "dashboard"
        assert all(c.title != "Show nowhere" for c in app.get_system_commands(app.screen))
