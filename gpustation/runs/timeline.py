"""A run on one time axis: its loss and its GPUs' telemetry, seconds since it started.

:class:`TimelineReader` follows ``telemetry.jsonl`` by byte offset (a
:class:`~gpustation.runs.tail.Tailer`, a bite per poll) and takes the metric
events the run's follower already read, so nothing is read twice. Each
telemetry sample becomes a :class:`GpuMoment` (the run's GPUs together: power
summed, the hottest temperature, the mean utilisation, every limiting reason);
each event with a loss or a throughput a :class:`LossMoment`. Both are kept in a
:class:`Thinned` list, at most ``MAX_POINTS`` each as the loss curve is, so a
long run costs the same memory as a short one. The run's slowdowns (the
records of ``slowdowns.jsonl`` its follower read) are folded into
:class:`SlowdownSpan` s on the same axis.

Times: both files carry ``time`` (Unix seconds), so a moment's place is its
``time`` less the run's start; a line without one falls back to its ``t``
(telemetry counts ``t`` from the run's start; old metrics from the writer's).

:meth:`TimelineReader.data` hands a frozen :class:`Timeline` to the UI, which
asks it for the values at a moment (:meth:`Timeline.at`) to move a cursor
along the run. Plain data: no textual, no plotting.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from gpustation.runs import rundir
from gpustation.runs.fold import MAX_POINTS, finite_number
from gpustation.runs.slowdown import records as slowdown_records
from gpustation.runs.tail import Tailer, parse_metric_line

T = TypeVar("T")


class Thinned(Generic[T]):
    """A bounded list: past ``max_points`` it keeps every other item; the last one always.

    The policy of :class:`~gpustation.runs.fold.Series`, for records.
    """

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self.max_points = max_points
        self.items: list[T] = []
        self.stride = 1
        self._since = 0
        self._last: T | None = None

    def add(self, item: T) -> None:
        self._since += 1
        if self._since >= self.stride:
            self._since = 0
            self.items.append(item)
            self._last = None
            if len(self.items) > self.max_points:
                self.items = self.items[::2]
                self.stride *= 2
        else:
            self._last = item

    def snapshot(self) -> tuple[T, ...]:
        """The kept items, ending with the last one added."""
        if self._last is None:
            return tuple(self.items)
        return (*self.items, self._last)

    def __len__(self) -> int:
        return len(self.items) + (self._last is not None)


@dataclass(frozen=True)
class GpuMoment:
    """One telemetry sample of the run's GPUs together."""

    t_s: float
    power_w: float | None
    temperature_c: float | None
    utilization_pct: float | None
    throttle: tuple[str, ...] = ()
    gpus: int = 1


@dataclass(frozen=True)
class LossMoment:
    """One metric event with a loss (or an eval loss, or a throughput)."""

    t_s: float
    step: int | None
    loss: float | None
    eval_loss: float | None = None
    throughput: float | None = None


@dataclass(frozen=True)
class SlowdownSpan:
    """One slowdown of the run, on its time axis."""

    start_s: float
    #: None while it goes on
    end_s: float | None
    #: the cause in a few words ("power cap"), and with its figures
    label: str
    words: str
    lost_pct: float | None = None
    ongoing: bool = False


@dataclass(frozen=True)
class Timeline:
    """What the UI gets: the kept moments (each sorted by time) and the energy so far."""

    gpu: tuple[GpuMoment, ...] = ()
    loss: tuple[LossMoment, ...] = ()
    #: the run's GPU power integrated over the samples read so far (None: no power)
    energy_j: float | None = None
    slowdowns: tuple[SlowdownSpan, ...] = ()
    _gpu_t: tuple[float, ...] = field(default=(), repr=False, compare=False)
    _loss_t: tuple[float, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_gpu_t", tuple(m.t_s for m in self.gpu))
        object.__setattr__(self, "_loss_t", tuple(m.t_s for m in self.loss))

    @property
    def empty(self) -> bool:
        return not self.gpu and not self.loss

    def end_s(self) -> float:
        """The last moment of either kind (0 when there is none)."""
        ends = [m[-1] for m in (self._gpu_t, self._loss_t) if m]
        return max(ends) if ends else 0.0

    def stops(self) -> tuple[float, ...]:
        """Where a cursor stops: each GPU sample, or each loss point without telemetry."""
        return self._gpu_t or self._loss_t

    def at(self, t_s: float) -> tuple[LossMoment | None, GpuMoment | None]:
        """The last loss point and GPU sample at or before ``t_s`` (None: none yet)."""

        def last(times: tuple[float, ...], items: tuple[Any, ...]) -> Any:
            n = bisect.bisect_right(times, t_s + 1e-9)
            return items[n - 1] if n else None

        losses = [m for m in self.loss if m.loss is not None]
        loss_t = tuple(m.t_s for m in losses)
        return last(loss_t, tuple(losses)), last(self._gpu_t, self.gpu)


def gpu_moment(sample: dict[str, Any], t_s: float) -> GpuMoment | None:
    """The run's GPUs of one ``telemetry.jsonl`` line, together (None: no GPU in it)."""
    gpus = [g for g in sample.get("gpus") or () if isinstance(g, dict)]
    if not gpus:
        return None
    powers = [p for g in gpus if (p := finite_number(g.get("power_w"))) is not None]
    temps = [c for g in gpus if (c := finite_number(g.get("temperature_c"))) is not None]
    utils = [u for g in gpus if (u := finite_number(g.get("utilization_gpu_pct"))) is not None]
    reasons = sorted(
        {str(r) for g in gpus if isinstance(g.get("throttle"), list) for r in g["throttle"]}
    )
    return GpuMoment(
        t_s=t_s,
        power_w=sum(powers) if powers else None,
        temperature_c=max(temps) if temps else None,
        utilization_pct=sum(utils) / len(utils) if utils else None,
        throttle=tuple(reasons),
        gpus=len(gpus),
    )


class TimelineReader:
    """The poller-side timeline of one run. Not thread-safe: one poller at a time."""

    def __init__(self, directory: Path, max_points: int = MAX_POINTS) -> None:
        self.tailer = Tailer(Path(directory) / rundir.TELEMETRY_FILE)
        self.gpu: Thinned[GpuMoment] = Thinned(max_points)
        self.loss: Thinned[LossMoment] = Thinned(max_points)
        #: Unix time of the run's start (from its state, else from the first line)
        self.origin: float | None = None
        self.energy_j: float | None = None
        self._prev: tuple[float, float] | None = None  # (t, power) of the last sample
        self._slowdowns: dict[int, dict[str, Any]] = {}
        self.changed = False

    def start_at(self, started_at: float | None) -> None:
        """The run's start, once known (the first one given stays)."""
        if self.origin is None and started_at is not None:
            self.origin = started_at

    def _place(self, line: dict[str, Any], from_line_start: bool) -> float | None:
        when, t = finite_number(line.get("time")), finite_number(line.get("t"))
        if self.origin is None and when is not None and from_line_start and t is not None:
            self.origin = when - t  # telemetry's t counts from the run's start
        if when is not None and self.origin is not None:
            return max(0.0, when - self.origin)
        return t

    def add_events(self, events: Iterable[dict[str, Any]]) -> None:
        """Metric events (read by the run's follower) with a loss, an eval loss or a throughput."""
        for event in events:
            loss, eval_loss, rate = (
                finite_number(event.get("loss")),
                finite_number(event.get("eval_loss")),
                finite_number(event.get("throughput")),
            )
            if loss is None and eval_loss is None and rate is None:
                continue
            t_s = self._place(event, from_line_start=False)
            if t_s is None:
                continue
            step = event.get("step")
            step = step if isinstance(step, int) and not isinstance(step, bool) else None
            self.loss.add(LossMoment(t_s, step, loss, eval_loss, rate))
            self.changed = True

    def add_slowdowns(self, records: list[dict[str, Any]]) -> None:
        """Records of ``slowdowns.jsonl`` (read by the run's follower)."""
        if records:
            slowdown_records.fold(records, self._slowdowns)
            self.changed = True

    def _on_axis(self, row: dict[str, Any], key: str, fallback: float | None) -> float | None:
        when = finite_number(row.get(key))
        if when is not None and self.origin is not None:
            return max(0.0, when - self.origin)
        return fallback

    def spans(self) -> tuple[SlowdownSpan, ...]:
        """The slowdowns folded so far, on the run's time axis."""
        out = []
        for row in slowdown_records.as_list(self._slowdowns):
            start = self._on_axis(row, "start_time", finite_number(row.get("start_s")))
            if start is None:
                continue
            ongoing = row.get("state") != "ended"
            length = finite_number(row.get("length_s"))
            end = None if ongoing else self._on_axis(row, "end_time", start + (length or 0.0))
            cause = row["cause"]
            out.append(
                SlowdownSpan(
                    start, end, cause["label"], cause["words"], row.get("lost_pct"), ongoing
                )
            )
        return tuple(out)

    def read_telemetry(self, max_bytes: int | None = None) -> None:
        """The telemetry lines written since the last call (at most ``max_bytes`` of them)."""
        for raw in self.tailer.read_new(max_bytes=max_bytes):
            sample = parse_metric_line(raw, check=False)
            if sample is None:
                continue
            t_s = self._place(sample, from_line_start=True)
            moment = None if t_s is None else gpu_moment(sample, t_s)
            if moment is None:
                continue
            if moment.power_w is not None:
                if self._prev is not None and moment.t_s > self._prev[0]:
                    dt = moment.t_s - self._prev[0]
                    step = dt * (self._prev[1] + moment.power_w) / 2
                    self.energy_j = (self.energy_j or 0.0) + step
                self._prev = (moment.t_s, moment.power_w)
            self.gpu.add(moment)
            self.changed = True

    def drained(self) -> bool:
        """Everything written to ``telemetry.jsonl`` so far has been read."""
        return self.tailer.at_end()

    def data(self) -> Timeline:
        """The kept moments as a frozen :class:`Timeline` (clears :attr:`changed`)."""
        self.changed = False
        return Timeline(self.gpu.snapshot(), self.loss.snapshot(), self.energy_j, self.spans())

    def close(self) -> None:
        self.tailer.close()
