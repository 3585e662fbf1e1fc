"""The runs screen: presets, runs, and the selected run's progress, GPUs, loss curve and log.

Memory stays bounded whatever a run prints: a run keeps its last
``MAX_LOG_LINES`` log lines, its loss series are thinned to at most
``MAX_POINTS`` points, and only the active runs and the selected one are held
at all. Nothing a flood or a launch does lays the screen out again: the run
header has a fixed height, launching is said in the run pane rather than in
toasts, and the heap is frozen once the screen is up so that a full garbage
collection walks only what was made since.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.geometry import Size
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, OptionList

from gpustation import timefmt
from gpustation.runs import rundir
from gpustation.runs.compare import gpus_text
from gpustation.runs.forecast.plan import room_of
from gpustation.runs.presets import RunPreset
from gpustation.telemetry import format as fmt
from gpustation.tui.readonly import refused
from gpustation.tui.runs import prune, tidy
from gpustation.tui.runs.compare import CompareScreen
from gpustation.tui.runs.controller import (
    AllStopped,
    Launched,
    LaunchFailed,
    PresetsLoaded,
    QuitAsked,
    RunsChanged,
    RunsUI,
    StopFailed,
    Stopped,
)
from gpustation.tui.runs.detail import RunDetail
from gpustation.tui.runs.dialogs import QuitRunsDialog, StopRunDialog
from gpustation.tui.runs.form import LaunchDialog, prefill_of, preset_of
from gpustation.tui.runs.heap import freeze_heap
from gpustation.tui.runs.launch_request import LaunchRequest, Prefill
from gpustation.tui.runs.logpane import LogPane
from gpustation.tui.runs.model import (
    RUNS_TITLE,
    STATUS_STYLE,
    RunView,
    fmt_duration,
    fmt_value,
)
from gpustation.tui.runs.overlay import too_many
from gpustation.tui.runs.poller import RunsPolled
from gpustation.tui.runs.preset_pane import PresetPane
from gpustation.tui.runs.queue import QueueScreen
from gpustation.tui.runs.sweeps import SweepsScreen, sweep_of
from gpustation.tui.runs.table import RunRow, RunsTable
from gpustation.tui.runs.widgets import (
    QuietFooter,
    energy_cell,
    run_gpus,
    run_header,
)
from gpustation.tui.screens import LiveScreen
from gpustation.tui.source import Frame
from gpustation.tui.widgets import NARROW_W, SHORT_H, LiveText

#: smaller than this, the screen shows one pane at a time (o moves on): the
#: screens' narrow and short sizes
ONE_PANE_W, ONE_PANE_H = NARROW_W, SHORT_H
#: the panes shown one at a time, in the order o goes through them: the runs
#: and presets, the selected run's loss curve and log, its GPU plot
PANES = ("runs", "run", "gpus")
#: this wide and more, the runs and presets take over half the width
ROOMY_W = 200


class RunRead(Message):
    """A run's ``run.json`` (None: unreadable), read for "run again"."""

    def __init__(self, run: dict[str, Any] | None) -> None:
        super().__init__()
        self.run = run


# ---- the screen -----------------------------------------------------------------------------


class RunsScreen(LiveScreen):
    """Presets, runs and the selected run's progress, GPUs, loss curve and log."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("l", "launch", "Launch", id="runs.launch"),
        Binding("x", "stop", "Stop run", id="runs.stop"),
        Binding("space", "mark", "Mark", id="runs.mark"),
        Binding("v", "compare", "Compare", id="runs.compare"),
        Binding("g", "run_again", "Run again", id="runs.again"),
        Binding("delete", "delete", "Delete", key_display="Del", id="runs.delete"),
        Binding("n", "note", "Note", id="runs.note"),
        Binding("T", "tag", "Tag", id="runs.tag"),
        Binding("D", "prune", "Prune", id="runs.prune"),
        Binding("slash", "filter", "Filter", key_display="/", id="runs.filter"),
        Binding("end", "follow", "Follow log", priority=True, id="runs.follow"),
        Binding("P", "profile", "Profile", show=False, id="runs.profile"),
        Binding("S", "sweeps", "Sweeps", show=False, id="runs.sweeps"),
        Binding("Q", "queue", "Queue", show=False, id="runs.queue"),
        # the timeline's cursor: a sample back or on, a tenth of the run back or on
        Binding("left_square_bracket", "time(-1)", "Earlier", show=False, id="runs.earlier"),
        Binding("right_square_bracket", "time(1)", "Later", show=False, id="runs.later"),
        Binding("left_curly_bracket", "jump(-1)", "Much earlier", show=False, id="runs.jump_back"),
        Binding("right_curly_bracket", "jump(1)", "Much later", show=False, id="runs.jump_on"),
        Binding("j", "cursor(1)", "Down", show=False, id="runs.down"),
        Binding("k", "cursor(-1)", "Up", show=False, id="runs.up"),
        Binding("escape", "app.show_dashboard", "Back", id="runs.back"),
        Binding(
            "o",
            "next_pane",
            "Next pane",
            tooltip="below 100 columns or 32 rows one pane shows at a time: the runs and "
            "presets, the loss curve and log, the GPU plot",
            id="runs.pane",
        ),
    ]
    #: the views the screen opens over itself, for help: (what each is, its class)
    HELP_OVERLAYS: ClassVar[tuple[tuple[str, type[Screen[None]]], ...]] = (
        ("compare view (v)", CompareScreen),
        ("sweeps view (S)", SweepsScreen),
        ("queue view (Q)", QueueScreen),
    )
    #: the footer's keys, most needed first (see tui/footer.py)
    FOOTER_NEED = ("next_pane", "follow", "launch", "stop", "quit", "show_help", "mark", "compare")
    # Side by side: the presets and runs take 40 % of the width up to 64
    # columns (84 on a wide terminal; over half of a roomy one, for every
    # column of the runs table);
    # the run's plots and log share the rest of the height, 3 to 2. Smaller
    # than ONE_PANE_W x ONE_PANE_H, one pane fills the screen at a time (o
    # moves on): the runs and presets, the loss curve and log, the GPU plot.
    DEFAULT_CSS = """
    #runs-body { height: 1fr; }
    #runs-left { width: 40%; min-width: 36; max-width: 64; }
    #runs-presets { height: 12; border: round $panel; }
    #runs-presets:focus { border: round $accent; }
    #runs-preset-info { height: 3; padding: 0 1; color: $text-muted; }
    #runs-problems { height: auto; max-height: 6; padding: 0 1; }
    #runs-table { height: 1fr; border: round $panel; }
    #runs-table:focus { border: round $accent; }
    #runs-right { width: 1fr; }
    #run-header { height: 4; padding: 0 1; }
    #run-gpus { height: auto; padding: 0 1; }
    #run-detail { height: 3fr; }
    #run-detail.-profile { height: 1fr; }
    #run-plot { height: 3fr; min-height: 7; }
    #run-telemetry { height: 2fr; min-height: 6; }
    #run-cursor { height: 1; padding: 0 1; }
    LogPane { height: 2fr; min-height: 5; }
    #run-log { height: 1fr; border: round $panel; }
    #run-log:focus { border: round $accent; }
    #run-log-hint { height: 1; padding: 0 1; }
    RunsScreen.-profile LogPane { display: none; }
    RunsScreen.-short #runs-presets { height: 8; }
    RunsScreen.-tall #runs-presets { height: 16; }
    RunsScreen.-wide #runs-left { max-width: 84; }
    RunsScreen.-roomy #runs-left { width: 55%; max-width: 140; }
    RunsScreen.-one-pane #runs-left { width: 100%; max-width: 100%; }
    RunsScreen.-one-pane #runs-right { width: 100%; }
    RunsScreen.-one-pane #runs-presets { height: 6; }
    RunsScreen.-one-pane #runs-preset-info { display: none; }
    RunsScreen.-pane-runs #runs-right { display: none; }
    RunsScreen.-pane-run #runs-left, RunsScreen.-pane-gpus #runs-left { display: none; }
    RunsScreen.-pane-run #run-detail, RunsScreen.-pane-run LogPane { height: 1fr; }
    RunsScreen.-pane-run #run-telemetry, RunsScreen.-pane-run #run-cursor { display: none; }
    RunsScreen.-pane-run #run-plot { height: 1fr; }
    RunsScreen.-pane-gpus LogPane, RunsScreen.-pane-gpus #run-plot { display: none; }
    RunsScreen.-pane-gpus #run-detail, RunsScreen.-pane-gpus #run-telemetry { height: 1fr; }
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the screen's runs: views, poller, launching and stopping (closed on unmount)
        self.ui = RunsUI(self.app)
        # The panes, each handed the RunsUI: they read it and never reach back here.
        self.preset_pane = PresetPane(self.ui)
        self.detail = RunDetail(self.ui, id="run-detail")
        self.log_pane = LogPane(self.ui)
        self._dirty = True
        #: the runs table shows only the runs matching this (prune.matches); "" all
        self.run_filter = ""
        #: the pane shown on a small terminal (one of PANES); None: side by side
        self.pane: str | None = None

    def compose(self) -> ComposeResult:
        yield LiveText(id="banner")
        with Horizontal(id="runs-body"):
            with Vertical(id="runs-left"):
                yield self.preset_pane
                yield RunsTable(id="runs-table", cursor_type="row", zebra_stripes=False)
            with Vertical(id="runs-right"):
                # Wrapped: a long title and run id go on to the next line, never cut.
                yield LiveText(id="run-header", wrap=True)
                yield LiveText(id="run-gpus")
                yield self.detail
                yield self.log_pane
        yield LiveText(id="status")
        yield QuietFooter()

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#runs-table", DataTable).border_title = RUNS_TITLE
        self.ui.start(self)
        self.fit_panes(self.app.size)
        self.preset_pane.show_presets()
        self.runs_changed(True, True)
        self.query_one("#runs-presets", OptionList).focus()
        # Once the screen has painted: its widgets are as long-lived as the app.
        self.call_after_refresh(freeze_heap)

    def on_unmount(self) -> None:
        self.ui.close()

    def on_resize(self, event: events.Resize) -> None:
        self.fit_panes(event.size)
        # The preset lines are cut to the list's width: cut them again for the new one.
        self.call_after_refresh(self.preset_pane.show_presets)

    # -- one pane at a time on a small terminal -------------------------------------------
    def fit_panes(self, size: Size) -> None:
        """Side by side, or one pane at a time below ONE_PANE_W x ONE_PANE_H."""
        if not size.width:
            return
        self.set_class(size.width >= ROOMY_W, "-roomy")
        small = size.width < ONE_PANE_W or size.height < ONE_PANE_H
        if small == (self.pane is not None):
            return
        self.set_class(small, "-one-pane")
        # The runs and presets first: where a run is chosen or launched.
        self.show_pane(PANES[0] if small else None)
        self.refresh_bindings()  # o shows in the footer only now

    def show_pane(self, pane: str | None) -> None:
        """Show ``pane`` alone (None: every pane, side by side) and give it the focus."""
        self.pane = pane
        for name in PANES:
            self.set_class(pane == name, f"-pane-{name}")
        if pane == "runs":
            self.query_one("#runs-table", DataTable).focus()
        elif pane == "run":
            self.query_one("#run-log").focus()
        elif pane == "gpus":
            self.set_focus(None)
        # Plots hidden until now are drawn for their size once laid out.
        self.call_after_refresh(self._show_selected)

    def action_next_pane(self) -> None:
        if self.pane is not None:
            self.show_pane(PANES[(PANES.index(self.pane) + 1) % len(PANES)])

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # o moves between panes only where they are shown one at a time
        return self.pane is not None if action == "next_pane" else True

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if self.pane == "runs":
            self.show_pane("run")  # Enter on a run: its loss curve and log

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        if self._dirty:
            self.runs_changed(True, True)
        if self.log_pane.dirty:
            # Lines came while another screen or a dialog was on top.
            self.log_pane.reload()

    def show_frame(self, frame: Frame) -> None:
        if self.is_mounted:
            self._show_selected()

    # -- what the poller and the workers post --------------------------------------------
    def on_runs_polled(self, message: RunsPolled) -> None:
        try:
            applied = self.ui.apply(message.result)
            view = self.ui.views.get(applied.log.id) if applied.log is not None else None
            if view is not None and applied.log is not None:
                self.log_pane.append(view, applied.log)
            self.runs_changed(applied.table, applied.selected)
        finally:
            self.ui.rearm()  # the next pass only once this one is on screen

    def on_presets_loaded(self, message: PresetsLoaded) -> None:
        self.ui.presets_loaded(message)
        self.preset_pane.show_presets()
        self.runs_changed(True, False)  # a run's own tags are its tags less its preset's

    def on_launched(self, message: Launched) -> None:
        view = self.ui.launched(message)
        self.runs_changed(True, False, select=view.id)
        if self.pane is not None:
            self.show_pane("run")  # the run just launched, followed

    def on_launch_failed(self, message: LaunchFailed) -> None:
        self.ui.launch_failed(message)
        self.runs_changed(False, True)

    def on_stopped(self, message: Stopped) -> None:
        self.ui.stopped(message)
        self.runs_changed(True, message.run_id == self.ui.selected)

    def on_stop_failed(self, message: StopFailed) -> None:
        self.ui.stop_failed(message)
        self.runs_changed(True, message.run_id == self.ui.selected)

    def on_all_stopped(self, message: AllStopped) -> None:
        self.app.exit()

    def on_runs_changed(self, message: RunsChanged) -> None:
        self.runs_changed(message.table, message.selected)

    def on_quit_asked(self, message: QuitAsked) -> None:
        views = message.views

        def answered(choice: str | None) -> None:
            self.ui.quit_answered(choice, views)

        self.app.push_screen(QuitRunsDialog(views), answered)

    # -- presets ------------------------------------------------------------------------
    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.action_launch()

    # -- the runs table -------------------------------------------------------------------
    def _row(self, v: RunView, now: float) -> RunRow:
        started = timefmt.compact(v.started_at) if v.started_at else fmt.NA
        s = v.summary
        step = s.steps
        total = s.total_steps
        step_text = fmt.NA if step is None else (f"{step}/{total}" if total else str(step))
        cells = {
            "mark": "✓" if v.marked else "",
            "preset": v.preset or v.title or "?",
            "id": v.id,
            "step": step_text,
            "loss": fmt_value(s.final_loss),
            "status": v.status_text(),
            "energy": energy_cell(v.summary, self.ui.price),
            "time": fmt_duration(v.elapsed_s(now)) if not v.active else "",
            "gpus": gpus_text(v.summary),
            "started": started,
            "notes": tidy.notes_cell(v.summary, self.ui.presets),
        }
        return RunRow(v.id, cells, STATUS_STYLE.get(v.status, ""))

    def runs_changed(self, table: bool, selected: bool, select: str | None = None) -> None:
        """The UI has new data: redraw what is visible (or remember to, when hidden)."""
        if not self.is_mounted:
            return
        if self.app.screen is not self:
            self._dirty = True
            return
        self._dirty = False
        runs = self.query_one("#runs-table", RunsTable)
        if table or select or (self.ui.price is not None) != runs.priced:
            self._update_table(select)
        if selected or select:
            self._show_selected()
            self.log_pane.show_hint()

    def _update_table(self, select: str | None = None) -> None:
        table = self.query_one("#runs-table", RunsTable)
        now = time.time()
        views = self.ui.ordered()
        if self.run_filter:
            views = prune.filtered(views, self.run_filter)
        rows = [self._row(v, now) for v in views]
        table.show_runs(rows, self.ui.price is not None, select, self.ui.selected)
        self._sync_selection()

    def _sync_selection(self) -> None:
        table = self.query_one("#runs-table", RunsTable)
        run_id: str | None = None
        if table.row_count:
            row = min(max(table.cursor_row, 0), table.row_count - 1)
            run_id = table.row_ids[row] if row < len(table.row_ids) else None
        if run_id != self.ui.selected:
            self.ui.select(run_id)
            self.log_pane.reload()
            self._show_selected()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._sync_selection()

    def current_view(self) -> RunView | None:
        selected = self.ui.selected
        return self.ui.views.get(selected) if selected else None

    # -- the selected run -----------------------------------------------------------------
    def _show_selected(self) -> None:
        view = self.current_view()
        now = time.time()
        if self.ui.launching:
            header = Text()
            header.append(f"Launching {', '.join(self.ui.launching)}…", style="bold yellow")
            header.append("\nstarting its supervisor and process", style="dim")
            # The GPU lines and the plot stay as they are until the run appears.
            self.query_one("#run-header", LiveText).show(header)
            return
        snap = self.dash.latest
        header = run_header(view, now, self.ui.price)
        gpus = run_gpus(view, {g.index: g for g in snap.gpus} if snap is not None else {})
        # No forced relayout: LiveText asks for one itself when its line count changes.
        self.query_one("#run-header", LiveText).show(header)
        self.query_one("#run-gpus", LiveText).show(gpus)
        self.detail.show()

    # -- actions ---------------------------------------------------------------------------
    def action_launch(self) -> None:
        preset = self.preset_pane.highlighted_preset()
        if preset is None:
            self.notify("No preset selected.", severity="warning")
            return
        self.open_form(preset)

    def open_form(self, preset: RunPreset, prefill: Prefill | None = None) -> None:
        """The launch form for ``preset`` (with a past run's settings, for run again)."""
        if refused(self.app, "launching runs"):
            return
        snap = self.dash.latest
        device_count: int | None = None
        if snap is not None and snap.gpus:
            device_count = max(g.index for g in snap.gpus) + 1

        def chosen(request: LaunchRequest | None) -> None:
            if request is not None:
                self.ui.launch(request.preset, request.overrides, request.gpus)
                self.runs_changed(False, True)

        backend = self.dash.backend
        dialog = LaunchDialog(
            preset,
            device_count,
            prefill,
            saved=self.ui.reload_presets,
            # the forecast weighs the peak memory against the GPUs as last sampled
            rooms=[room_of(g) for g in snap.gpus] if snap is not None else [],
            simulated=bool(backend is not None and backend.simulated),
            price=self.ui.price,
        )
        self.app.push_screen(dialog, chosen)

    def action_run_again(self) -> None:
        """Open the launch form with the selected run's preset, arguments and GPUs."""
        if refused(self.app, "launching runs"):
            return
        view = self.current_view()
        if view is None:
            self.notify("Select a run first.", severity="warning")
            return
        run_dir = view.run_dir

        def job() -> None:
            self.post_message(RunRead(rundir.read_run(run_dir, exact=True)))

        # run.json is read off the UI thread, like every file of a run.
        self.app.run_worker(job, thread=True, exit_on_error=False, name="read run.json")

    def on_run_read(self, message: RunRead) -> None:
        run = message.run
        preset = preset_of(run or {}, self.ui.presets or {})
        if run is None or preset is None:
            self.notify("That run's run.json names no preset.", severity="warning")
            return
        self.open_form(preset, prefill_of(run))

    def action_stop(self) -> None:
        if refused(self.app, "stopping runs"):
            return
        view = self.current_view()
        if view is None or not view.active:
            self.notify("Select a running run first.", severity="warning")
            return
        if view.stopping:
            self.notify("That run is already stopping.")
            return

        def answered(stop: bool | None) -> None:
            if stop:
                self.ui.stop(view)

        self.app.push_screen(StopRunDialog(view), answered)

    def action_mark(self) -> None:
        view = self.current_view()
        if view is None:
            return
        view.marked = not view.marked
        self._update_table()

    def action_compare(self) -> None:
        marked = [v for v in self.ui.ordered() if v.marked]
        if len(marked) < 2:
            self.notify("Mark two or more runs with space, then press v.", severity="warning")
            return
        too = too_many(len(marked))
        if too is not None:
            self.notify(too, severity="warning")
            return
        # Oldest first: the changes read as "from the first run".
        marked.sort(key=lambda v: (v.started_at or 0.0, v.id))
        self.app.push_screen(CompareScreen([v.id for v in marked]))

    # Tidying the history: the dialogs and the workers live in tidy.py.
    def action_delete(self) -> None:
        if not refused(self.app, "deleting runs"):
            tidy.ask_delete(self, tidy.targets(self.ui))

    def action_note(self) -> None:
        if not refused(self.app, "notes on runs"):
            tidy.ask_note(self, self.current_view())

    def action_tag(self) -> None:
        if not refused(self.app, "tags on runs"):
            tidy.ask_tags(self, tidy.targets(self.ui), self.ui.presets)

    def on_tidied(self, message: tidy.Tidied) -> None:
        tidy.tidied(self, self.ui, message)
        self.runs_changed(True, True)

    def action_prune(self) -> None:
        if not refused(self.app, "deleting runs"):
            prune.ask_prune(self)

    def on_prune_found(self, message: prune.PruneFound) -> None:
        prune.confirm_prune(self, message)

    def action_filter(self) -> None:
        prune.ask_filter(self, self.run_filter, self.set_filter)

    def set_filter(self, text: str) -> None:
        """Show only the runs matching ``text`` ("" all); the table's title says so."""
        self.run_filter = text
        self.query_one("#runs-table", DataTable).border_title = prune.filter_title(text)
        self.runs_changed(True, False)

    # The selected run's detail and log.
    def action_follow(self) -> None:
        self.log_pane.follow()

    def action_time(self, samples: int) -> None:
        self.detail.step(samples)

    def action_jump(self, direction: int) -> None:
        self.detail.jump(direction)

    def action_profile(self) -> None:
        detail = self.detail
        detail.toggle_profile()
        if self.pane == "runs":
            self.show_pane("run")  # the profile shows where the loss curve and log do
        self.set_class(detail.profile, "-profile")  # the profile takes the log's place too

    def action_sweeps(self) -> None:
        view = self.current_view()
        self.app.push_screen(SweepsScreen(sweep_of(view.summary.tags) if view else None))

    def action_queue(self) -> None:
        self.app.push_screen(QueueScreen())

    def action_cursor(self, delta: int) -> None:
        focused = self.focused
        if isinstance(focused, OptionList):
            focused.action_cursor_down() if delta > 0 else focused.action_cursor_up()
        else:
            table = self.query_one("#runs-table", DataTable)
            table.move_cursor(row=max(0, table.cursor_row + delta), animate=False)
