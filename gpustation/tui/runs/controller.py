"""The runs of one dashboard: the views, the poll worker, launching, stopping, quitting.

Threads: the UI thread never reads a run's files, never waits on a process
and never touches the history database. One poll worker reads every followed
run, folds what it read into a :class:`~gpustation.tui.runs.model.RunDelta`
per run and hands the batch to the UI thread, which re-arms it once the batch
is applied, so passes never overlap. Launching, stopping and the history
comparison run in their own short-lived workers.

A run outlives the dashboard (each has its own detached supervisor). Opening
the screen re-attaches to the runs still going (from their run directories,
checking each PID is still the run's); quitting with runs going asks whether to
stop them or leave them running.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.timer import Timer

from gpustation.errors import GpustationError
from gpustation.runs import rundir
from gpustation.runs.presets import PresetProblem, RunPreset
from gpustation.runs.rundir import RunState
from gpustation.tui.runs.dialogs import QuitRunsDialog
from gpustation.tui.runs.model import (
    DISCOVER_EVERY_S,
    HISTORY_LIMIT,
    IDLE_POLL_S,
    POLL_S,
    PassResult,
    RunView,
)
from gpustation.tui.runs.poller import _Track

if TYPE_CHECKING:
    from gpustation.runs.launch import RunHandle
    from gpustation.tui.app import DashboardApp
    from gpustation.tui.runs.screen import RunsScreen


# ---- the runs state of one dashboard ---------------------------------------------------------


class RunsUI:
    """Owns the dashboard's runs: the views, the poll worker, launching and stopping."""

    def __init__(self, app: DashboardApp) -> None:
        self.app = app
        self.views: dict[str, RunView] = {}
        self.history_ids: list[str] = []
        self.presets: dict[str, RunPreset] | None = None
        self.problems: list[PresetProblem] = []
        self.selected: str | None = None
        self.screen: RunsScreen | None = None
        #: presets being launched (shown in the run pane until the run appears)
        self.launching: list[str] = []
        # Shared with the worker, under the lock.
        self._lock = threading.Lock()
        self._wanted: dict[str, tuple[Path, bool]] = {}
        self._unwanted: set[str] = set()
        self._want_history = True
        self._closed = False
        # Worker-only.
        self._tracks: dict[str, _Track] = {}
        self._next_discover = 0.0
        # UI-only.
        self._timer: Timer | None = None
        self._started = False
        self._quitting = False
        app_hooks = getattr(app, "quit_hooks", None)
        if isinstance(app_hooks, list):
            app_hooks.append(self.before_quit)

    # -- the poll worker -------------------------------------------------------------
    def start(self) -> None:
        """Start following (once): re-attach to active runs, read the history and presets."""
        if self._started:
            return
        self._started = True
        self.app.run_worker(
            self._load_presets, thread=True, exit_on_error=False, group="runs", name="presets"
        )
        self._poll()

    def _poll(self) -> None:
        self._timer = None
        if self._closed:
            return
        self.app.run_worker(
            self._poll_pass, thread=True, exit_on_error=False, group="runs-poll", name="runs poll"
        )

    def _poll_pass(self) -> None:
        """One pass (worker thread): read every followed run, post one batch."""
        from gpustation.runs.reconcile import list_active_runs
        from gpustation.runs.store import RunStore

        result = PassResult()
        with self._lock:
            if self._closed:
                self._close_tracks()
                return
            wanted = dict(self._wanted)
            unwanted, self._unwanted = self._unwanted, set()
            want_history, self._want_history = self._want_history, False
        for run_id in unwanted:
            track = self._tracks.pop(run_id, None)
            if track is not None:
                track.close()
        now = time.monotonic()
        if now >= self._next_discover:
            self._next_discover = now + DISCOVER_EVERY_S
            try:
                result.discovered = list_active_runs()
            except Exception as err:  # a damaged run directory must not stop the others
                result.errors.append(f"looking for active runs: {err}")
            for active in result.discovered or []:
                wanted.setdefault(active.id, (active.run_dir, True))
                with self._lock:
                    self._wanted.setdefault(active.id, (active.run_dir, True))
        for run_id, (directory, is_active) in wanted.items():
            if run_id not in self._tracks:
                self._tracks[run_id] = _Track(run_id, directory, is_active)
        ended: list[str] = []
        for run_id, track in list(self._tracks.items()):
            try:
                update = track.follower.poll()
                delta = track.digest(update)
            except Exception as err:
                result.errors.append(f"run {run_id}: {type(err).__name__}: {err}")
                ended.append(run_id)
                continue
            if delta.reset or delta.lines or delta.state or delta.figures or delta.ended:
                result.deltas.append(delta)
            if delta.ended:
                ended.append(run_id)
        for run_id in ended:
            self._tracks.pop(run_id).close()
            with self._lock:
                self._wanted.pop(run_id, None)
        if want_history or any(d.ended for d in result.deltas):
            try:
                result.history = RunStore().list_runs(limit=HISTORY_LIMIT)
            except Exception as err:
                result.errors.append(f"reading the run history: {err}")
        try:
            # Waits for the UI thread to apply it: a slow UI slows the passes down
            # instead of queueing batches (the coalescing of a log flood).
            self.app.call_from_thread(self._apply, result)
        except RuntimeError:
            pass  # the dashboard is closing

    def _close_tracks(self) -> None:
        for track in self._tracks.values():
            track.close()
        self._tracks.clear()

    def _rearm(self) -> None:
        if self._closed or not self.app.is_running:
            return
        with self._lock:
            busy = bool(self._wanted)
        self._timer = self.app.set_timer(POLL_S if busy else IDLE_POLL_S, self._poll)

    def poll_soon(self) -> None:
        """Run a pass now instead of at the end of an idle wait."""
        if self._timer is not None:
            self._timer.stop()
            self._poll()

    # -- applying a batch (UI thread) ------------------------------------------------------
    def _apply(self, result: PassResult) -> None:
        try:
            self._apply_result(result)
        finally:
            self._rearm()

    def _apply_result(self, result: PassResult) -> None:
        now = time.time()
        table_changed = False
        for message in result.errors:
            self.app.notify(message, title="Runs", severity="error", timeout=8)
        for active in result.discovered or []:
            view = self.views.get(active.id)
            if view is None:
                view = self.views[active.id] = RunView(active.id, active.run_dir)
                view.take_run(active.run)
                table_changed = True
            if not view.live:
                view.live = True
                table_changed = True
            view.take_state(active.state)
        changed_selected = False
        for delta in result.deltas:
            view = self.views.get(delta.id)
            if view is None:
                continue  # forgotten while the pass ran
            if delta.reset:
                view.unload()
                view.loaded = True
                if delta.run:
                    view.take_run(delta.run)
            old_status = view.status_text()
            if delta.state is not None:
                view.take_state(delta.state)
            if delta.figures:
                view.figures = delta.figures
                view.figures_at = now
                table_changed = True
            if delta.lines:
                view.dropped += delta.dropped
                view.lines.extend(delta.lines)
            if delta.losses is not None:
                view.losses = delta.losses
                view.curve_version += 1
            if delta.evals is not None:
                view.evals = delta.evals
                view.curve_version += 1
            if view.status_text() != old_status or delta.reset:
                table_changed = True
            if delta.id == self.selected:
                changed_selected = True
                if self.screen is not None:
                    self.screen.log_append(view, delta)
        if result.history is not None:
            self.history_ids = [r.id for r in result.history]
            for record in result.history:
                view = self.views.get(record.id)
                if view is None:
                    view = self.views[record.id] = RunView(
                        record.id, Path(record.run_dir or rundir.run_dir(record.id))
                    )
                if view.live and view.active:
                    continue  # the files are fresher than the row
                view.take_record(record)
            known = set(self.history_ids)
            for run_id in [i for i, v in self.views.items() if not v.live and i not in known]:
                if run_id != self.selected:
                    del self.views[run_id]
            table_changed = True
        if self.screen is not None:
            self.screen.runs_changed(table_changed, changed_selected)

    # -- following ------------------------------------------------------------------
    def follow(self, view: RunView) -> None:
        """Read ``view``'s run (its log from the start) until it ends."""
        with self._lock:
            self._unwanted.discard(view.id)
            self._wanted[view.id] = (view.run_dir, view.active)
        view.loaded = True
        self.poll_soon()

    def select(self, run_id: str | None) -> None:
        """Show ``run_id`` in the panes; load it when it is a finished run."""
        previous = self.views.get(self.selected) if self.selected else None
        self.selected = run_id
        if previous is not None and previous.id != run_id and not previous.active:
            # A finished run no longer shown: free its log and curve.
            with self._lock:
                self._wanted.pop(previous.id, None)
                self._unwanted.add(previous.id)
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

    # -- presets ----------------------------------------------------------------------
    def _load_presets(self) -> None:
        from gpustation.runs.presets import load_presets

        try:
            presets, problems = load_presets()
        except Exception as err:
            presets, problems = {}, [PresetProblem("presets", f"{type(err).__name__}: {err}")]
        try:
            self.app.call_from_thread(self._presets_loaded, presets, problems)
        except RuntimeError:
            pass

    def _presets_loaded(self, presets: dict[str, RunPreset], problems: list[PresetProblem]) -> None:
        self.presets = presets
        self.problems = problems
        if self.screen is not None:
            self.screen.show_presets()

    # -- launching ------------------------------------------------------------------
    def launch(self, preset: RunPreset, overrides: list[str], gpus: list[int] | None) -> None:
        """Launch ``preset`` in a worker; the run appears in the list once started."""
        backend = self.app.backend
        simulate: int | None = None
        sim_card: str | None = None
        if backend is not None and backend.simulated:
            # The child sees the same simulated GPUs as the dashboard.
            simulate = int(getattr(backend, "count", -1))
            sim_card = getattr(getattr(backend, "spec", None), "key", None)

        def job() -> None:
            from gpustation.runs.launch import launch

            try:
                handle = launch(preset, overrides, gpus, simulate=simulate, sim_card=sim_card)
            except GpustationError as err:
                self._post(self._launch_failed, preset.name, str(err))
                return
            except Exception as err:
                self._post(self._launch_failed, preset.name, f"{type(err).__name__}: {err}")
                return
            self._post(self._launched, handle)

        self.app.run_worker(
            job, thread=True, exit_on_error=False, group="runs", name=f"launch {preset.name}"
        )
        # Said in the run pane, not in a toast: a toast mounts (and later
        # unmounts) widgets, a relayout of the screen each, while the run starts.
        self.launching.append(preset.name)
        if self.screen is not None:
            self.screen.runs_changed(False, True)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self.app.call_from_thread(fn, *args)
        except RuntimeError:
            pass  # the dashboard is closing

    def _launch_failed(self, name: str, message: str) -> None:
        self._launch_done(name)
        self.app.notify(message, title=f"Could not launch {name}", severity="error", timeout=10)
        if self.screen is not None:
            self.screen.runs_changed(False, True)

    def _launch_done(self, name: str) -> None:
        if name in self.launching:
            self.launching.remove(name)

    def _launched(self, handle: RunHandle) -> None:
        view = RunView(handle.id, handle.run_dir, title=handle.title, preset=handle.preset)
        view.gpus = list(handle.gpus)
        view.started_at = handle.created_at
        view.live = True
        if handle.state is not None:
            view.take_state(handle.state)
        self.views[handle.id] = view
        self._launch_done(handle.preset)
        for warning in handle.warnings:
            self.app.notify(warning, title="Runs", severity="warning", timeout=8)
        # No "started" toast: the new run is selected and its pane says where it runs.
        self.follow(view)
        if self.screen is not None:
            self.screen.runs_changed(True, False, select=handle.id)

    # -- stopping -------------------------------------------------------------------
    def stop(self, view: RunView) -> None:
        """Stop ``view``'s run in a worker (graceful, then firm)."""
        if not view.active:
            return
        view.stopping = True
        if self.screen is not None:
            self.screen.runs_changed(True, view.id == self.selected)

        def job() -> None:
            from gpustation.runs.stop import stop_run

            try:
                state = stop_run(view.run_dir, by="dashboard")
            except Exception as err:
                self._post(self._stop_failed, view.id, str(err))
                return
            self._post(self._stopped, view.id, state)

        self.app.run_worker(job, thread=True, exit_on_error=False, group="runs", name="stop run")

    def _stop_failed(self, run_id: str, message: str) -> None:
        view = self.views.get(run_id)
        if view is not None:
            view.stopping = False
        self.app.notify(message, title=f"Could not stop {run_id}", severity="error", timeout=10)
        if self.screen is not None:
            self.screen.runs_changed(True, run_id == self.selected)

    def _stopped(self, run_id: str, state: RunState | None) -> None:
        view = self.views.get(run_id)
        if view is not None and state is not None:
            view.take_state(state)
        status = state.status if state is not None else "unknown"
        self.app.notify(f"Run {run_id}: {status}.", title="Runs")
        with self._lock:
            self._want_history = True
        self.poll_soon()
        if self.screen is not None:
            self.screen.runs_changed(True, run_id == self.selected)

    # -- quitting -------------------------------------------------------------------
    def before_quit(self) -> bool:
        """Asked by the app on ``q``: True when runs are going and the question was asked."""
        if isinstance(self.app.screen, QuitRunsDialog):
            return True  # already asking
        active = self.live_active()
        if not active or self._quitting:
            return False

        def answered(choice: str | None) -> None:
            if choice == "leave":
                self.app.exit()
            elif choice == "stop":
                self._quitting = True
                self._stop_all_then_exit(active)

        self.app.push_screen(QuitRunsDialog(active), answered)
        return True

    def _stop_all_then_exit(self, views: list[RunView]) -> None:
        for view in views:
            view.stopping = True
        if self.screen is not None:
            self.screen.runs_changed(True, True)
        self.app.notify(
            f"Stopping {len(views)} run{'s' if len(views) != 1 else ''}… (q again: leave them)",
            title="Runs",
            timeout=30,
        )

        def job() -> None:
            from gpustation.runs.stop import stop_runs

            try:
                stop_runs([v.run_dir for v in views], by="dashboard")
            finally:
                self._post(self.app.exit)

        self.app.run_worker(job, thread=True, exit_on_error=False, group="runs", name="stop all")

    def close(self) -> None:
        """Stop the poll worker and close the files it holds (the dashboard is closing)."""
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        with self._lock:
            self._closed = True
        # A pass in flight closes the followers itself; otherwise do it here.
        if not any(w.group == "runs-poll" and w.is_running for w in self.app.workers):
            self._close_tracks()


def runs_ui(app: DashboardApp) -> RunsUI:
    """The app's RunsUI, made on first use."""
    ui = getattr(app, "_runs_ui", None)
    if ui is None:
        ui = RunsUI(app)
        app._runs_ui = ui  # type: ignore[attr-defined]
    return ui
