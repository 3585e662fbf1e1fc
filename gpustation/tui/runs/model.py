"""The runs screen's view model: a run as the screen shows it, and what a poll pass hands over.

A :class:`RunView` is a run's :class:`~gpustation.runs.summary.RunSummary`
(the one shape of a run, folded by :mod:`gpustation.runs.fold`) plus what
only the screen keeps: log lines, curves, marks. Plain data, no widget and no
textual import.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpustation.runs import rundir
from gpustation.runs.cost import Price
from gpustation.runs.rundir import RunState
from gpustation.runs.summary import RunSummary
from gpustation.runs.timeline import Timeline
from gpustation.telemetry import format as fmt

#: seconds between two passes of the poll worker while a run is followed
POLL_S = 0.1
#: ... and while none is (looking for runs started elsewhere)
IDLE_POLL_S = 1.0
#: how often the worker looks for active runs started outside the dashboard
DISCOVER_EVERY_S = 5.0
#: log lines kept per run (and shown in the log pane)
MAX_LOG_LINES = 5000
#: bytes of log read per pass for an active run, and for a finished one being loaded
ACTIVE_BITE = 1 << 18
FINISHED_BITE = 2 << 20
#: the loss curve is redrawn at most this often (a plotext figure is slow to build)
PLOT_EVERY_S = 1.0
#: the runs table's title while no filter is set
RUNS_TITLE = "Runs (x stops · space marks · v compares · / filters)"
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


fmt_duration = fmt.duration


def fmt_value(value: float | None, digits: int = 4) -> str:
    if value is None:
        return fmt.NA
    if value != 0 and abs(value) < 10 ** -(digits - 1):
        return f"{value:.3g}"
    if abs(value) >= 10000:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def short_ids(ids: Sequence[str], least: int = 4) -> dict[str, str]:
    """Each run id's shortest tail of whole ``-`` parts (``least`` characters or more)
    that no other of ``ids`` contains: enough for ``gpustation runs show`` to find
    that run among them. An id with no such tail stands whole."""
    out: dict[str, str] = {}
    for run_id in ids:
        parts = run_id.split("-")
        out[run_id] = run_id
        for n in range(1, len(parts)):
            tail = "-".join(parts[-n:])
            if len(tail) >= least and not any(tail in other for other in ids if other != run_id):
                out[run_id] = tail
                break
    return out


# ---- what the poll worker hands over ---------------------------------------------------------


@dataclass
class RunDelta:
    """What one pass read of one run (made on the poller's thread, applied on the UI thread)."""

    id: str
    #: the first delta of a (re)loaded run: the view starts from scratch
    reset: bool = False
    #: the run as read so far (run.json, its state, the folded figures); None: unchanged
    summary: RunSummary | None = None
    lines: list[str] = field(default_factory=list)
    #: lines read this pass but too many to keep
    dropped: int = 0
    losses: tuple[list[float], list[float]] | None = None
    evals: tuple[list[float], list[float]] | None = None
    #: the loss and GPU telemetry on one time axis; None: unchanged
    timeline: Timeline | None = None
    #: ``profile/top_ops.json`` when it was first read or changed ({}: the run has none)
    profile: dict[str, Any] | None = None
    ended: bool = False


@dataclass
class PassResult:
    """One poll pass: the followed runs' deltas, the runs found going, the history."""

    deltas: list[RunDelta] = field(default_factory=list)
    #: runs found going (from their directories), as summaries
    discovered: list[RunSummary] | None = None
    history: list[RunSummary] | None = None
    #: ``[energy]`` of config.toml, read with the history (price_read: it was read this pass)
    price: Price | None = None
    price_read: bool = False
    errors: list[str] = field(default_factory=list)


# ---- the UI-side view of a run ------------------------------------------------------------


@dataclass
class RunView:
    """A run as the screen shows it (touched only on the UI thread).

    What the run is and reported is its :class:`RunSummary`; the rest is the
    screen's own: the kept log lines, the curves, marks and flags.
    """

    id: str
    run_dir: Path
    summary: RunSummary
    #: when the step last moved (the ETA counts down from there)
    summary_at: float = 0.0
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
    #: tags and note set from the screen, kept over the summaries of a run going
    #: (the follower does not read them; the index row does)
    annotations: tuple[list[str], str | None] | None = None
    timeline: Timeline = field(default_factory=Timeline)
    #: the run's top kernels and ops (None: not read yet; {}: not profiled)
    profile: dict[str, Any] | None = None

    @classmethod
    def of(cls, summary: RunSummary, now: float = 0.0) -> RunView:
        directory = Path(summary.run_dir) if summary.run_dir else rundir.run_dir(summary.id)
        return cls(summary.id, directory, summary, summary_at=now)

    @property
    def preset(self) -> str:
        return self.summary.preset or ""

    @property
    def title(self) -> str:
        return self.summary.title or self.preset

    @property
    def gpus(self) -> list[int]:
        return self.summary.gpus

    @property
    def status(self) -> str:
        return self.summary.status

    @property
    def started_at(self) -> float | None:
        return self.summary.started_at

    @property
    def reason(self) -> str | None:
        return self.summary.reason

    @property
    def active(self) -> bool:
        return self.summary.active

    def status_text(self) -> str:
        if self.stopping and self.active:
            return "stopping…"
        return self.summary.status_text()

    def take(self, summary: RunSummary, now: float) -> None:
        """A newer summary of the run (from its files or the history)."""
        if summary.steps != self.summary.steps:
            self.summary_at = now
        if self.annotations is not None and summary.active:
            summary.tags, summary.note = list(self.annotations[0]), self.annotations[1]
        self.summary = summary
        if not summary.active:
            self.stopping = False

    def annotate(self, tags: list[str], note: str | None) -> None:
        """The run's tags and note as just written."""
        self.annotations = (list(tags), note)
        self.summary.tags, self.summary.note = list(tags), note

    def take_state(self, state: RunState, now: float) -> None:
        """Only the state changed (a stop's result)."""
        self.summary.apply_state(state, now)
        if not state.active:
            self.stopping = False

    def unload(self) -> None:
        """Free the log and curve of a finished run that is no longer shown."""
        self.lines = deque(maxlen=MAX_LOG_LINES)
        self.losses = ([], [])
        self.evals = ([], [])
        self.dropped = 0
        self.loaded = False
        self.timeline = Timeline()
        self.profile = None
        self.curve_version += 1

    def elapsed_s(self, now: float) -> float | None:
        s = self.summary
        if s.started_at is None:
            return None
        return (s.ended_at or now) - s.started_at

    def eta_s(self, now: float) -> float | None:
        eta = self.summary.eta_s()
        if eta is None:
            return None
        # From the last report, less the time since it came in.
        return max(0.0, eta - (now - self.summary_at))
