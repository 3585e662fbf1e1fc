"""A run's loss curves by step and by time, read whole from ``metrics.jsonl``.

For the compare view, which sets several finished (or going) runs' curves
side by side: each point keeps its step and its ``t`` (seconds since the run's
metrics writer started), so one axis or the other can be drawn without
reading the file again. Bounded like the runs screen's curve: past
``max_points`` a series keeps every other point (:class:`~gpustation.runs.fold.Series`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpustation.runs import rundir
from gpustation.runs.fold import Series, finite_number
from gpustation.runs.tail import file_lines, parse_metric_line

#: points kept per curve
MAX_POINTS = 1000


@dataclass
class Curve:
    """One series of a run (loss or eval loss): each point's step, time and value."""

    steps: list[float] = field(default_factory=list)
    times_s: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def xs(self, by_time: bool) -> list[float]:
        return self.times_s if by_time else self.steps

    def __bool__(self) -> bool:
        return bool(self.values)


@dataclass
class RunCurves:
    """A run's training loss and, when it reports one, its eval loss."""

    loss: Curve = field(default_factory=Curve)
    eval_loss: Curve = field(default_factory=Curve)


class _Collect:
    """Two bounded series fed the same points: (step, value) and (time, value)."""

    def __init__(self, max_points: int) -> None:
        self.by_step = Series(max_points)
        self.by_time = Series(max_points)

    def add(self, step: float, t: float, value: float) -> None:
        self.by_step.add(step, value)
        self.by_time.add(t, value)

    def curve(self) -> Curve:
        steps, values = self.by_step.points()
        times, _ = self.by_time.points()
        return Curve(steps, times, values)


def read_curves(run_dir: Path, max_points: int = MAX_POINTS) -> RunCurves:
    """The run's curves (empty when it has no metrics file or no loss in it).

    A point without a step takes the last step seen (the count of reports
    before any step), one without a time the last time seen.
    """
    loss, evals = _Collect(max_points), _Collect(max_points)
    step: float | None = None
    t = 0.0
    count = 0
    try:
        for line in file_lines(run_dir / rundir.METRICS_FILE, "metrics file"):
            event = None if line is None else parse_metric_line(line)
            if event is None:
                continue
            count += 1
            raw_step = event.get("step")
            if isinstance(raw_step, int) and not isinstance(raw_step, bool):
                step = float(raw_step)
            x = step if step is not None else float(count)
            seen = finite_number(event.get("t"))
            t = t if seen is None else seen
            value = finite_number(event.get("loss"))
            if value is not None:
                loss.add(x, t, value)
            value = finite_number(event.get("eval_loss"))
            if value is not None:
                evals.add(x, t, value)
    except OSError:
        pass
    return RunCurves(loss.curve(), evals.curve())
