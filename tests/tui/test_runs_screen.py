"""The runs screen driven through its keys: launch, follow, stop, history, re-attach, quit."""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.screen import Screen
from textual.selection import Selection
from textual.widgets import Button, Checkbox, DataTable, Input, Label, OptionList, Static
from textual.widgets._footer import FooterKey

from gpustation.runs import rundir
from gpustation.runs.launch.start import launch
from gpustation.runs.launch.stop import stop_run
from gpustation.runs.presets import load_presets
from gpustation.tui.app import DashboardApp
from gpustation.tui.modes import SCREENS_BY_MODE
from gpustation.tui.runs import (
    MAX_LOG_LINES,
    CompareScreen,
    LaunchDialog,
    LossPlot,
    QuietFooter,
    QuitRunsDialog,
    RunLog,
    RunsScreen,
    RunsTable,
    RunsUI,
    RunView,
    StopRunDialog,
    freeze_heap,
)
from gpustation.tui.widgets import LiveText

from .conftest import BUILTIN_SCREENS, runs_ui, wait_for
from .conftest import make_app as make_dashboard

pytestmark = pytest.mark.timeout(120)

PRESET, STATUS = 1, 5  # the runs table's columns (mark, preset, run, step, loss, status)
RUNS_ENTRY = next(e for e in SCREENS_BY_MODE if e.mode == "runs")


def make_app(count: int = 2) -> tuple[DashboardApp, Any]:
    """The test dashboard (deterministic simulated GPUs) with the runs screen added."""
    return make_dashboard(count=count, screens=[*BUILTIN_SCREENS, RUNS_ENTRY])


#: a training-like child: a log line and a metric event per step, eval loss every 5 steps;
#: on SIGINT it says so and exits 0, as a script that saves on Ctrl-C would
TRAINER = """\
import argparse, sys, time
from gpustation.runs.metrics import MetricsWriter

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100000)
parser.add_argument("--sleep", type=float, default=0.05)
parser.add_argument("--lr", type=float, default=0.1)
args = parser.parse_args()
print("trainer ready", flush=True)
try:
    with MetricsWriter.from_env() as metrics:
        for step in range(1, args.steps + 1):
            loss = 2.0 / step
            print(f"step {step} loss {loss:.3f}", flush=True)
            extra = {"eval_loss": loss * 1.1} if step % 5 == 0 else {}
            metrics.log(step=step, loss=loss, throughput=50.0, unit="img/s",
                        total_steps=args.steps, **extra)
            time.sleep(args.sleep)
except KeyboardInterrupt:
    print("interrupted: saving and leaving", flush=True)
    sys.exit(0)
print("trainer done", flush=True)
"""

#: prints N numbered lines as fast as it can
FLOOD = """\
import sys
n = int(sys.argv[1])
w = sys.stdout.write
for i in range(n):
    w(f"flood {i}\\n")
"""


@pytest.fixture
def presets(gpustation_dirs: dict[str, Path], tmp_path: Path) -> Iterator[dict[str, Any]]:
    """User presets running the children above, named to sort first in the list."""
    preset_dir = gpustation_dirs["config"] / "presets" / "runs"
    preset_dir.mkdir(parents=True)
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    flood = tmp_path / "flood.py"
    flood.write_text(FLOOD)
    py = sys.executable
    (preset_dir / "a-train.toml").write_text(
        f'title = "Tiny trainer"\ncommand = ["{py}", "{trainer}"]\ngpus = 1\n'
        "[args]\nsteps = 100000\nsleep = 0.05\n"
    )
    (preset_dir / "a-train2.toml").write_text(
        f'title = "Tiny trainer on GPU 1"\ncommand = ["{py}", "{trainer}"]\ngpus = [1]\n'
        "[args]\nsteps = 100000\nsleep = 0.05\n"
    )
    (preset_dir / "a-flood.toml").write_text(f'command = ["{py}", "{flood}", "30000"]\ngpus = 1\n')
    runs_root = gpustation_dirs["data"] / "runs"
    try:
        yield {"dir": preset_dir, "runs": runs_root}
    finally:
        _stop_everything(runs_root)


def _stop_everything(runs_root: Path) -> None:
    """Stop whatever a test left running; fail loudly only through the tests' asserts."""
    for state_file in runs_root.glob(f"*/{rundir.STATE_JSON}"):
        state = rundir.read_state(state_file.parent)
        if state is not None and state.active:
            try:
                stop_run(state_file.parent, grace_s=1.0, wait_s=10.0)
            except Exception:
                pass
        state = rundir.read_state(state_file.parent)
        if state is None:
            continue
        for pid in rundir.group_members(state.pgid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_pids(directory: Path) -> list[int]:
    """The supervisor and child PIDs a run directory names."""
    state = rundir.read_state(directory)
    assert state is not None
    return [p for p in (state.supervisor_pid, state.child_pid) if p]


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


def wait_gone(pids: list[int], timeout: float = 20.0) -> None:
    """Wait until none of ``pids`` runs (a supervisor exits just after recording the end)."""
    deadline = time.monotonic() + timeout
    while alive(pids):
        assert time.monotonic() < deadline, f"processes still running: {alive(pids)}"
        time.sleep(0.05)


def screen(app: DashboardApp) -> RunsScreen:
    s = app.screen
    assert isinstance(s, RunsScreen), type(s)
    return s


def log_text(app: DashboardApp) -> str:
    return "\n".join(app.screen.query_one("#run-log", RunLog).lines)


def plain(app: DashboardApp, selector: str) -> str:
    return app.screen.query_one(selector, LiveText).plain


async def open_runs(pilot: Pilot[Any]) -> RunsUI:
    """Press r and wait until the presets are listed."""
    app = pilot.app
    assert isinstance(app, DashboardApp)
    await wait_for(pilot, lambda: app.frame is not None)
    await pilot.press("r")
    assert app.current_mode == "runs"
    ui = runs_ui(app)
    await wait_for(pilot, lambda: ui.presets is not None and screen(app).is_mounted)
    await pilot.pause()
    return ui


async def highlight_preset(pilot: Pilot[Any], name: str) -> None:
    """Move the preset list's cursor to ``name`` with the arrow keys."""
    options = pilot.app.screen.query_one("#runs-presets", OptionList)
    options.focus()
    await pilot.press("home")
    for _ in range(options.option_count):
        option = options.get_option_at_index(options.highlighted or 0)
        if option.id == name:
            return
        await pilot.press("down")
    raise AssertionError(f"preset {name} not in the list")


def gpu_boxes(dialog: LaunchDialog) -> list[bool]:
    return [box.value for box in dialog.query("#launch-gpus Checkbox").results(Checkbox)]


def argv_shown(dialog: LaunchDialog) -> str:
    return str(dialog.query_one("#launch-argv", Static).render())


async def launch_by_key(pilot: Pilot[Any], name: str, **values: str) -> RunView:
    """Highlight ``name``, press l, fill the form, Enter; return the new run's view."""
    app = pilot.app
    assert isinstance(app, DashboardApp)
    ui = runs_ui(app)
    before = set(ui.views)
    await highlight_preset(pilot, name)
    await pilot.press("l")
    await wait_for(pilot, lambda: isinstance(app.screen, LaunchDialog))
    dialog = app.screen
    assert isinstance(dialog, LaunchDialog)
    for key, text in values.items():
        dialog.query_one(f"#arg-{dialog.keys.index(key)}", Input).value = text
    await pilot.press("enter")
    await wait_for(pilot, lambda: set(ui.views) - before != set(), timeout=40)
    (new,) = set(ui.views) - before
    return ui.views[new]


# ---- the screen through its keys ----------------------------------------------------------


async def test_launch_by_key_follow_log_and_curve_then_stop(presets: dict[str, Any]) -> None:
    app, _ = make_app(count=2)
    async with app.run_test(size=(160, 48)) as pilot:
        ui = await open_runs(pilot)
        await highlight_preset(pilot, "a-train")
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchDialog))
        dialog = app.screen
        assert isinstance(dialog, LaunchDialog)
        # The form lists the preset's arguments with their defaults, and the GPUs.
        assert dialog.query_one("#arg-0", Input).value == "100000"
        assert gpu_boxes(dialog) == [True, False]
        # The fields take keys; a bad value is refused inline, typed by the preset's default.
        steps = dialog.query_one("#arg-0", Input)
        await wait_for(pilot, lambda: steps.has_focus and steps.size.width >= 20)
        await pilot.press(*["backspace"] * 6, *"many")
        assert steps.value == "many"
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, LaunchDialog)
        error = str(dialog.query_one("#launch-error", Label).render())
        assert "expected a whole number" in error, error
        assert dialog.query_one("#launch", Button).disabled
        await pilot.press(*["backspace"] * 4, *"100000")
        assert not dialog.query_one("#launch", Button).disabled
        dialog.query_one("#gpu-0", Checkbox).value = False
        dialog.query_one("#gpu-1", Checkbox).value = True
        await wait_for(pilot, lambda: "CUDA_VISIBLE_DEVICES=1 " in argv_shown(dialog))
        steps.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        await wait_for(pilot, lambda: bool(ui.live_active()), timeout=40)
        (view,) = ui.live_active()
        assert view.preset == "a-train" and view.gpus == [1]
        assert ui.selected == view.id
        # The runs screen shows no GPM itself: the live run keeps it read.
        assert app.gpm_wanted()
        # Its log streams into the pane, its curve gets points, its GPU is shown.
        await wait_for(pilot, lambda: "step 12 loss" in log_text(app), timeout=40)
        assert "trainer ready" in log_text(app)
        plot = app.screen.query_one("#run-plot", LossPlot)
        await wait_for(pilot, lambda: plot.draws >= 1 and len(view.evals[0]) >= 2)
        assert len(view.losses[0]) >= 10
        header = plain(app, "#run-header")
        assert "running" in header and "/100,000" in header and "img/s" in header, header
        assert "ETA" in header and "eval loss" in header, header
        assert plain(app, "#run-gpus").startswith("GPU 1 "), plain(app, "#run-gpus")
        # The run was given the dashboard's simulated GPUs.
        run = rundir.read_run(view.run_dir) or {}
        assert run["backend"]["simulated"] is True and run["backend"]["simulate"] == 2
        pids = run_pids(view.run_dir)
        assert len(alive(pids)) == 2

        # Stop: x asks, naming the run; y confirms.
        app.screen.query_one("#runs-table", DataTable).focus()
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, StopRunDialog))
        assert view.id in str(app.screen.query_one("#stop-id", Label).render())
        await pilot.press("y")
        await wait_for(pilot, lambda: view.status == "stopped", timeout=40)
        assert "interrupted: saving and leaving" in "\n".join(view.lines)
        await wait_for(pilot, lambda: not alive(pids), timeout=20)
        await wait_for(pilot, lambda: view.id in ui.history_ids)
        table = app.screen.query_one("#runs-table", DataTable)
        assert str(table.get_cell(view.id, "status")) == "stopped"
        assert not app.gpm_wanted()  # the run ended: the runs screen needs no GPM


async def test_two_runs_at_once_and_a_finished_run_lands_in_the_history(
    presets: dict[str, Any],
) -> None:
    app, _ = make_app(count=2)
    async with app.run_test(size=(160, 48)) as pilot:
        ui = await open_runs(pilot)
        long = await launch_by_key(pilot, "a-train2")
        short = await launch_by_key(pilot, "a-train", steps="6", sleep="0.01")
        assert long.gpus == [1] and short.gpus == [0]
        await wait_for(pilot, lambda: short.status == "succeeded", timeout=40)
        assert long.active
        await wait_for(pilot, lambda: short.id in ui.history_ids, timeout=20)
        table = app.screen.query_one("#runs-table", DataTable)
        rows = [str(table.get_row_at(i)[PRESET]) for i in range(table.row_count)]
        status = {
            str(table.get_row_at(i)[PRESET]) + str(i): str(table.get_row_at(i)[STATUS])
            for i in range(table.row_count)
        }
        # Active first, then the history.
        assert rows[:2] == ["a-train2", "a-train"], rows
        assert "succeeded" in status.values() and "running" in status.values(), status
        # Selecting the finished run shows its whole log and its final figures.
        table.focus()
        await pilot.press("end")  # (follows the log: the table keeps its row)
        table.move_cursor(row=1)
        await wait_for(pilot, lambda: ui.selected == short.id)
        await wait_for(pilot, lambda: "trainer done" in log_text(app))
        assert "step 6/6" in plain(app, "#run-header")
        # Mark both and compare them side by side.
        await pilot.press("space")
        table.move_cursor(row=0)
        await pilot.pause()
        await pilot.press("space")
        await wait_for(pilot, lambda: long.marked and short.marked)
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))
        compare = app.screen
        assert isinstance(compare, CompareScreen)
        # Oldest first: the changes read from the first run launched.
        await wait_for(pilot, lambda: compare.shown == [long.id, short.id])
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        ui.stop(long)
        await wait_for(pilot, lambda: long.status == "stopped", timeout=40)


async def test_reattaches_to_a_run_started_before_and_quit_can_leave_it(
    presets: dict[str, Any],
) -> None:
    preset = load_presets()[0]["a-train"]
    handle = launch(preset, {"sleep": "0.1"}, None, simulate=2)
    pids = run_pids(handle.run_dir)
    app, _ = make_app(count=2)
    async with app.run_test(size=(160, 48)) as pilot:
        ui = await open_runs(pilot)
        await wait_for(pilot, lambda: handle.id in ui.views and ui.views[handle.id].live)
        view = ui.views[handle.id]
        assert view.active and view.preset == "a-train"
        await wait_for(pilot, lambda: ui.selected == handle.id)
        # It follows the log from the start, and keeps following.
        await wait_for(pilot, lambda: "trainer ready" in log_text(app), timeout=30)
        seen = view.summary.steps or 0
        await wait_for(pilot, lambda: (view.summary.steps or 0) > seen + 2, timeout=30)

        # q asks; Cancel keeps the dashboard; Leave quits and the run goes on.
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, QuitRunsDialog))
        question = str(app.screen.query_one("#quit-question", Label).render())
        assert question == "Stop 1 run or leave it running?", question
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        assert app.is_running
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, QuitRunsDialog))
        await pilot.press("l")
        await wait_for(pilot, lambda: not app.is_running)
    state = rundir.read_state(handle.run_dir)
    assert state is not None and state.active
    assert len(alive(pids)) == 2
    final = stop_run(handle.run_dir, grace_s=2.0)
    assert final is not None and final.status == "stopped"
    wait_gone(pids)


async def test_quit_can_stop_the_runs(presets: dict[str, Any]) -> None:
    app, _ = make_app(count=2)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_runs(pilot)
        view = await launch_by_key(pilot, "a-train")
        await wait_for(pilot, lambda: view.status == "running", timeout=30)
        pids = run_pids(view.run_dir)
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, QuitRunsDialog))
        await pilot.press("s")
        await wait_for(pilot, lambda: not app.is_running, timeout=60)
    state = rundir.read_state(view.run_dir)
    assert state is not None and state.status == "stopped"
    wait_gone(pids)


async def test_quit_asks_from_another_screen_too(presets: dict[str, Any]) -> None:
    app, _ = make_app(count=2)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_runs(pilot)
        view = await launch_by_key(pilot, "a-train")
        await wait_for(pilot, lambda: view.status == "running", timeout=30)
        pids = run_pids(view.run_dir)
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.current_mode == "dashboard")
        # The runs screen is not shown: it still asks, over the dashboard.
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, QuitRunsDialog))
        await pilot.press("s")
        await wait_for(pilot, lambda: not app.is_running, timeout=60)
    state = rundir.read_state(view.run_dir)
    assert state is not None and state.status == "stopped"
    wait_gone(pids)


async def test_quit_without_runs_asks_nothing(presets: dict[str, Any]) -> None:
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_runs(pilot)
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running)


async def test_a_bad_user_preset_shows_its_problem(presets: dict[str, Any]) -> None:
    (presets["dir"] / "broken.toml").write_text('command = ["x"]\nlauncher = "mpirun"\n')
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        ui = await open_runs(pilot)
        problems = plain(app, "#runs-problems")
        assert "broken.toml:2" in problems and "mpirun" in problems, problems
        # The good presets are still there.
        assert "a-train" in (ui.presets or {})


async def test_a_flood_keeps_a_bounded_log_and_scrolling_back_pauses(
    presets: dict[str, Any],
) -> None:
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_runs(pilot)
        view = await launch_by_key(pilot, "a-flood")
        log = app.screen.query_one("#run-log", RunLog)
        await wait_for(pilot, lambda: "flood 29999" in log_text(app), timeout=60)
        assert view.status == "succeeded" or view.active
        # Bounded: the pane and the run's buffer keep the last lines only.
        assert len(view.lines) == MAX_LOG_LINES
        assert log.line_count <= MAX_LOG_LINES + 1
        assert view.lines[-1] == "flood 29999" and view.lines[0] == "flood 25000"
        output = (view.run_dir / rundir.OUTPUT_LOG).read_bytes().splitlines()
        assert len(output) == 30000

        # Scrolling back pauses following; End follows again.
        log.focus()
        await pilot.press("pageup")
        await wait_for(pilot, lambda: "End to follow" in plain(app, "#run-log-hint"))
        await pilot.press("end")
        await wait_for(pilot, lambda: "End to follow" not in plain(app, "#run-log-hint"))
        assert log.follow and log.is_vertical_scroll_end


async def test_launching_is_said_in_the_run_pane_not_in_toasts(
    presets: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpustation.tui.runs import controller

    # The launch waits until the test has seen the pane say so (the controller's own
    # name for it is the one patched: it is what the launch worker calls).
    seen = threading.Event()
    real_launch = launch  # the launcher's, which the controller imported
    held: list[bool] = []

    def slow_launch(*args: Any, **kwargs: Any) -> Any:
        held.append(True)
        assert seen.wait(30), "the test never released the launch"
        return real_launch(*args, **kwargs)

    monkeypatch.setattr(controller, "launch", slow_launch)
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        ui = await open_runs(pilot)
        await highlight_preset(pilot, "a-train")
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchDialog))
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        await wait_for(pilot, lambda: "Launching a-train…" in plain(app, "#run-header"))
        await wait_for(pilot, lambda: bool(held))  # the launch is held, not already done
        seen.set()
        await wait_for(pilot, lambda: bool(ui.live_active()), timeout=40)
        (view,) = ui.live_active()
        await wait_for(pilot, lambda: view.id in plain(app, "#run-header"))
        assert "Launching" not in plain(app, "#run-header")
        assert plain(app, "#run-gpus").startswith("GPU 0 ")
        # Nothing was said in a toast (each one mounts and unmounts widgets).
        assert not list(app._notifications)
        ui.stop(view)
        await wait_for(pilot, lambda: view.status == "stopped", timeout=40)


async def test_the_footer_is_not_rebuilt_when_a_dialog_closes(presets: dict[str, Any]) -> None:
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_runs(pilot)
        footer = app.screen.query_one(QuietFooter)
        await wait_for(pilot, lambda: bool(footer.query(FooterKey)))
        keys = list(footer.query(FooterKey))
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchDialog))
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        await pilot.pause()
        await pilot.pause()
        # The same keys: the same widgets, not a rebuilt footer.
        assert list(footer.query(FooterKey)) == keys
        assert all(key.is_attached for key in keys)
        # Keys that change (the log pane takes focus: its own bindings) rebuild it.
        app.screen.query_one("#run-log", RunLog).focus()
        await wait_for(pilot, lambda: list(footer.query(FooterKey)) != keys)


async def test_opening_the_runs_screen_freezes_the_heap(presets: dict[str, Any]) -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_runs(pilot)
        await wait_for(pilot, lambda: gc.get_freeze_count() > 0)
        # Once per process: a second screen or call leaves it alone.
        assert freeze_heap() is False


# ---- the log pane ------------------------------------------------------------------------


class LogApp(App[None]):
    """A log pane alone, 60x12, counting the screen's layouts."""

    def __init__(self, max_lines: int = 100) -> None:
        super().__init__()
        self.max_lines = max_lines
        self.layouts = 0
        self.changes = 0

    def compose(self) -> ComposeResult:
        yield RunLog(self._changed, max_lines=self.max_lines)

    def _changed(self) -> None:
        self.changes += 1


def count_layouts(monkeypatch: pytest.MonkeyPatch, app: LogApp | TableApp) -> None:
    real = Screen._refresh_layout

    def counted(self: Screen[Any], *args: Any, **kwargs: Any) -> None:
        app.layouts += 1
        real(self, *args, **kwargs)

    monkeypatch.setattr(Screen, "_refresh_layout", counted)


def row_text(log: RunLog, y: int) -> str:
    return "".join(segment.text for segment in log.render_line(y)).rstrip()


async def test_log_pane_keeps_the_last_lines_and_takes_them_without_relayout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = LogApp(max_lines=100)
    count_layouts(monkeypatch, app)
    async with app.run_test(size=(60, 12)) as pilot:
        log = app.query_one(RunLog)
        log.write_line("first")
        await pilot.pause()
        log.show_end()
        await pilot.pause()
        before = app.layouts
        for batch in range(5):
            log.write_lines(f"line {batch}-{i}" for i in range(70))
            log.show_end()
            await pilot.pause()
        # Growing and then full: the pane never asked for the screen to be laid out.
        assert app.layouts == before
        assert log.line_count == 100
        assert log.lines[0] == "line 3-40" and log.lines[-1] == "line 4-69"
        assert log.virtual_size.height == 100 and log.max_scroll_y > 0
        # Following: the last row on screen is the last line written.
        assert log.is_vertical_scroll_end
        assert row_text(log, log.scrollable_content_region.height - 1) == "line 4-69"
        # Another run's lines replace these in one step.
        log.replace(["a", "b"])
        await pilot.pause()
        assert list(log.lines) == ["a", "b"] and log.max_scroll_y == 0
        assert row_text(log, 0) == "a" and row_text(log, 2) == ""


async def test_log_pane_draws_tabs_and_control_characters_safely() -> None:
    app = LogApp()
    async with app.run_test(size=(60, 12)) as pilot:
        log = app.query_one(RunLog)
        log.write_lines(["a\tb", "bell\x07 esc\x1b[31m red", "wide " + "x" * 100])
        await pilot.pause()
        assert row_text(log, 0) == "a       b"
        assert row_text(log, 1) == "bell\ufffd esc red"  # the escape sequence is removed whole
        # A line wider than the pane can be scrolled to sideways.
        assert log.virtual_size.width >= 105 and log.max_scroll_x > 0
        # What a mouse selection copies is the text written.
        assert log.get_selection(Selection(None, None)) == (
            "a\tb\nbell\x07 esc\x1b[31m red\n" + "wide " + "x" * 100,
            "\n",
        )


async def test_log_pane_scrolling_back_stops_following_and_scrolling_down_resumes() -> None:
    app = LogApp()
    async with app.run_test(size=(60, 12)) as pilot:
        log = app.query_one(RunLog)
        log.focus()
        log.write_lines(f"line {i}" for i in range(50))
        log.show_end()
        await pilot.pause()
        assert log.follow
        await pilot.press("pageup")
        assert not log.follow and app.changes == 1
        await pilot.press("end")
        await wait_for(pilot, lambda: log.follow)
        assert app.changes == 2


class TableApp(App[None]):
    """The runs table alone, sized by the stylesheet as on the runs screen."""

    CSS = "RunsTable { height: 1fr; }"

    def __init__(self) -> None:
        super().__init__()
        self.layouts = 0

    def compose(self) -> ComposeResult:
        yield RunsTable(cursor_type="row")


async def test_runs_table_takes_rows_without_relayout(monkeypatch: pytest.MonkeyPatch) -> None:
    app = TableApp()
    count_layouts(monkeypatch, app)
    async with app.run_test(size=(60, 12)) as pilot:
        table = app.query_one(RunsTable)
        table.add_columns("run", "status")
        for i in range(20):
            table.add_row(f"run {i}", "done")
        await pilot.pause()
        assert table.show_vertical_scrollbar
        before = app.layouts
        for i in range(20, 30):
            table.add_row(f"run {i}", "running")
        await pilot.pause()
        assert app.layouts == before
        # The scrollbar knows the new rows: the last one can be reached and is shown.
        assert table.vertical_scrollbar.window_virtual_size == 31
        table.move_cursor(row=29, animate=False)
        await pilot.pause()
        assert table.scroll_y == table.max_scroll_y > 0
        assert table.is_vertical_scroll_end


async def test_the_screen_reads_finished_and_lost_runs_without_writing(
    presets: dict[str, Any],
) -> None:
    from gpustation.runs.launch.stop import wait_for_end
    from gpustation.runs.store.index import RunStore
    from tests.runs.test_readers import snapshot

    all_presets, _ = load_presets()
    done = launch(all_presets["a-train"], {"steps": "3", "sleep": "0.01"})
    lost = launch(all_presets["a-train"], {"steps": "3", "sleep": "0.01"})
    for handle in (done, lost):
        final = wait_for_end(handle.run_dir, 40)
        assert final is not None and final.status == "succeeded"
        wait_gone(run_pids(handle.run_dir))
    # As if the machine had restarted mid-run: files and row say running, no process is left.
    running = rundir.read_state(lost.run_dir)
    assert running is not None and lost.state is not None
    running.status, running.ended_at, running.exit_code = "running", None, None
    running.supervisor_pid = lost.state.supervisor_pid
    running.supervisor_create_time = lost.state.supervisor_create_time
    rundir.write_state(lost.run_dir, running)
    rundir.prepare_exit_status(lost.run_dir)  # no end written there either
    row = RunStore().get(lost.id)
    assert row is not None
    row.status = "running"
    RunStore().upsert(row)
    before = snapshot([done.run_dir, lost.run_dir])

    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        ui = await open_runs(pilot)
        await wait_for(pilot, lambda: {done.id, lost.id} <= set(ui.history_ids))
        await wait_for(pilot, lambda: ui.views[lost.id].status == "lost")
        table = app.screen.query_one("#runs-table", DataTable)
        table.focus()
        for run_id in (done.id, lost.id):
            table.move_cursor(row=table.get_row_index(run_id))

            def selected(run_id: str = run_id) -> bool:
                return ui.selected == run_id

            await wait_for(pilot, selected)
            await wait_for(pilot, lambda: "trainer done" in log_text(app))
        assert str(table.get_cell(lost.id, "status")) == "lost"
    assert snapshot([done.run_dir, lost.run_dir]) == before
