"""The runs screen's panes are widgets handed a RunsUI: each works on its own,
in any app, with nothing but what it is given."""

from __future__ import annotations

import time
from pathlib import Path

from textual.app import App, ComposeResult
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import OptionList

from gpustation.runs.presets import PresetProblem, load_presets
from gpustation.runs.summary import RunSummary
from gpustation.tui.runs.controller import RunsUI
from gpustation.tui.runs.logpane import LogPane
from gpustation.tui.runs.model import RunDelta, RunView
from gpustation.tui.runs.preset_pane import PresetPane
from gpustation.tui.runs.widgets import RunLog
from gpustation.tui.widgets import LiveText

from .conftest import wait_for


class OnePane(App[None]):
    """A bare app showing one pane (no dashboard, no runs screen)."""

    def __init__(self) -> None:
        super().__init__()
        self.ui = RunsUI(self)
        self.pane: Widget | None = None

    def compose(self) -> ComposeResult:
        yield from ()

    async def show(self, pane: Widget) -> None:
        self.pane = pane
        await self.mount(pane)


def running_view(tmp_path: Path, run_id: str = "run-1") -> RunView:
    summary = RunSummary(id=run_id, preset="fake", run_dir=str(tmp_path), status="running")
    return RunView.of(summary, time.time())


async def test_the_log_pane_shows_and_follows_the_run_its_ui_selects(tmp_path: Path) -> None:
    app = OnePane()
    async with app.run_test(size=(100, 30)) as pilot:
        view = running_view(tmp_path)
        view.lines.extend(["epoch 1", "epoch 2"])
        app.ui.views[view.id] = view
        app.ui.selected = view.id
        pane = LogPane(app.ui)
        await app.show(pane)
        pane.reload()
        log = pane.query_one("#run-log", RunLog)
        assert list(log.lines) == ["epoch 1", "epoch 2"]
        assert log.border_title == "Log · run-1"
        assert pane.query_one("#run-log-hint", LiveText).plain == "following the log"
        pane.append(view, RunDelta(view.id, lines=["epoch 3"]))
        await wait_for(pilot, lambda: list(log.lines)[-1:] == ["epoch 3"])
        # Another run selected: its own lines, from the start.
        other = running_view(tmp_path, "run-2")
        other.lines.append("hello")
        app.ui.views[other.id] = other
        app.ui.selected = other.id
        pane.reload()
        assert list(log.lines) == ["hello"]


async def test_the_log_pane_waits_while_its_screen_is_covered(tmp_path: Path) -> None:
    app = OnePane()
    async with app.run_test(size=(100, 30)) as pilot:
        view = running_view(tmp_path)
        app.ui.views[view.id] = view
        app.ui.selected = view.id
        pane = LogPane(app.ui)
        await app.show(pane)
        pane.reload()
        await app.push_screen(ModalScreen())
        await pilot.pause()
        view.lines.append("while covered")
        pane.append(view, RunDelta(view.id, lines=["while covered"]))
        assert pane.dirty
        assert list(pane.query_one("#run-log", RunLog).lines) == []


async def test_the_preset_pane_lists_what_its_ui_has_read(
    pilot_size: tuple[int, int] = (100, 30),
) -> None:
    presets, _ = load_presets()
    app = OnePane()
    async with app.run_test(size=(100, 30)) as pilot:
        pane = PresetPane(app.ui)
        await app.show(pane)
        pane.show_presets()
        problems = pane.query_one("#runs-problems", LiveText)
        assert "reading the presets" in problems.plain
        app.ui.presets = presets
        app.ui.problems = [PresetProblem("/p/broken.toml", "unknown key", line=3, key="lr")]
        pane.show_presets()
        options = pane.query_one("#runs-presets", OptionList)
        assert options.option_count == len(presets)
        assert "broken.toml:3 [lr] unknown key" in problems.plain
        first = next(iter(presets.values()))
        assert pane.highlighted_preset() is first
        options.focus()
        await pilot.press("down")
        await wait_for(pilot, lambda: pane.highlighted_preset() is list(presets.values())[1])
        second = list(presets.values())[1]
        info = pane.query_one("#runs-preset-info", LiveText).plain
        assert f"{second.launcher}:" in info


async def test_a_run_found_going_while_it_starts_keeps_its_view_when_its_launch_returns(
    tmp_path: Path,
) -> None:
    """A pass may find a run just launched here before the launch returns: the view
    it made, followed and holding the log read so far, stays the run's view."""
    from gpustation.runs.launch.start import RunHandle
    from gpustation.runs.rundir import RunState
    from gpustation.tui.runs.controller import Launched
    from gpustation.tui.runs.model import PassResult

    app = OnePane()
    async with app.run_test(size=(100, 30)):
        found = RunSummary(id="run-1", preset="fake", run_dir=str(tmp_path), status="running")
        result = PassResult(
            deltas=[RunDelta("run-1", reset=True, lines=["step 1", "step 2"])],
            discovered=[found],
        )
        app.ui.apply(result)
        view = app.ui.views["run-1"]
        assert list(view.lines) == ["step 1", "step 2"]
        handle = RunHandle(
            id="run-1",
            run_dir=tmp_path,
            preset="fake",
            title="fake",
            gpus=[0],
            argv=["python", "train.py"],
            created_at=time.time(),
            state=RunState(id="run-1", status="running"),
        )
        assert app.ui.launched(Launched(handle)) is view
        assert app.ui.views["run-1"] is view and view.live
        assert list(view.lines) == ["step 1", "step 2"]  # what was read is still shown
        # and what the next pass reads lands on it
        ended = RunSummary(id="run-1", preset="fake", run_dir=str(tmp_path), status="succeeded")
        app.ui.apply(PassResult(deltas=[RunDelta("run-1", summary=ended, lines=["done"])]))
        assert view.status == "succeeded" and view.lines[-1] == "done"
