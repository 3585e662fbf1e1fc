"""The runs screen's view model: a run as the screen shows it, and what a poll pass hands over.

Plain data and the folding of a pass into it; no widget and no textual
import, so it can be tested and reasoned about without a screen.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpustation.runs import rundir
from gpustation.runs.rundir import RunState
from gpustation.telemetry import format as fmt

if TYPE_CHECKING:
    from gpustation.runs.reconcile import ActiveRun
    from gpustation.runs.store import RunRecord


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
