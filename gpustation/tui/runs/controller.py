"""The runs of one dashboard: the views, following, launching, stopping, quitting.

Threads: the UI thread never reads a run's files, never waits on a process
and never touches the history database. The screen's
:class:`~gpustation.tui.poll.Poller` runs :class:`~gpustation.tui.runs.poller.RunsPass`
and posts its :class:`~gpustation.tui.runs.poller.RunsPolled`; the screen
hands it to :meth:`RunsUI.apply` and re-arms the poller. Loading the presets,
launching and stopping run as Textual thread workers, each posting one typed
message with its result to the screen (below), whose handlers call back here.

A run outlives the dashboard (each has its own detached supervisor). Opening
the screen re-attaches to the runs still going (from their run directories,
checking each PID is still the run's); quitting with runs going asks whether to
stop them or leave them running.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from textual.app import App
from textual.message import Message
from textual.message_pump import MessagePump

from gpustation.errors import GpustationError
from gpustation.runs.argvalue import ArgValue
from gpustation.runs.cost import Price
from gpustation.runs.launch.start import launch
from gpustation.runs.launch.stop import stop_run, stop_runs
from gpustation.runs.presets import PresetProblem, RunPreset, load_presets
from gpustation.runs.rundir import RunState
from gpustation.runs.summary import RunSummary
from gpustation.runs.timeline import Timeline
from gpustation.tui.dash import dashboard
from gpustation.tui.poll import Poller
from gpustation.tui.readonly import refused
from gpustation.tui.runs.model import IDLE_POLL_S, POLL_S, PassResult, RunDelta, RunView
from gpustation.tui.runs.poller import RunsPass

if TYPE_CHECKING:
    from gpustation.runs.launch.start import RunHandle


# ---- what the workers post (to the screen) --------------------------------------------------


class PresetsLoaded(Message):
    def __init__(self, presets: dict[str, RunPreset], problems: list[PresetProblem]) -> None:
        super().__init__()
        self.presets = presets
        self.problems = problems


class Launched(Message):
    def __init__(self, handle: RunHandle) -> None:
        super().__init__()
        self.handle = handle


class LaunchFailed(Message):
    def __init__(self, name: str, error: str) -> None:
        super().__init__()
        self.name = name
        self.error = error


class Stopped(Message):
    def __init__(self, run_id: str, state: RunState | None) -> None:
        super().__init__()
        self.run_id = run_id
        self.state = state


class StopFailed(Message):
    def __init__(self, run_id: str, error: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.error = error


class AllStopped(Message):
    """The runs stopped on quitting have ended: the dashboard may exit."""


class RunsChanged(Message):
    """The views changed outside a pass (a run is stopping): draw them again."""

    def __init__(self, table: bool, selected: bool) -> None:
        super().__init__()
        self.table = table
        self.selected = selected


class QuitAsked(Message):
    """Quitting with these runs going: ask whether to stop them or leave them."""

    def __init__(self, views: list[RunView]) -> None:
        super().__init__()
        self.views = views


@dataclass
class Applied:
    """What a pass changed: the table, the selected run, and the selected run's new lines."""

    table: bool
    selected: bool
    #: the selected run's delta (its new log lines), None when the pass had none for it
    log: RunDelta | None = None


# ---- the runs state of one dashboard ---------------------------------------------------------


class RunsUI:
    """Owns the dashboard's runs: the views, the poll pass, launching and stopping."""

    def __init__(self, app: App[Any]) -> None:
        self.app = app
        self.dash = dashboard(app)
        self.views: dict[str, RunView] = {}
        self.history_ids: list[str] = []
        self.presets: dict[str, RunPreset] | None = None
        self.problems: list[PresetProblem] = []
        self.selected: str | None = None
        #: ``[energy]`` of config.toml (None: no price, no cost shown)
        self.price: Price | None = None
        #: where the workers' messages go (the runs screen, once it has started this)
        self.screen: MessagePump | None = None
        #: presets being launched (shown in the run pane until the run appears)
        self.launching: list[str] = []
        self.work = RunsPass()
        self.poller: Poller | None = None
        self._started = False
        self._quitting = False
        #: the quit question is on screen
        self.asking = False
        app_hooks = getattr(app, "quit_hooks", None)
        if isinstance(app_hooks, list):
            app_hooks.append(self.before_quit)
        gpm_hooks = getattr(app, "gpm_hooks", None)
        if isinstance(gpm_hooks, list):
            gpm_hooks.append(self.runs_live)  # SM and tensor activity beside a live run

    # -- the poller ----------------------------------------------------------------------
    def start(self, screen: MessagePump) -> None:
        """Start following (once): re-attach to active runs, read the history and presets."""
        self.screen = screen
        if self._started:
            return
        self._started = True
        self.poller = Poller(self.work, screen, name="gpustation-runs")
        self._worker(self._load_presets, "presets")
        self.poller.run_now()

    def rearm(self) -> None:
        """Schedule the next pass (called once a pass has been applied)."""
        if self.poller is not None:
            self.poller.schedule(POLL_S if self.work.following else IDLE_POLL_S)

    def poll_soon(self) -> None:
        """Run a pass now instead of at the end of an idle wait."""
        if self.poller is not None:
            self.poller.run_now()

    def close(self) -> None:
        """Stop the poller and close the files it holds (the dashboard is closing)."""
        self.work.close()
        if self.poller is not None:
            self.poller.close(timeout_s=0.0)
        self.screen = None

    def _worker(self, job: object, name: str) -> None:
        self.app.run_worker(job, thread=True, exit_on_error=False, group="runs", name=name)  # type: ignore[arg-type]

    def _post(self, message: Message) -> None:
        screen = self.screen
        if screen is not None:
            screen.post_message(message)  # thread-safe

    # -- applying a pass (UI thread) ------------------------------------------------------
    def apply(self, result: PassResult) -> Applied:
        """Fold a pass into the views; says what changed."""
        now = time.time()
        table_changed = False
        for message in result.errors:
            self.app.notify(message, title="Runs", severity="error", timeout=8)
        for summary in result.discovered or []:
            view = self.views.get(summary.id)
            if view is None:
                view = self.views[summary.id] = RunView.of(summary, now)
                table_changed = True
            if not view.live:
                view.live = True
                table_changed = True
        changed_selected = False
        log: RunDelta | None = None
        for delta in result.deltas:
            view = self.views.get(delta.id)
            if view is None:
                continue  # forgotten while the pass ran
            if delta.reset:
                view.unload()
                view.loaded = True
            old_status = view.status_text()
            if delta.summary is not None:
                if delta.summary.steps != view.summary.steps:
                    table_changed = True
                view.take(delta.summary, now)
            if delta.lines:
                view.dropped += delta.dropped
                view.lines.extend(delta.lines)
            if delta.losses is not None:
                view.losses = delta.losses
                view.curve_version += 1
            if delta.evals is not None:
                view.evals = delta.evals
                view.curve_version += 1
            if delta.timeline is not None:
                self._tell_slowdowns(view, delta.timeline)
                view.timeline = delta.timeline
                view.curve_version += 1
            if delta.profile is not None:
                view.profile = delta.profile
            if view.status_text() != old_status or delta.reset:
                table_changed = True
            if delta.id == self.selected:
                changed_selected = True
                log = delta
        if result.price_read and result.price != self.price:
            self.price = result.price
            table_changed = changed_selected = True
        if result.history is not None:
            self._take_history(result.history, now)
            table_changed = True
        return Applied(table_changed, changed_selected, log)

    def _tell_slowdowns(self, view: RunView, timeline: Timeline) -> None:
        """A toast for each slowdown newly seen going on in a live run."""
        for span in timeline.slowdowns[len(view.timeline.slowdowns) :]:
            if span.ongoing and view.active:
                self.app.notify(
                    f"{view.title}: {span.words}", title="Run slowed down", severity="warning"
                )

    def _take_history(self, history: list[RunSummary], now: float) -> None:
        self.history_ids = [r.id for r in history]
        for record in history:
            view = self.views.get(record.id)
            if view is None:
                self.views[record.id] = RunView.of(record, now)
                continue
            if view.live and view.active:
                continue  # the files are fresher than the row
            if record.active and not view.active:
                continue  # ended (or found lost) since the row was written
            view.take(record, now)
        known = set(self.history_ids)
        for run_id in [i for i, v in self.views.items() if not v.live and i not in known]:
            if run_id != self.selected:
                del self.views[run_id]

    # -- following ------------------------------------------------------------------
    def follow(self, view: RunView) -> None:
        """Read ``view``'s run (its log from the start) until it ends."""
        self.work.want(view.id, view.run_dir, view.active)
        view.loaded = True
        self.poll_soon()

    def select(self, run_id: str | None) -> None:
        """Show ``run_id`` in the panes; load it when it is a finished run."""
        previous = self.views.get(self.selected) if self.selected else None
        self.selected = run_id
        if previous is not None and previous.id != run_id and not previous.active:
            # A finished run no longer shown: free its log and curve.
            self.work.drop(previous.id)
            previous.unload()
        view = self.views.get(run_id) if run_id else None
        if view is not None and not view.loaded:
            self.follow(view)

    def ordered(self) -> list[RunView]:
        """Active runs (newest first), then the history (newest first)."""
        active = sorted(
            (v for v in self.views.values() if v.active),
            key=lambda v: (v.started_at or 0.0, v.id),
            reverse=True,
        )
        seen = {v.id for v in active}
        past = [self.views[i] for i in self.history_ids if i in self.views and i not in seen]
        seen.update(v.id for v in past)
        rest = sorted(
            (v for v in self.views.values() if v.id not in seen),
            key=lambda v: (v.started_at or 0.0, v.id),
            reverse=True,
        )
        return active + rest + past

    def live_active(self) -> list[RunView]:
        """Runs launched or re-attached here that are still going."""
        return [v for v in self.views.values() if v.live and v.active]

    def runs_live(self) -> bool:
        """A run launched or re-attached here is still going."""
        return bool(self.live_active())

    # -- presets ----------------------------------------------------------------------
    def _load_presets(self) -> None:
        try:
            presets, problems = load_presets()
        except Exception as err:
            presets, problems = {}, [PresetProblem("presets", f"{type(err).__name__}: {err}")]
        self._post(PresetsLoaded(presets, problems))

    def reload_presets(self) -> None:
        """Read the presets again (one was saved)."""
        self._worker(self._load_presets, "presets")

    def presets_loaded(self, message: PresetsLoaded) -> None:
        self.presets = message.presets
        self.problems = message.problems

    # -- launching ------------------------------------------------------------------
    def launch(
        self, preset: RunPreset, overrides: dict[str, ArgValue], gpus: list[int] | None
    ) -> None:
        """Launch ``preset`` in a worker; the run appears in the list once started."""
        if refused(self.app, "launching runs"):
            return
        backend = self.dash.backend
        simulate: int | None = None
        sim_card: str | None = None
        if backend is not None and backend.simulated:
            # The child sees the same simulated GPUs as the dashboard.
            simulate = int(getattr(backend, "count", -1))
            sim_card = getattr(getattr(backend, "spec", None), "key", None)

        def job() -> None:
            try:
                handle = launch(preset, overrides, gpus, simulate=simulate, sim_card=sim_card)
            except GpustationError as err:
                self._post(LaunchFailed(preset.name, str(err)))
                return
            except Exception as err:
                self._post(LaunchFailed(preset.name, f"{type(err).__name__}: {err}"))
                return
            self._post(Launched(handle))

        self._worker(job, f"launch {preset.name}")
        # Said in the run pane, not in a toast: a toast mounts (and later
        # unmounts) widgets, a relayout of the screen each, while the run starts.
        self.launching.append(preset.name)

    def launch_failed(self, message: LaunchFailed) -> None:
        self._launch_done(message.name)
        self.app.notify(
            message.error, title=f"Could not launch {message.name}", severity="error", timeout=10
        )

    def _launch_done(self, name: str) -> None:
        if name in self.launching:
            self.launching.remove(name)

    def launched(self, message: Launched) -> RunView:
        handle = message.handle
        view = self.views.get(handle.id)
        if view is None:
            view = self.views[handle.id] = RunView.of(handle.summary(), time.time())
        # else a pass found the run going while it started: that view is already
        # followed and holds what was read of it (a new one would start blank)
        view.live = True
        self._launch_done(handle.preset)
        for warning in handle.warnings:
            self.app.notify(warning, title="Runs", severity="warning", timeout=8)
        # No "started" toast: the new run is selected and its pane says where it runs.
        self.follow(view)
        return view

    # -- stopping -------------------------------------------------------------------
    def stop(self, view: RunView) -> None:
        """Stop ``view``'s run in a worker (graceful, then firm)."""
        if refused(self.app, "stopping runs"):
            return
        if not view.active:
            return
        view.stopping = True
        run_id, run_dir = view.id, view.run_dir

        def job() -> None:
            try:
                state = stop_run(run_dir, by="dashboard")
            except Exception as err:
                self._post(StopFailed(run_id, str(err)))
                return
            self._post(Stopped(run_id, state))

        self._worker(job, "stop run")
        self._post(RunsChanged(True, view.id == self.selected))

    def stop_failed(self, message: StopFailed) -> None:
        view = self.views.get(message.run_id)
        if view is not None:
            view.stopping = False
        self.app.notify(
            message.error, title=f"Could not stop {message.run_id}", severity="error", timeout=10
        )

    def stopped(self, message: Stopped) -> None:
        view = self.views.get(message.run_id)
        state = message.state
        if view is not None and state is not None:
            view.take_state(state, time.time())
        status = state.status if state is not None else "unknown"
        self.app.notify(f"Run {message.run_id}: {status}.", title="Runs")
        self.work.want_history()
        self.poll_soon()

    # -- quitting -------------------------------------------------------------------
    def before_quit(self) -> bool:
        """Asked by the app on ``q``: True when runs are going and the question was asked."""
        if self.asking:
            return True  # already asking
        if getattr(self.app, "read_only", False):
            return False  # nothing to ask: a read-only dashboard never stops runs
        active = self.live_active()
        if not active or self._quitting:
            return False

        if self.screen is None:
            return False  # nothing here to ask with
        self.asking = True
        self._post(QuitAsked(active))
        return True

    def quit_answered(self, choice: str | None, views: list[RunView]) -> None:
        """The answer to :class:`QuitAsked`: leave the runs, stop them, or go on (None)."""
        self.asking = False
        if choice == "leave":
            self.app.exit()
        elif choice == "stop":
            self._quitting = True
            self._stop_all_then_exit(views)

    def _stop_all_then_exit(self, views: list[RunView]) -> None:
        for view in views:
            view.stopping = True
        self._post(RunsChanged(True, True))
        self.app.notify(
            f"Stopping {len(views)} run{'s' if len(views) != 1 else ''}… (q again: leave them)",
            title="Runs",
            timeout=30,
        )
        run_dirs = [v.run_dir for v in views]

        def job() -> None:
            try:
                stop_runs(run_dirs, by="dashboard")
            finally:
                self._post(AllStopped())

        self._worker(job, "stop all")
