"""When a run has slowed down: its throughput against its own steady level. Pure logic.

A :class:`Detector` is fed points (Unix time, throughput), oldest first. The
first reports of a run are compile and warm-up: the first
``warmup_reports`` points and those within ``warmup_s`` of the first are
skipped. After that the steady level is the median of the points of the last
``window_s`` seconds, leaving out the points of a slowdown (a slowed run
never lowers its own bar). A slowdown starts at the first point more than
``drop_pct`` below the steady level and is confirmed once the points have
stayed below for ``min_s`` seconds (one point back above is forgiven, two
are not: a short dip is noise). It ends at the first of the points that
have stayed back within half the drop for :data:`RECOVER_S`: the hysteresis
that keeps a run hovering at the threshold from starting and ending
slowdowns by the second.

A run that reports only its ``step`` gets steps a second from
:class:`StepRate`. Nothing here reads a file or a clock: the watch
(``watch.py``) feeds it and acts on what :meth:`Detector.add` returns.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

#: points kept for the steady level at most (a run reporting many times a
#: second still costs a bounded median)
MAX_WINDOW_POINTS = 4096
#: points the steady level needs before any slowdown can be found
MIN_STEADY_POINTS = 5
#: a slowdown ends once the throughput has stayed recovered this long ...
RECOVER_S = 1.0
#: ... over at least this many points
RECOVER_POINTS = 2
#: the steady level is recomputed at most this often (seconds of the points' time)
STEADY_EVERY_S = 1.0


@dataclass(frozen=True)
class DetectSettings:
    """``[slowdown]`` of config.toml (``settings.py`` reads it)."""

    #: a slowdown is a drop of more than this share of the steady level (%)
    drop_pct: float = 20.0
    #: ... that lasts at least this long (seconds)
    min_s: float = 5.0
    #: the first reports and seconds of a run are its warm-up, never its steady level
    warmup_reports: int = 3
    warmup_s: float = 30.0
    #: the steady level is the median over this many seconds of points
    window_s: float = 120.0
    #: false: no run is watched
    enabled: bool = True


@dataclass
class Span:
    """One slowdown: from its first slow point to the first recovered one."""

    id: int
    start: float
    #: the steady level it fell from
    steady: float
    #: when it was confirmed (the time of the point that confirmed it)
    confirmed: float
    values: list[float] = field(default_factory=list)
    end: float | None = None
    #: the last point's time (the span's end when the run ends during it)
    last: float = 0.0

    @property
    def ongoing(self) -> bool:
        return self.end is None

    @property
    def mean(self) -> float:
        """The mean throughput of its slow points."""
        return sum(self.values) / len(self.values) if self.values else self.steady

    @property
    def lost_pct(self) -> float:
        """How far below the steady level the throughput ran, in %."""
        return 100.0 * (self.steady - self.mean) / self.steady if self.steady > 0 else 0.0

    def length_s(self, until: float | None = None) -> float:
        end = self.end if self.end is not None else (until if until is not None else self.last)
        return max(0.0, end - self.start)


@dataclass(frozen=True)
class Change:
    """What one point did: ``started`` (a slowdown confirmed) or ``ended``."""

    what: str
    span: Span


@dataclass
class _Candidate:
    start: float
    steady: float
    values: list[float] = field(default_factory=list)
    #: points back above the threshold in a row
    above: int = 0


class Detector:
    """Finds slowdowns in a run's throughput (see the module)."""

    def __init__(self, settings: DetectSettings | None = None) -> None:
        self.settings = settings or DetectSettings()
        self._window: deque[tuple[float, float]] = deque(maxlen=MAX_WINDOW_POINTS)
        self._seen = 0
        self._first: float | None = None
        #: the time of the first point after the warm-up (None: still warming up)
        self.steady_since: float | None = None
        self._steady: float | None = None
        self._steady_at = float("-inf")
        self._candidate: _Candidate | None = None
        self._recovered: list[tuple[float, float]] = []
        self._ids = 0
        #: the slowdown under way (confirmed, not ended)
        self.current: Span | None = None

    @property
    def steady(self) -> float | None:
        """The steady level as last computed (None: not known yet)."""
        return self._steady

    def _threshold(self, steady: float) -> float:
        return steady * (1.0 - self.settings.drop_pct / 100.0)

    def _recover_level(self, steady: float) -> float:
        return steady * (1.0 - self.settings.drop_pct / 200.0)

    def _steady_level(self, t: float) -> float | None:
        """The median of the window's points (recomputed at most every STEADY_EVERY_S)."""
        while self._window and self._window[0][0] < t - self.settings.window_s:
            self._window.popleft()
        if t - self._steady_at >= STEADY_EVERY_S or self._steady is None:
            self._steady_at = t
            values = [v for _, v in self._window]
            self._steady = statistics.median(values) if len(values) >= MIN_STEADY_POINTS else None
        return self._steady

    def add(self, t: float, value: float) -> list[Change]:
        """One point (Unix time, throughput); what it started or ended."""
        self._seen += 1
        if self._first is None:
            self._first = t
        s = self.settings
        if self._seen <= s.warmup_reports or t - self._first < s.warmup_s:
            return []
        if self.steady_since is None:
            self.steady_since = t
        if self.current is not None:
            return self._during(t, value, self.current)
        steady = self._steady_level(t)
        if steady is None or steady <= 0:
            self._window.append((t, value))
            return []
        low = value < self._threshold(steady)
        candidate = self._candidate
        if candidate is None:
            if low:
                self._candidate = _Candidate(t, steady, [value])
            else:
                self._window.append((t, value))
            return []
        if low:
            candidate.values.append(value)
            candidate.above = 0
        else:
            candidate.above += 1
            if candidate.above >= 2 or value >= self._recover_level(candidate.steady):
                # A dip shorter than min_s: part of the run's normal variation.
                self._window.extend((candidate.start, v) for v in candidate.values)
                self._window.append((t, value))
                self._candidate = None
                return []
            candidate.values.append(value)
        confirmed = (
            low
            and t - candidate.start >= s.min_s
            and statistics.median(candidate.values) < self._threshold(candidate.steady)
        )
        if not confirmed:
            return []
        self._ids += 1
        span = Span(self._ids, candidate.start, candidate.steady, t, list(candidate.values), last=t)
        self.current, self._candidate = span, None
        return [Change("started", span)]

    def _during(self, t: float, value: float, span: Span) -> list[Change]:
        span.last = t
        if value < self._recover_level(span.steady):
            if self._recovered:
                # Not recovered after all: those points were part of the slowdown.
                span.values.extend(v for _, v in self._recovered)
                self._recovered = []
            span.values.append(value)
            return []
        self._recovered.append((t, value))
        first = self._recovered[0][0]
        if len(self._recovered) < RECOVER_POINTS or t - first < RECOVER_S:
            return []
        span.end = first
        # Recovered points are the run's normal throughput again.
        self._window.extend(self._recovered)
        self._recovered = []
        self.current = None
        return [Change("ended", span)]

    def finish(self, t: float) -> Span | None:
        """The run ended (at ``t``): the slowdown under way, if any, ends with it."""
        span = self.current
        if span is None:
            return None
        span.values.extend(v for _, v in self._recovered)
        self._recovered = []
        span.end = max(span.last, t)
        self.current = None
        return span


class StepRate:
    """Steps a second from the ``step`` of successive reports, for a run that
    reports no throughput: one figure per second or more of reports (a run
    reporting every step would give jitter, not a rate)."""

    def __init__(self, min_interval_s: float = 1.0) -> None:
        self.min_interval_s = min_interval_s
        self._last: tuple[float, int] | None = None

    def add(self, t: float, step: int) -> float | None:
        """The rate since the last figure, once ``min_interval_s`` has passed (else None).

        A step that does not move on (an eval or phase report at the same step)
        or goes back (a restart) gives nothing; going back starts afresh.
        """
        if self._last is None or step < self._last[1] or t < self._last[0]:
            self._last = (t, step)
            return None
        t0, s0 = self._last
        if step == s0 or t - t0 < self.min_interval_s:
            return None
        self._last = (t, step)
        return (step - s0) / (t - t0)
