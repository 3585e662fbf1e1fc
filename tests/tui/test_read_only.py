"""A read-only dashboard (``gpustation --read-only``, what ``gpustation web`` serves).

Every key that changes the machine is refused with a message that says how to
allow it, and nothing changes; the same keys on an ordinary dashboard still work.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from gpustation.runs import rundir
from gpustation.runs.launch.start import launch
from gpustation.runs.launch.stop import stop_run
from gpustation.runs.presets import load_presets
from gpustation.tui.app import DashboardApp
from gpustation.tui.control import ControlScreen, KeepChangeDialog, PowerCapDialog
from gpustation.tui.dialogs import KillDialog
from gpustation.tui.modes import SCREENS_BY_MODE
from gpustation.tui.runs import RunsScreen
from gpustation.tui.runs.dialogs import QuitRunsDialog, StopRunDialog
from gpustation.tui.runs.form import LaunchDialog
from gpustation.tui.widgets import LiveText, ProcessTable
from tests.control.conftest import RecordingSim

from .conftest import (
    BUILTIN_SCREENS,
    RealLookingSim,
    control_ui,
    first_frame,
    make_app,
    notifications,
    runs_ui,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)

EXTRA = [e for e in SCREENS_BY_MODE if e.mode in ("control", "runs")]
HOW = "start gpustation web with --allow-control"


def refusals(app: DashboardApp) -> list[str]:
    return [n for n in notifications(app) if n.startswith("read-only: ") and HOW in n]


async def refused_after(pilot: Pilot[Any], key: str, what: str) -> None:
    """Press ``key`` and wait for the read-only message naming ``what``."""
    app = pilot.app
    assert isinstance(app, DashboardApp)
    before = len(refusals(app))
    await pilot.press(key)
    await wait_for(pilot, lambda: len(refusals(app)) > before)
    assert what in refusals(app)[-1], refusals(app)[-1]


class FakeKill:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, pid: int, sig: int) -> None:
        self.calls.append((pid, sig))


@pytest.mark.parametrize("read_only", [True, False])
async def test_k_on_a_process_is_refused_only_when_read_only(read_only: bool) -> None:
    kill = FakeKill()
    app, _ = make_app(count=2, backend_cls=RealLookingSim, kill=kill, read_only=read_only)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        table = app.screen.query_one(ProcessTable)
        await wait_for(pilot, lambda: table.selected() is not None)
        banner = app.screen.query_one("#banner", LiveText).plain
        assert ("READ-ONLY" in banner) is read_only
        if read_only:
            await refused_after(pilot, "k", "no signals to processes")
            assert not isinstance(app.screen, KillDialog)
            # Through the command palette's action too, not only the key.
            app.confirm_kill(table.selected())  # type: ignore[arg-type]
            await wait_for(pilot, lambda: len(refusals(app)) == 2)
            assert not isinstance(app.screen, KillDialog)
        else:
            await pilot.press("k")
            await wait_for(pilot, lambda: isinstance(app.screen, KillDialog))
            await pilot.press("t")  # SIGTERM
            await wait_for(pilot, lambda: bool(kill.calls))
            assert refusals(app) == []
    assert (kill.calls == []) is read_only


def control_app(read_only: bool) -> tuple[DashboardApp, RecordingSim]:
    app, sim = make_app(
        count=2, backend_cls=RecordingSim, screens=[*BUILTIN_SCREENS, *EXTRA], read_only=read_only
    )
    assert isinstance(sim, RecordingSim)
    return app, sim


async def open_control(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, DashboardApp)
    await first_frame(pilot)
    await pilot.press("c")
    await wait_for(pilot, lambda: isinstance(app.screen, ControlScreen) and app.screen.is_mounted)


async def test_power_profiles_and_fans_are_refused_when_read_only() -> None:
    app, sim = control_app(read_only=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_control(pilot)
        await refused_after(pilot, "w", "no power-limit changes")
        assert not isinstance(app.screen, PowerCapDialog)
        await refused_after(pilot, "3", "no power, fan or profile changes")  # balanced
        await refused_after(pilot, "f", "no fan changes")
        # A direct call (the command palette's "Set power cap" ends here) is refused too.
        control_ui(app).set_power_limit(0, 300.0)
        await wait_for(pilot, lambda: len(refusals(app)) == 4)
        assert not isinstance(app.screen, KeepChangeDialog)
        assert control_ui(app).live is None  # no control was even opened
    assert sim.set_calls == []
    assert [g.power_limit_w for g in sim.read_gpus([0, 1], slow=False)] == [450.0, 450.0]


async def test_power_and_profiles_work_as_before_when_control_is_allowed() -> None:
    app, sim = control_app(read_only=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_control(pilot)
        await pilot.press("w")
        await wait_for(pilot, lambda: isinstance(app.screen, PowerCapDialog))
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, ControlScreen))
        control_ui(app).confirm_timeout_s = 120.0
        await pilot.press("3")
        await wait_for(pilot, lambda: isinstance(app.screen, KeepChangeDialog))
        assert ("power", 0, 351.0) in sim.set_calls
        assert refusals(app) == []


# ---- runs ---------------------------------------------------------------------------------


@pytest.fixture
def sleeper(gpustation_dirs: dict[str, Path]) -> Iterator[Any]:
    """A run started before the dashboard (a child that sleeps), stopped after the test."""
    preset_dir = gpustation_dirs["config"] / "presets" / "runs"
    preset_dir.mkdir(parents=True)
    code = "import time; print('sleeping', flush=True); time.sleep(600)"
    (preset_dir / "a-sleep.toml").write_text(
        f'title = "Sleeps"\ncommand = ["{sys.executable}", "-c", "{code}"]\ngpus = 1\n'
    )
    handle = launch(load_presets()[0]["a-sleep"], {}, None, simulate=2)
    try:
        yield handle
    finally:
        state = rundir.read_state(handle.run_dir)
        if state is not None and state.active:
            stop_run(handle.run_dir, grace_s=1.0, wait_s=10.0)


async def test_launch_stop_run_again_are_refused_and_quitting_leaves_the_run(
    sleeper: Any,
) -> None:
    app, _ = control_app(read_only=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        await pilot.press("r")
        ui = runs_ui(app)
        await wait_for(
            pilot,
            lambda: (
                isinstance(app.screen, RunsScreen)
                and ui.presets is not None
                and ui.selected == sleeper.id
            ),
        )
        await refused_after(pilot, "l", "no launching runs")
        assert not isinstance(app.screen, LaunchDialog)
        await refused_after(pilot, "g", "no launching runs")  # run again
        await refused_after(pilot, "x", "no stopping runs")
        assert not isinstance(app.screen, StopRunDialog)
        assert ui.views[sleeper.id].active and not ui.views[sleeper.id].stopping
        # q does not offer to stop the run: it quits and the run goes on.
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running)
        assert not isinstance(app.screen, QuitRunsDialog)
    state = rundir.read_state(sleeper.run_dir)
    assert state is not None and state.active


async def test_launch_and_stop_open_their_dialogs_when_control_is_allowed(sleeper: Any) -> None:
    app, _ = control_app(read_only=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        await pilot.press("r")
        ui = runs_ui(app)
        await wait_for(
            pilot,
            lambda: (
                isinstance(app.screen, RunsScreen)
                and ui.presets is not None
                and ui.selected == sleeper.id
            ),
        )
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, StopRunDialog))
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchDialog))
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        assert refusals(app) == []
