"""Folding metric events into what is shown and stored of a run: the one place.

``metrics.jsonl`` events go into a :class:`MetricsFold`: the step and total,
last and best loss, eval loss, throughput (last and best), work done, peak
memory, the rate of steps and the ETA, and the loss curves as bounded
:class:`Series`. ``gpustation run``, the runs screen and the run store all
fold through it and read the result as a
:class:`~gpustation.runs.summary.RunSummary` (:meth:`MetricsFold.apply`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpustation.runs.tail import file_lines, parse_metric_line

if TYPE_CHECKING:
    from gpustation.runs.summary import RunSummary

#: points kept per loss series; beyond that every other point is dropped
MAX_POINTS = 2000
#: reports the rate of steps is measured over
RATE_WINDOW = 30
#: weight of the exponential moving average drawn over the raw loss
EMA_WEIGHT = 0.8


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


def finite_number(value: Any) -> float | None:
    """A metrics value as a float: None for a bool, a non-number, NaN or infinity."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def work_unit(throughput_unit: str | None) -> str | None:
    """``img/s`` -> ``img``: what one unit of work is, when the unit says."""
    if not throughput_unit or not throughput_unit.endswith("/s"):
        return None
    unit = throughput_unit[:-2].strip()
    singular = {"tokens": "token", "samples": "sample", "images": "img", "imgs": "img"}
    return singular.get(unit, unit) or None


@dataclass
class MetricsFold:
    """Running figures from metric events (feed it events in order).

    Besides the figures it keeps the loss and eval-loss curves as bounded
    :class:`Series` and the last reports' (t, step) for the rate of steps.
    """

    step: int | None = None
    total_steps: int | None = None
    epoch: float | None = None
    last_t: float | None = None
    final_loss: float | None = None
    best_loss: float | None = None
    last_eval_loss: float | None = None
    best_eval_loss: float | None = None
    throughput: float | None = None
    best_throughput: float | None = None
    unit: str | None = None
    mem_peak_mib: float | None = None
    work: float = 0.0  # throughput integrated over time (samples, tokens ...)
    lr: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    events: int = 0
    losses: Series = field(default_factory=lambda: Series())
    evals: Series = field(default_factory=lambda: Series())
    #: (t, step) of the last reports, for the rate of steps
    rate: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW))

    def add(self, event: dict[str, Any]) -> None:
        self.events += 1
        t = finite_number(event.get("t"))
        raw_step = event.get("step")
        step = raw_step if isinstance(raw_step, int) and not isinstance(raw_step, bool) else None
        if step is not None:
            self.step = step
            if t is not None:
                self.rate.append((t, step))
        total = event.get("total_steps")
        if isinstance(total, int) and not isinstance(total, bool) and total > 0:
            self.total_steps = total
        epoch = finite_number(event.get("epoch"))
        if epoch is not None:
            self.epoch = epoch
        loss = finite_number(event.get("loss"))
        if loss is not None:
            self.final_loss = loss
            self.best_loss = loss if self.best_loss is None else min(self.best_loss, loss)
            x = float(self.step) if self.step is not None else float(self.events)
            self.losses.add(x, loss)
        eval_loss = finite_number(event.get("eval_loss"))
        if eval_loss is not None:
            self.last_eval_loss = eval_loss
            x = float(step) if step is not None else float(len(self.evals) + 1)
            self.evals.add(x, eval_loss)
            self.best_eval_loss = (
                eval_loss if self.best_eval_loss is None else min(self.best_eval_loss, eval_loss)
            )
        lr = finite_number(event.get("lr"))
        if lr is not None:
            self.lr = lr
        if isinstance(event.get("unit"), str):
            self.unit = event["unit"]
        rate = finite_number(event.get("throughput"))
        if rate is not None:
            self.throughput = rate
            self.best_throughput = (
                rate if self.best_throughput is None else max(self.best_throughput, rate)
            )
            # The rate reported at t is the rate since the previous report.
            if t is not None:
                since = self.last_t if self.last_t is not None else 0.0
                if t > since:
                    self.work += rate * (t - since)
        mem = finite_number(event.get("mem_peak_mib"))
        if mem is not None:
            self.mem_peak_mib = mem if self.mem_peak_mib is None else max(self.mem_peak_mib, mem)
        if isinstance(event.get("summary"), dict):
            self.summary.update(event["summary"])
        if t is not None:
            self.last_t = t

    @property
    def fraction_done(self) -> float | None:
        if self.step is None or not self.total_steps:
            return None
        return min(1.0, max(0.0, self.step / self.total_steps))

    def work_done(self) -> tuple[float | None, str | None]:
        """Units of work done (e.g. images), preferring what the summary says."""
        for key in ("samples", "tokens", "images", "work"):
            value = finite_number(self.summary.get(key))
            if value is not None:
                unit = {"samples": "sample", "tokens": "token", "images": "img"}.get(key)
                return value, unit or work_unit(self.unit)
        unit = work_unit(self.unit)
        if unit is None or self.work <= 0:
            return None, unit
        return self.work, unit

    def steps_per_s(self) -> float | None:
        """Steps a second over the last reports (None until two reports tell)."""
        if len(self.rate) < 2:
            return None
        (t0, s0), (t1, s1) = self.rate[0], self.rate[-1]
        if t1 <= t0 or s1 <= s0:
            return None
        return (s1 - s0) / (t1 - t0)

    def eta_s(self) -> float | None:
        """Seconds left at the current rate, from the last report."""
        rate = self.steps_per_s()
        if self.step is None or not self.total_steps or not rate:
            return None
        return max(0.0, (self.total_steps - self.step) / rate)

    def apply(self, summary: RunSummary) -> RunSummary:
        """Write the figures into ``summary`` (the one shape of a run) and return it."""
        summary.steps = self.step
        summary.total_steps = self.total_steps
        summary.epochs = self.epoch
        summary.final_loss = self.final_loss
        summary.best_loss = self.best_loss
        summary.final_eval_loss = self.last_eval_loss
        summary.throughput = self.throughput
        summary.best_throughput = self.best_throughput
        summary.throughput_unit = self.unit
        summary.steps_per_s = self.steps_per_s()
        summary.summary = dict(self.summary)
        # A summary event may state its own final figures; they beat the running ones.
        for key in ("final_loss", "best_loss"):
            value = finite_number(self.summary.get(key))
            if value is not None:
                setattr(summary, key, value)
        summary.work, summary.work_unit = self.work_done()
        if self.mem_peak_mib is not None:
            summary.peak_vram_mib = max(summary.peak_vram_mib or 0.0, self.mem_peak_mib)
        return summary

    def read(self, path: Path) -> int:
        """Fold a whole ``metrics.jsonl``; returns how many lines were malformed."""
        malformed = 0
        try:
            # In chunks, a line too long to keep skipped: bounded memory, linear time.
            for line in file_lines(path, "metrics file"):
                if line is not None and not line.strip():
                    continue
                event = None if line is None else parse_metric_line(line)
                if event is None:
                    malformed += 1
                else:
                    self.add(event)
        except OSError:
            pass
        return malformed
