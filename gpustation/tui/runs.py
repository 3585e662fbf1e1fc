"""Runs in the dashboard: launch a preset, follow its log and loss curve, stop it.

The screen shows the run presets, the runs (active ones first, then the
history) and, for the selected run, its progress, the telemetry of its GPUs,
its loss curve and its log.

Threads: the UI thread never reads a run's files, never waits on a process
and never touches the history database. One poll worker
(:meth:`RunsUI._poll_pass`) reads every followed run with
:class:`~gpustation.runs.follow.RunFollower`, folds what it read into a
:class:`RunDelta` per run and hands the batch to the UI thread; the UI thread
re-arms the worker with a timer once it has applied the batch, so passes never
overlap and the log pane is updated at most once per pass (every
:data:`POLL_S`). Launching, stopping and the history comparison run in their
own short-lived workers.

Memory stays bounded whatever a run prints: a run keeps its last
:data:`MAX_LOG_LINES` log lines, its loss series are thinned to at most
:data:`MAX_POINTS` points, and only the active runs and the selected one are
held at all.

Keys stay quick while a run floods its log (p99 under 100 ms on a 2-core
machine, ``bench/log_flood.py``): nothing a flood or a launch does lays the
screen out again. The log pane and the runs table change their scrollable
size without a relayout, the run header has a fixed height, launching is said
in the run pane rather than in toasts, the footer is rebuilt only when its keys
change, and the heap is frozen once the screen is up so that a full garbage
collection walks only what was made since.

A run outlives the dashboard (each has its own detached supervisor). Opening
this screen re-attaches to the runs still going (from their run directories,
checking each PID is still the run's); quitting with runs going asks whether to
stop them or leave them running.
"""

from __future__ import annotations

import gc
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rich.cells import cell_len
from rich.segment import Segment
from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.geometry import Size
from textual.reactive import Reactive
from textual.screen import ModalScreen, Screen
from textual.scroll_view import ScrollView
from textual.scrollbar import ScrollTo, ScrollUp
from textual.selection import Selection
from textual.strip import Strip
from textual.timer import Timer
from textual.widgets import Button, DataTable, Footer, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from gpustation.errors import GpustationError, UsageError
from gpustation.runs import rundir
from gpustation.runs.follow import FollowUpdate, RunFollower
from gpustation.runs.presets import ArgValue, PresetProblem, RunPreset, apply_overrides
from gpustation.runs.rundir import RunState
from gpustation.telemetry import format as fmt
from gpustation.telemetry.backend import parse_gpu_list
from gpustation.telemetry.model import GpuSample
from gpustation.tui.screens import LiveScreen
from gpustation.tui.source import Frame
from gpustation.tui.widgets import LiveText

if TYPE_CHECKING:
    from gpustation.runs.launch import RunHandle
    from gpustation.runs.reconcile import ActiveRun
    from gpustation.runs.store import RunRecord
    from gpustation.tui.app import DashboardApp

#: seconds between two passes of the poll worker while a run is followed
POLL_S = 0.1
#: ... and while none is (looking for runs started elsewhere)
IDLE_POLL_S = 1.0
#: how often the worker looks for active runs started outside the dashboard
DISCOVER_EVERY_S = 5.0
#: log lines kept per run (and shown in the log pane)
MAX_LOG_LINES = 5000
#: points kept per loss series; beyond that every other point is dropped
MAX_POINTS = 2000
#: bytes of log read per pass for an active run, and for a finished one being loaded
ACTIVE_BITE = 1 << 18
FINISHED_BITE = 2 << 20
#: the loss curve is redrawn at most this often (a plotext figure costs tens of ms)
PLOT_EVERY_S = 1.0
#: weight of the exponential moving average drawn over the raw loss
EMA_WEIGHT = 0.8
#: history rows shown
HISTORY_LIMIT = 200
#: lines under the preset list describing the highlighted preset
INFO_LINES = 3
#: a pass bringing at least FLOOD_LINES lines is a flood: the log pane then takes
#: them at most every FLOOD_FLUSH_S (each refill of the pane costs the UI thread)
FLOOD_LINES = 1000
FLOOD_FLUSH_S = 0.3

STATUS_STYLE = {
    "starting": "yellow",
    "running": "bold green",
    "succeeded": "green",
    "failed": "bold red",
    "stopped": "yellow",
    "lost": "red",
}


# ---- plain helpers (no widgets) ------------------------------------------------------------


def freeze_heap() -> bool:
    """Collect, then move every object alive now out of the collector's sight (once).

    A full collection walks every tracked object: with the dashboard and this
    screen built that is ~100,000 objects and 50-90 ms on a busy 2-core
    machine, long enough to stall a key pressed during a log flood. The
    screens, widgets, modules and stylesheets alive at this point live as long
    as the app, so freezing them costs nothing and leaves later full
    collections only the objects made since (dialogs, rows, render caches).
    Returns False when the heap was already frozen.
    """
    if gc.get_freeze_count():
        return False
    gc.collect()
    gc.freeze()
    return True


class Series:
    """A bounded (x, y) series: past ``max_points`` it keeps every other point.

    The last point added is always kept, so a curve ends where the run is.
    """

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self.max_points = max_points
        self.xs: list[float] = []
        self.ys: list[float] = []
        self.stride = 1
        self._since = 0
        self._last: tuple[float, float] | None = None

    def add(self, x: float, y: float) -> None:
        self._since += 1
        if self._since >= self.stride:
            self._since = 0
            self.xs.append(x)
            self.ys.append(y)
            self._last = None
            if len(self.xs) > self.max_points:
                self.xs = self.xs[::2]
                self.ys = self.ys[::2]
                self.stride *= 2
        else:
            self._last = (x, y)

    def points(self) -> tuple[list[float], list[float]]:
        """Copies of the kept points, ending with the last point added."""
        xs, ys = list(self.xs), list(self.ys)
        if self._last is not None:
            xs.append(self._last[0])
            ys.append(self._last[1])
        return xs, ys

    def __len__(self) -> int:
        return len(self.xs) + (self._last is not None)


def ema(values: Sequence[float], weight: float = EMA_WEIGHT) -> list[float]:
    """Debiased exponential moving average (as TensorBoard smooths a curve)."""
    out: list[float] = []
    acc = 0.0
    for n, value in enumerate(values, start=1):
        acc = acc * weight + (1.0 - weight) * value
        out.append(acc / (1.0 - weight**n))
    return out


fmt_duration = fmt.duration


def fmt_value(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    if value != 0 and abs(value) < 10 ** -(digits - 1):
        return f"{value:.3g}"
    if abs(value) >= 10000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def loss_plot(
    losses: tuple[list[float], list[float]],
    evals: tuple[list[float], list[float]],
    width: int,
    height: int,
) -> Text:
    """The loss curve: raw, smoothed, and eval loss when the run reports it."""
    import plotext as plt

    xs, ys = losses
    plt.clear_figure()
    plt.plotsize(max(20, width), max(5, height))
    plt.theme("clear")
    if xs:
        plt.plot(xs, ys, marker="braille", color="gray", label="loss")
        if len(ys) > 2:
            plt.plot(xs, ema(ys), marker="braille", color="cyan", label="smoothed")
    ex, ey = evals
    if ex:
        plt.plot(ex, ey, marker="braille", color="orange", label="eval loss")
    plt.xlabel("step")
    return Text.from_ansi(plt.build())


def gpu_line(g: GpuSample) -> Text:
    """One compact line of a GPU's telemetry for the run pane."""
    t = Text()
    t.append(f"GPU {g.index} ", style="bold")
    if g.lost:
        t.append("lost", style="bold red")
        return t
    temp = fmt.num(g.temperature_c, 0, " C")
    hot = (
        g.temperature_c is not None
        and g.temperature_slowdown_c is not None
        and g.temperature_c >= g.temperature_slowdown_c - 5
    )
    t.append(temp, style="bold red" if hot else "")
    t.append(f" · {fmt.pair(g.power_w, g.power_limit_w, ' W')}")
    t.append(f" · util {fmt.num(g.utilization_gpu_pct, 0, ' %')}")
    t.append(f" · VRAM {fmt.mib(g.memory_used_mib)}/{fmt.mib(g.memory_total_mib)}")
    reasons = [r for r in (g.throttle_reasons or []) if r != "gpu_idle"]
    if reasons:
        t.append(f" · throttled: {fmt.throttle(reasons)}", style="yellow")
    return t


# ---- what the poll worker hands over ---------------------------------------------------------


@dataclass
class RunDelta:
    """What one pass read of one run (made in the worker, applied on the UI thread)."""

    id: str
    #: the first delta of a (re)loaded run: the view starts from scratch
    reset: bool = False
    run: dict[str, Any] | None = None
    lines: list[str] = field(default_factory=list)
    #: lines read this pass but too many to keep
    dropped: int = 0
    state: RunState | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    losses: tuple[list[float], list[float]] | None = None
    evals: tuple[list[float], list[float]] | None = None
    ended: bool = False


@dataclass
class PassResult:
    deltas: list[RunDelta] = field(default_factory=list)
    discovered: list[ActiveRun] | None = None
    history: list[RunRecord] | None = None
    errors: list[str] = field(default_factory=list)


class _Track:
    """Worker-side state of one followed run."""

    def __init__(self, run_id: str, directory: Path, active: bool) -> None:
        self.id = run_id
        self.directory = directory
        self.follower = RunFollower(directory, max_bytes=ACTIVE_BITE if active else FINISHED_BITE)
        self.losses = Series()
        self.evals = Series()
        self.rate: deque[tuple[float, int]] = deque(maxlen=30)
        self.fresh = True

    def digest(self, update: FollowUpdate) -> RunDelta:
        delta = RunDelta(self.id, state=update.state, ended=update.ended)
        if self.fresh:
            self.fresh = False
            delta.reset = True
            delta.run = rundir.read_run(self.directory) or {}
        if update.state is not None and not update.state.active:
            # Ended: take what is left in bigger bites.
            self.follower.max_bytes = FINISHED_BITE
        if update.lines:
            lines = update.lines
            if len(lines) > MAX_LOG_LINES:
                delta.dropped = len(lines) - MAX_LOG_LINES
                lines = lines[-MAX_LOG_LINES:]
            delta.lines = FollowUpdate(lines=lines).text_lines()
        acc = self.follower.acc
        if acc.losses:
            for x, y in acc.losses:
                self.losses.add(x, y)
            acc.losses.clear()  # the accumulator keeps every point; we keep a bounded series
            delta.losses = self.losses.points()
        got_eval = False
        for event in update.events:
            step = event.get("step")
            t = event.get("t")
            if isinstance(step, int) and isinstance(t, (int, float)) and not isinstance(t, bool):
                self.rate.append((float(t), step))
            value = event.get("eval_loss")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                x = float(step) if isinstance(step, int) else float(len(self.evals) + 1)
                self.evals.add(x, float(value))
                got_eval = True
        if got_eval:
            delta.evals = self.evals.points()
        if update.events or delta.reset:
            delta.figures = {
                "step": acc.step,
                "total_steps": acc.total_steps,
                "loss": acc.final_loss,
                "best_loss": acc.best_loss,
                "eval_loss": acc.last_eval_loss,
                "throughput": acc.throughput,
                "unit": acc.unit,
                "steps_per_s": self.steps_per_s(),
            }
        return delta

    def steps_per_s(self) -> float | None:
        if len(self.rate) < 2:
            return None
        (t0, s0), (t1, s1) = self.rate[0], self.rate[-1]
        if t1 <= t0 or s1 <= s0:
            return None
        return (s1 - s0) / (t1 - t0)

    def close(self) -> None:
        self.follower.close()


# ---- the UI-side view of a run ------------------------------------------------------------


@dataclass
class RunView:
    """A run as the screen shows it (touched only on the UI thread)."""

    id: str
    run_dir: Path
    title: str = ""
    preset: str = ""
    gpus: list[int] = field(default_factory=list)
    status: str = "starting"
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    reason: str | None = None
    oom: bool = False
    figures: dict[str, Any] = field(default_factory=dict)
    #: when the figures were last updated (for the ETA)
    figures_at: float = 0.0
    losses: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))
    evals: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_LOG_LINES))
    #: log lines read but not kept (older than the last MAX_LOG_LINES)
    dropped: int = 0
    #: the log and curve have been (or are being) read from the run directory
    loaded: bool = False
    #: launched or re-attached by this dashboard: counts when quitting
    live: bool = False
    stopping: bool = False
    marked: bool = False
    #: bumps whenever the curve data changes (the plot's redraw key)
    curve_version: int = 0

    @property
    def active(self) -> bool:
        return self.status in rundir.ACTIVE_STATUSES

    def status_text(self) -> str:
        if self.stopping and self.active:
            return "stopping…"
        return rundir.status_label(self.status, self.oom, self.signal, self.exit_code)

    def take_run(self, run: dict[str, Any]) -> None:
        preset = run.get("preset") or {}
        self.preset = preset.get("name") or self.preset
        self.title = preset.get("title") or self.preset or self.title
        self.gpus = list(run.get("gpus") or self.gpus)
        self.started_at = self.started_at or run.get("created_at")

    def take_state(self, state: RunState) -> None:
        self.status = state.status
        self.started_at = state.started_at or self.started_at
        self.ended_at = state.ended_at
        self.exit_code = state.exit_code
        self.signal = state.signal
        self.reason = state.reason
        self.oom = state.oom
        if not state.active:
            self.stopping = False

    def take_record(self, r: RunRecord) -> None:
        self.preset = r.preset or self.preset
        self.title = r.title or self.preset
        self.gpus = list(r.gpus)
        self.status = r.status
        self.started_at = r.started_at
        self.ended_at = r.ended_at
        self.exit_code = r.exit_code
        self.signal = r.signal
        self.reason = r.reason
        self.oom = r.oom
        if not self.loaded:
            self.figures = {
                "step": r.steps,
                "total_steps": r.total_steps,
                "loss": r.final_loss,
                "best_loss": r.best_loss,
                "eval_loss": r.final_eval_loss,
                "throughput": r.best_throughput,
                "unit": r.throughput_unit,
            }

    def unload(self) -> None:
        """Free the log and curve of a finished run that is no longer shown."""
        self.lines = deque(maxlen=MAX_LOG_LINES)
        self.losses = ([], [])
        self.evals = ([], [])
        self.dropped = 0
        self.loaded = False
        self.curve_version += 1

    def elapsed_s(self, now: float) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or now) - self.started_at

    def eta_s(self, now: float) -> float | None:
        f = self.figures
        step, total, rate = f.get("step"), f.get("total_steps"), f.get("steps_per_s")
        if not self.active or step is None or not total or not rate:
            return None
        # From the last report, less the time since it came in.
        return max(0.0, (total - step) / rate - (now - self.figures_at))


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


# ---- widgets -------------------------------------------------------------------------------


#: control characters a terminal would act on (tab is expanded instead)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")


def _printable(line: str) -> str:
    return _CONTROL.sub("\ufffd", line.expandtabs()) if not line.isprintable() else line


class RunLog(ScrollView, can_focus=True):
    """The log pane: a run's last lines, drawn a screen at a time.

    Holds at most ``max_lines`` lines (the oldest drop out) and renders only
    the rows on screen, each from its string when it is drawn: appending a
    flood's worth of lines costs a deque extend and one repaint. New lines
    never relayout the screen: the content size is set without Textual's
    layout (only this widget's scrollbars depend on it), and no line's width
    is measured until it is drawn.

    Following the end is a flag set by what the user does (keys, wheel,
    scrollbar), not read from the scroll position: while a flood comes in,
    the position lags the content for a moment and would read as "scrolled
    back". ``on_change`` is called when the flag flips.
    """

    ALLOW_SELECT = True
    DEFAULT_CSS = """
    RunLog {
        background: $surface;
        color: $text;
        overflow-y: scroll;
        overflow-x: auto;
        &:focus { background-tint: $foreground 5%; }
    }
    """

    def __init__(
        self, on_change: Callable[[], None], max_lines: int = MAX_LOG_LINES, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.max_lines = max_lines
        self._lines: deque[str] = deque(maxlen=max_lines)
        #: the widest line seen, in characters (grows as wider lines are written or drawn)
        self._width = 0
        self.follow = True
        self._on_change = on_change

    @property
    def lines(self) -> Sequence[str]:
        """The lines held (the last ``max_lines`` written)."""
        return self._lines

    @property
    def line_count(self) -> int:
        return len(self._lines)

    def write_lines(self, lines: Iterable[str]) -> None:
        """Append ``lines`` (each without its newline) and repaint."""
        if self._append(lines):
            self._content_changed()

    def write_line(self, line: str) -> None:
        """Append one line."""
        self.write_lines([line])

    def replace(self, lines: Iterable[str]) -> None:
        """Show ``lines`` instead of what is there (another run, or a refill)."""
        self._lines.clear()
        self._width = 0
        self._append(lines)
        self._content_changed()

    def clear(self) -> None:
        """Remove every line."""
        self.replace(())

    def _append(self, lines: Iterable[str]) -> bool:
        added = list(lines)
        if not added:
            return False
        self._lines.extend(added)
        # len() is the width of plain text; tabs and wide characters are measured
        # when drawn (render_line widens the content then).
        self._width = max(self._width, max(map(len, added[-self.max_lines :])))
        return True

    def _content_changed(self) -> None:
        size = Size(self._width, len(self._lines))
        if size != self.virtual_size:
            # Not through the reactive: it would lay the whole screen out again
            # (~50 ms on a small machine) for what changes only this widget's
            # scrollbars. Showing or hiding a scrollbar still relayouts (its
            # own reactive), which a flood does at most once.
            self.set_reactive(ScrollView.virtual_size, size)
            self._scroll_update(size)
        self.refresh()

    def show_end(self) -> None:
        """Scroll to the last line."""
        self.scroll_end(animate=False, immediate=True, x_axis=False)

    def on_resize(self) -> None:
        if self.follow:
            self.show_end()

    # -- drawing -----------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        style = self.rich_style
        if index >= len(self._lines):
            return Strip.blank(width, style)
        text = _printable(self._lines[index])
        cells = cell_len(text)
        if cells > self._width:
            self._width = cells
            self.call_later(self._content_changed)
        selection = self.text_selection
        span = selection.get_span(index) if selection is not None else None
        if span is None:
            strip = Strip([Segment(text, style)], cells)
        else:
            start, end = span
            line = Text(text, style=style, no_wrap=True, end="")
            line.stylize(
                self.screen.get_component_rich_style("screen--selection"),
                start,
                len(text) if end == -1 else end,
            )
            strip = Strip(line.render(self.app.console), cells)
        return strip.crop_extend(scroll_x, scroll_x + width, style).apply_offsets(scroll_x, index)

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        return selection.extract("\n".join(self._lines)), "\n"

    def selection_updated(self, selection: Selection | None) -> None:
        self.refresh()

    # -- following -----------------------------------------------------------------------------
    def _pause(self) -> None:
        if self.follow and self.max_scroll_y > 0:
            self.follow = False
            self._on_change()

    def action_scroll_up(self) -> None:
        super().action_scroll_up()
        self._pause()

    def action_page_up(self) -> None:
        super().action_page_up()
        self._pause()

    def action_scroll_home(self) -> None:
        super().action_scroll_home()
        self._pause()

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self._pause()

    def on_scroll_up(self, message: ScrollUp) -> None:
        self._pause()

    def on_scroll_to(self, message: ScrollTo) -> None:
        if message.y is not None and message.y < self.max_scroll_y:
            self._pause()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        # Back at the end by scrolling down: follow again.
        if not self.follow and self.max_scroll_y > 0 and round(new_value) >= self.max_scroll_y:
            self.follow = True
            self._on_change()


class RunsTable(DataTable[Any]):
    """The runs table: a new row changes its scrollable height, never the screen's layout.

    Only for a table whose size the stylesheet fixes (``height: 1fr``): then
    the rows it holds move its scrollbar and nothing else, and a run starting
    or ending need not lay the whole screen out again. Showing or hiding the
    scrollbar still does (its own reactive).
    """

    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False)

    def watch_virtual_size(self, size: Size) -> None:
        self._scroll_update(size)


class QuietFooter(Footer):
    """A footer rebuilt only when the keys it would show change.

    Textual's footer rebuilds itself (a dozen widgets, so a relayout of the
    screen) whenever its screen's bindings are refreshed: on each focus change
    and each time a dialog closes, when the keys are usually the same.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._keys: object = None

    def bindings_changed(self, screen: Screen[Any]) -> None:
        keys = [
            (binding, enabled, tooltip)
            for (_, binding, enabled, tooltip) in screen.active_bindings.values()
        ]
        if keys == self._keys and self._bindings_ready:
            return
        if screen.app.app_focus and self.is_attached and screen is self.screen:
            self._keys = keys  # what the rebuild about to happen will show
        super().bindings_changed(screen)


class LossPlot(Static):
    """The selected run's loss curve; rebuilt only when its data or size changed."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key: object = None
        self._drawn_at = 0.0
        self._timer: Timer | None = None
        self.draws = 0

    def show(self, view: RunView | None) -> None:
        width, height = self.content_region.width, self.content_region.height
        key = (view.id if view else None, view.curve_version if view else 0, width, height)
        if key == self._key or not width:
            return
        wait = self._drawn_at + PLOT_EVERY_S - time.monotonic()
        same_run = isinstance(self._key, tuple) and self._key[0] == key[0]
        if same_run and wait > 0:
            # New points too soon after the last figure: draw them a bit later.
            if self._timer is None:
                self._timer = self.set_timer(wait, lambda: self._later(view))
            return
        self._key = key
        self._drawn_at = time.monotonic()
        if view is None:
            self.update(Text("Select a run to see its loss curve.", style="dim"), layout=False)
        elif not view.losses[0] and not view.evals[0]:
            self.update(Text("No loss reported yet.", style="dim"), layout=False)
        else:
            # The stylesheet fixes the size: no relayout of the screen.
            self.update(loss_plot(view.losses, view.evals, width, height), layout=False)
            self.draws += 1

    def _later(self, view: RunView | None) -> None:
        self._timer = None
        screen = self.screen
        current = screen.current_view() if isinstance(screen, RunsScreen) else view
        self.show(current)

    def on_resize(self) -> None:
        self._key = None


# ---- dialogs --------------------------------------------------------------------------------


@dataclass
class LaunchRequest:
    preset: RunPreset
    overrides: list[str]
    gpus: list[int] | None


def _arg_text(value: ArgValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(_arg_text(v) for v in value)  # type: ignore[arg-type]
    return str(value)


def default_gpus(preset: RunPreset, device_count: int | None) -> list[int] | None:
    """The GPUs a launch would take without a choice (None when it cannot be said)."""
    from gpustation.runs.argv import resolve_gpus

    try:
        return resolve_gpus(preset, None, device_count)
    except UsageError:
        return None


class LaunchDialog(ModalScreen[LaunchRequest | None]):
    """The preset's arguments with their defaults, and the GPUs; Enter launches."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="runs.launch.cancel"),
    ]
    DEFAULT_CSS = """
    LaunchDialog { align: center middle; }
    #launch-box {
        width: 80; height: auto; max-height: 90%;
        border: thick $primary; background: $surface; padding: 1 2;
    }
    #launch-box Label { width: 100%; }
    #launch-args { height: auto; max-height: 20; }
    .launch-row { height: 3; }
    #launch-box .launch-row Label { width: 22; padding: 1 1 0 0; }
    #launch-box .launch-row Input { width: 1fr; }
    #launch-error { color: $error; height: auto; }
    #launch-buttons { height: auto; margin-top: 1; }
    #launch-buttons Button { margin-right: 2; }
    """

    def __init__(self, preset: RunPreset, device_count: int | None) -> None:
        super().__init__()
        self.preset = preset
        self.device_count = device_count
        self.keys = list(preset.args)

    def compose(self) -> ComposeResult:
        p = self.preset
        with Vertical(id="launch-box"):
            yield Label(Text(f"Launch {p.display_title}", style="bold"), id="launch-title")
            if p.description:
                yield Label(Text(p.description, style="dim"), id="launch-description")
            with VerticalScroll(id="launch-args"):
                for n, key in enumerate(self.keys):
                    with Horizontal(classes="launch-row"):
                        yield Label(key)
                        yield Input(_arg_text(p.args[key]), id=f"arg-{n}")
                with Horizontal(classes="launch-row"):
                    yield Label("GPUs")
                    gpus = default_gpus(p, self.device_count)
                    yield Input(
                        ",".join(map(str, gpus)) if gpus else "",
                        placeholder="e.g. 0,1 (empty: the preset's choice)",
                        id="launch-gpus",
                    )
            yield Label("", id="launch-error")
            with Horizontal(id="launch-buttons"):
                yield Button("Launch (Enter)", id="launch", variant="primary")
                yield Button("Cancel (Esc)", id="cancel")

    def on_mount(self) -> None:
        first = self.query(Input).first()
        first.focus()

    def request(self) -> LaunchRequest:
        """The launch the form describes; raises UsageError with what is wrong."""
        overrides: list[str] = []
        for n, key in enumerate(self.keys):
            text = self.query_one(f"#arg-{n}", Input).value.strip()
            if text != _arg_text(self.preset.args[key]):
                overrides.append(f"{key}={text}")
        applied, _, _ = apply_overrides(self.preset, overrides)
        gpus = parse_gpu_list(self.query_one("#launch-gpus", Input).value)
        from gpustation.runs.argv import resolve_gpus

        resolve_gpus(applied, gpus, self.device_count)
        return LaunchRequest(self.preset, overrides, gpus)

    def action_launch(self) -> None:
        try:
            request = self.request()
        except UsageError as err:
            # "--set" and "--gpus" are the command line's words; here they are fields.
            message = str(err).replace("--set ", "").replace("--gpus", "GPUs")
            self.query_one("#launch-error", Label).update(message)
            return
        self.dismiss(request)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_launch()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "launch":
            self.action_launch()
        else:
            self.action_cancel()


class StopRunDialog(ModalScreen[bool]):
    """Asks before stopping a run; Cancel is the default."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y,s", "answer(True)", "Stop", id="runs.stop.yes"),
        Binding("n,escape", "answer(False)", "Cancel", id="runs.stop.no"),
    ]
    DEFAULT_CSS = """
    StopRunDialog { align: center middle; }
    #stop-box {
        width: 72; height: auto; border: thick $warning; background: $surface; padding: 1 2;
    }
    #stop-box Label { width: 100%; }
    #stop-buttons { height: auto; margin-top: 1; }
    #stop-buttons Button { margin-right: 2; }
    """

    def __init__(self, view: RunView) -> None:
        super().__init__()
        self.view = view

    def compose(self) -> ComposeResult:
        v = self.view
        with Vertical(id="stop-box"):
            yield Label(Text(f"Stop {v.title or v.preset}?", style="bold"), id="stop-title")
            yield Label(f"run {v.id}", id="stop-id")
            yield Label(
                "It gets SIGINT (to save and leave), then SIGTERM, then SIGKILL if it "
                "does not end.",
                id="stop-how",
            )
            with Horizontal(id="stop-buttons"):
                yield Button("Stop run (y)", id="stop", variant="warning")
                yield Button("Cancel (n)", id="cancel", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "stop")

    def action_answer(self, stop: bool) -> None:
        self.dismiss(stop)


class QuitRunsDialog(ModalScreen[str | None]):
    """ "Stop N runs or leave them running?" when quitting with runs going."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "answer('stop')", "Stop runs", id="runs.quit.stop"),
        Binding("l", "answer('leave')", "Leave running", id="runs.quit.leave"),
        Binding("escape,c", "answer(None)", "Cancel", id="runs.quit.cancel"),
    ]
    DEFAULT_CSS = """
    QuitRunsDialog { align: center middle; }
    #quit-box {
        width: 76; height: auto; border: thick $warning; background: $surface; padding: 1 2;
    }
    #quit-box Label { width: 100%; }
    #quit-buttons { height: auto; margin-top: 1; }
    #quit-buttons Button { margin-right: 2; }
    """

    def __init__(self, views: Sequence[RunView]) -> None:
        super().__init__()
        self.views = list(views)

    def compose(self) -> ComposeResult:
        n = len(self.views)
        runs = f"{n} run{'s' if n != 1 else ''}"
        with Vertical(id="quit-box"):
            yield Label(
                Text(f"Stop {runs} or leave {'them' if n != 1 else 'it'} running?", style="bold"),
                id="quit-question",
            )
            names = ", ".join(v.preset or v.id for v in self.views[:6])
            if n > 6:
                names += f" +{n - 6}"
            yield Label(names, id="quit-runs")
            yield Label(
                "A run left running goes on without the dashboard; the next start "
                "finds it again (r).",
                id="quit-note",
            )
            with Horizontal(id="quit-buttons"):
                yield Button("Stop (s)", id="stop", variant="warning")
                yield Button("Leave running (l)", id="leave", variant="primary")
                yield Button("Cancel (Esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        choice = event.button.id
        self.dismiss(choice if choice in ("stop", "leave") else None)

    def action_answer(self, choice: str | None) -> None:
        self.dismiss(choice)


class CompareScreen(ModalScreen[None]):
    """Runs side by side (as ``gpustation runs compare``), read in a worker."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,v,q", "close", "Close", id="runs.compare.close"),
    ]
    DEFAULT_CSS = """
    CompareScreen { align: center middle; }
    #compare-box { width: 95%; height: 85%; border: thick $primary; background: $surface; }
    """

    def __init__(self, run_ids: list[str]) -> None:
        super().__init__()
        self.run_ids = run_ids
        self.shown: list[str] = []

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="compare-box"):
            yield Static("reading the history…", id="compare-table")

    def on_mount(self) -> None:
        self.run_worker(self._load, thread=True, exit_on_error=False)

    def _load(self) -> None:
        from gpustation.runs.compare import compare_rows
        from gpustation.runs.store import RunStore

        store = RunStore()
        records = [r for r in (store.get(i) for i in self.run_ids) if r is not None]
        table = Table(header_style="bold", box=None, pad_edge=False, title="Runs compared")
        table.add_column("")
        for r in records:
            table.add_column(r.id, justify="right", overflow="fold")
        for row in compare_rows(records) if records else []:
            table.add_row(row.name, *row.cells())
        table.caption = "changes in brackets are from the first run · Esc closes"
        try:
            self.app.call_from_thread(self._show, table, [r.id for r in records])
        except RuntimeError:
            pass

    def _show(self, table: Table, run_ids: list[str]) -> None:
        #: the runs shown, in column order (read by tests)
        self.shown = run_ids
        self.query_one("#compare-table", Static).update(table)

    def action_close(self) -> None:
        self.dismiss(None)


# ---- the screen -----------------------------------------------------------------------------


class RunsScreen(LiveScreen):
    """Presets, runs and the selected run's progress, GPUs, loss curve and log."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("l", "launch", "Launch", id="runs.launch"),
        Binding("x", "stop", "Stop run", id="runs.stop"),
        Binding("space", "mark", "Mark", id="runs.mark"),
        Binding("v", "compare", "Compare", id="runs.compare"),
        Binding("end", "follow", "Follow log", priority=True, id="runs.follow"),
        Binding("j", "cursor(1)", "Down", show=False, id="runs.down"),
        Binding("k", "cursor(-1)", "Up", show=False, id="runs.up"),
        Binding("escape", "app.show_dashboard", "Back", id="runs.back"),
    ]
    DEFAULT_CSS = """
    #runs-body { height: 1fr; }
    #runs-left { width: 62; min-width: 40; }
    #runs-presets { height: 12; border: round $panel; }
    #runs-presets:focus { border: round $accent; }
    #runs-preset-info { height: 3; padding: 0 1; color: $text-muted; }
    #runs-problems { height: auto; max-height: 6; padding: 0 1; }
    #runs-table { height: 1fr; border: round $panel; }
    #runs-table:focus { border: round $accent; }
    #runs-right { width: 1fr; }
    #run-header { height: 4; padding: 0 1; }
    #run-gpus { height: auto; padding: 0 1; }
    #run-plot { height: 14; }
    #run-log { height: 1fr; border: round $panel; }
    #run-log:focus { border: round $accent; }
    #run-log-hint { height: 1; padding: 0 1; }
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._columns_ready = False
        self._row_ids: list[str] = []
        self._row_cells: dict[str, tuple[str, ...]] = {}
        self._log_run: str | None = None
        #: lines that arrived for the shown run while the user had scrolled up
        self._unseen = 0
        #: lines for the log pane not written yet (a flood is written in bigger steps)
        self._pending: deque[str] = deque(maxlen=MAX_LOG_LINES)
        self._flush_timer: Timer | None = None
        self._flushed_at = 0.0
        self._dirty = True
        self._log_dirty = True

    @property
    def ui(self) -> RunsUI:
        return runs_ui(self.dash)

    def compose(self) -> ComposeResult:
        yield LiveText(id="banner")
        with Horizontal(id="runs-body"):
            with Vertical(id="runs-left"):
                yield OptionList(id="runs-presets")
                yield LiveText(id="runs-preset-info")
                yield LiveText(id="runs-problems", wrap=True)
                yield RunsTable(id="runs-table", cursor_type="row", zebra_stripes=False)
            with Vertical(id="runs-right"):
                yield LiveText(id="run-header")
                yield LiveText(id="run-gpus")
                yield LossPlot(id="run-plot")
                # One more than a run keeps: room for the "earlier lines" note.
                yield RunLog(self._log_scrolled, max_lines=MAX_LOG_LINES + 1, id="run-log")
                yield LiveText(id="run-log-hint")
        yield LiveText(id="status")
        yield QuietFooter()

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one("#runs-presets", OptionList).border_title = "Presets (l launches)"
        table = self.query_one("#runs-table", DataTable)
        table.border_title = "Runs (x stops · space marks · v compares)"
        table.add_columns("", "status", "preset", "started", "time", "GPUs", "step", "loss")
        self.query_one("#run-log", RunLog).border_title = "Log"
        self.ui.screen = self
        self.ui.start()
        self.show_presets()
        self.runs_changed(True, True)
        self.query_one("#runs-presets", OptionList).focus()
        # Once the screen has painted: its widgets are as long-lived as the app.
        self.call_after_refresh(freeze_heap)

    def on_unmount(self) -> None:
        self.ui.screen = None
        self.ui.close()

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        if self._dirty:
            self.runs_changed(True, True)
        if self._log_dirty:
            # Lines came while another screen or a dialog was on top.
            self._reload_log()

    def show_frame(self, frame: Frame) -> None:
        if self.is_mounted:
            self._show_selected()

    # -- presets ------------------------------------------------------------------------
    def show_presets(self) -> None:
        if not self.is_mounted:
            return
        ui = self.ui
        options = self.query_one("#runs-presets", OptionList)
        problems = self.query_one("#runs-problems", LiveText)
        if ui.presets is None:
            problems.show(Text("reading the presets…", style="dim"), layout=True)
            return
        highlighted = options.highlighted
        options.clear_options()
        width = max(20, options.content_region.width or 56)
        entries = []
        for p in ui.presets.values():
            # One line per preset: a wrapped title would make the list hard to scan.
            label = Text.assemble((f"{p.name:<24}", "bold"), " ", (p.title or "", "dim"))
            label.truncate(width, overflow="ellipsis")
            entries.append(Option(label, id=p.name))
        options.add_options(entries)
        if ui.presets:
            options.highlighted = min(highlighted or 0, len(ui.presets) - 1)
        t = Text()
        for problem in ui.problems:
            t.append("✗ ", style="bold red")
            t.append(f"{Path(problem.path).name}")
            if problem.line is not None:
                t.append(f":{problem.line}")
            t.append(f" {('[' + problem.key + '] ') if problem.key else ''}{problem.message}\n")
        t.rstrip()
        problems.show(t, layout=True)
        self._show_preset_info()

    def _highlighted_preset(self) -> RunPreset | None:
        presets = self.ui.presets
        options = self.query_one("#runs-presets", OptionList)
        if not presets or options.highlighted is None:
            return None
        option = options.get_option_at_index(options.highlighted)
        return presets.get(option.id or "")

    def _show_preset_info(self) -> None:
        preset = self._highlighted_preset()
        info = self.query_one("#runs-preset-info", LiveText)
        width = max(20, info.content_region.width or 58)
        lines: list[Text] = []
        if preset is not None:
            about = Text(preset.description or preset.display_title)
            lines = list(about.wrap(self.app.console, width, overflow="ellipsis"))[:2]
            where = preset.runner or " ".join(preset.command or [])
            lines.append(Text(f"{preset.launcher}: {where}", style="dim"))
        # Always INFO_LINES lines: moving through the list never relayouts the screen.
        lines += [Text("")] * (INFO_LINES - len(lines))
        for line in lines:
            line.truncate(width, overflow="ellipsis")
        info.show(Text("\n").join(lines[:INFO_LINES]))

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self._show_preset_info()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.action_launch()

    # -- the runs table -------------------------------------------------------------------
    def _cells(self, v: RunView, now: float) -> tuple[str, ...]:
        started = (
            time.strftime("%m-%d %H:%M", time.localtime(v.started_at)) if v.started_at else "-"
        )
        f = v.figures
        step = f.get("step")
        total = f.get("total_steps")
        step_text = "-" if step is None else (f"{step}/{total}" if total else str(step))
        return (
            "✓" if v.marked else "",
            v.status_text(),
            v.preset or v.title or "?",
            started,
            fmt_duration(v.elapsed_s(now)) if not v.active else "",
            ",".join(map(str, v.gpus)) or "-",
            step_text,
            fmt_value(f.get("loss")),
        )

    def runs_changed(self, table: bool, selected: bool, select: str | None = None) -> None:
        """The UI has new data: redraw what is visible (or remember to, when hidden)."""
        if not self.is_mounted:
            return
        if self.app.screen is not self:
            self._dirty = True
            return
        self._dirty = False
        if table or select:
            self._update_table(select)
        if selected or select:
            self._show_selected()
            self._show_hint()

    def _update_table(self, select: str | None = None) -> None:
        table = self.query_one("#runs-table", DataTable)
        now = time.time()
        views = self.ui.ordered()
        ids = [v.id for v in views]
        if ids != self._row_ids:
            current = select or self.ui.selected
            table.clear()
            self._row_cells.clear()
            for v in views:
                cells = self._cells(v, now)
                self._row_cells[v.id] = cells
                table.add_row(*self._styled(cells, v), key=v.id)
            self._row_ids = ids
            if current in ids:
                table.move_cursor(row=ids.index(current), animate=False)
            elif ids:
                table.move_cursor(row=0, animate=False)
        else:
            if select in ids:
                table.move_cursor(row=ids.index(select), animate=False)
            columns = list(table.columns)
            for v in views:
                cells = self._cells(v, now)
                old = self._row_cells.get(v.id)
                if cells == old:
                    continue
                self._row_cells[v.id] = cells
                styled = self._styled(cells, v)
                for n, value in enumerate(styled):
                    if old is None or cells[n] != old[n]:
                        table.update_cell(v.id, columns[n], value, update_width=True)
        self._sync_selection()

    @staticmethod
    def _styled(cells: tuple[str, ...], v: RunView) -> list[Text | str]:
        out: list[Text | str] = list(cells)
        out[1] = Text(cells[1], style=STATUS_STYLE.get(v.status, ""))
        return out

    def _sync_selection(self) -> None:
        table = self.query_one("#runs-table", DataTable)
        run_id: str | None = None
        if table.row_count:
            row = min(max(table.cursor_row, 0), table.row_count - 1)
            run_id = self._row_ids[row] if row < len(self._row_ids) else None
        if run_id != self.ui.selected:
            self.ui.select(run_id)
            self._reload_log()
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
        header = Text()
        gpus = Text()
        if self.ui.launching:
            header.append(f"Launching {', '.join(self.ui.launching)}…", style="bold yellow")
            header.append("\nstarting its supervisor and process", style="dim")
            # The GPU lines and the plot stay as they are until the run appears.
            self.query_one("#run-header", LiveText).show(header)
            return
        if view is None:
            header.append("No run selected. ", style="bold")
            header.append("Launch a preset with l (or Enter on the list).", style="dim")
        else:
            header.append(view.title or view.preset, style="bold")
            header.append(f"  {view.id}\n", style="dim")
            header.append(view.status_text(), style=STATUS_STYLE.get(view.status, ""))
            f = view.figures
            step, total = f.get("step"), f.get("total_steps")
            if step is not None:
                header.append(f" · step {step:,}" + (f"/{total:,}" if total else ""))
                if total:
                    header.append(f" ({100 * min(1.0, step / total):.0f} %)")
            if f.get("throughput") is not None:
                header.append(f" · {fmt_value(f['throughput'], 1)} {f.get('unit') or ''}".rstrip())
            eta = view.eta_s(now)
            if eta is not None:
                header.append(f" · ETA {fmt_duration(eta)}", style="bold")
            header.append(f" · {'elapsed' if view.active else 'took'} ")
            header.append(fmt_duration(view.elapsed_s(now)))
            header.append("\nloss ")
            header.append(fmt_value(f.get("loss")), style="bold")
            header.append(f" (best {fmt_value(f.get('best_loss'))})")
            if f.get("eval_loss") is not None:
                header.append(f" · eval loss {fmt_value(f['eval_loss'])}")
            if view.reason and not view.active:
                header.append(f"\n{view.reason}", style="dim")
            snap = self.dash.latest
            by_index = {g.index: g for g in snap.gpus} if snap is not None else {}
            for n, index in enumerate(view.gpus):
                if n:
                    gpus.append("\n")
                sample = by_index.get(index)
                if sample is None:
                    gpus.append(f"GPU {index} ", style="bold")
                    gpus.append("not sampled by this dashboard", style="dim")
                else:
                    gpus.append_text(gpu_line(sample))
            if not view.gpus:
                gpus.append("no GPU", style="dim")
        # No forced relayout: LiveText asks for one itself when its line count changes.
        self.query_one("#run-header", LiveText).show(header)
        self.query_one("#run-gpus", LiveText).show(gpus)
        self.query_one("#run-plot", LossPlot).show(view)

    # -- the log pane ------------------------------------------------------------------------
    def _reload_log(self) -> None:
        """Show the selected run's kept lines, at the end unless the user has scrolled back."""
        log = self.query_one("#run-log", RunLog)
        view = self.current_view()
        if self._log_run != (view.id if view else None):
            log.follow = True  # another run: start at its end
        self._log_dirty = False
        self._unseen = 0
        self._pending.clear()
        self._log_run = view.id if view else None
        lines: list[str] = []
        if view is not None:
            if view.dropped:
                lines.append(f"… {view.dropped:,} earlier lines in {view.run_dir / 'output.log'}")
            lines.extend(view.lines)
            log.border_title = f"Log · {view.id}"
        log.replace(lines)
        if log.follow:
            log.show_end()
        self._show_hint()

    def log_append(self, view: RunView, delta: RunDelta) -> None:
        """New lines for the shown run (called with each batch, so at most once a pass)."""
        if not self.is_mounted or self.app.screen is not self:
            self._log_dirty = True
            return
        if delta.reset or self._log_run != view.id:
            self._reload_log()
            return
        if not delta.lines:
            return
        log = self.query_one("#run-log", RunLog)
        if log.follow:
            self._pending.extend(delta.lines)
            self._flush_soon()
        else:
            # Scrolled back: keep the view still; the lines wait in the run's buffer.
            self._unseen += len(delta.lines) + delta.dropped
            self._show_hint()

    def _flush_soon(self) -> None:
        """Write the pending lines now, or a little later during a flood."""
        if self._flush_timer is not None:
            return
        spacing = FLOOD_FLUSH_S if len(self._pending) >= FLOOD_LINES else 0.0
        wait = self._flushed_at + spacing - time.monotonic()
        if wait <= 0:
            self._flush_log()
        else:
            self._flush_timer = self.set_timer(wait, self._flush_log)

    def _flush_log(self) -> None:
        self._flush_timer = None
        self._flushed_at = time.monotonic()
        if not self._pending or not self.is_mounted:
            return
        log = self.query_one("#run-log", RunLog)
        lines = list(self._pending)
        self._pending.clear()
        if not log.follow:
            self._unseen += len(lines)
            self._show_hint()
            return
        log.write_lines(lines)
        log.show_end()

    def _log_scrolled(self) -> None:
        log = self.query_one("#run-log", RunLog)
        if log.follow and self._unseen:
            self._reload_log()
        else:
            self._show_hint()

    def _show_hint(self) -> None:
        log = self.query_one("#run-log", RunLog)
        hint = Text()
        if not log.follow:
            hint.append(" paused — End to follow ", style="bold black on yellow")
            if self._unseen:
                hint.append(f" {self._unseen:,} new lines", style="yellow")
        elif self._log_run is not None:
            view = self.ui.views.get(self._log_run)
            if view is not None and view.active:
                hint.append("following the log", style="dim")
        self.query_one("#run-log-hint", LiveText).show(hint)

    # -- actions ---------------------------------------------------------------------------
    def action_launch(self) -> None:
        preset = self._highlighted_preset()
        if preset is None:
            self.notify("No preset selected.", severity="warning")
            return
        snap = self.dash.latest
        device_count: int | None = None
        if snap is not None and snap.gpus:
            device_count = max(g.index for g in snap.gpus) + 1

        def chosen(request: LaunchRequest | None) -> None:
            if request is not None:
                self.ui.launch(request.preset, request.overrides, request.gpus)

        self.app.push_screen(LaunchDialog(preset, device_count), chosen)

    def action_stop(self) -> None:
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
        # Oldest first: the changes read as "from the first run".
        marked.sort(key=lambda v: (v.started_at or 0.0, v.id))
        self.app.push_screen(CompareScreen([v.id for v in marked]))

    def action_follow(self) -> None:
        log = self.query_one("#run-log", RunLog)
        log.follow = True
        if self._unseen:
            self._reload_log()
        log.show_end()
        self._show_hint()

    def action_cursor(self, delta: int) -> None:
        focused = self.focused
        if isinstance(focused, OptionList):
            focused.action_cursor_down() if delta > 0 else focused.action_cursor_up()
        else:
            table = self.query_one("#runs-table", DataTable)
            table.move_cursor(row=max(0, table.cursor_row + delta), animate=False)
