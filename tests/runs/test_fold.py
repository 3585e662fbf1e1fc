"""The one fold of metric events: figures, bounded curves, rate and ETA, into a RunSummary."""

from __future__ import annotations

import pytest

from gpustation.runs.fold import MetricsFold, Series, ema
from gpustation.runs.summary import RunSummary


def test_series_stays_bounded_and_ends_at_the_last_point() -> None:
    series = Series(max_points=100)
    for i in range(10_000):
        series.add(float(i), 1.0 / (i + 1))
    xs, ys = series.points()
    assert len(xs) <= 101
    assert xs[0] == 0.0 and xs[-1] == 9999.0 and ys[-1] == pytest.approx(1e-4)
    assert xs == sorted(xs)


def test_ema_is_debiased_and_smooths() -> None:
    assert ema([2.0]) == [pytest.approx(2.0)]
    smooth = ema([1.0, 0.0, 1.0, 0.0, 1.0, 0.0], weight=0.8)
    assert all(0.0 < v <= 1.0 for v in smooth)
    assert max(smooth[2:]) - min(smooth[2:]) < 0.5


def test_the_fold_gives_the_rate_the_eta_and_the_summary() -> None:
    fold = MetricsFold()
    for step in range(1, 11):
        event = {"t": step * 0.5, "step": step, "loss": 1.0 / step, "total_steps": 30}
        if step % 5 == 0:
            event["eval_loss"] = 2.0 / step
        fold.add(event)
    fold.add({"t": 5.5, "step": 11, "throughput": 40.0, "unit": "img/s"})
    assert fold.steps_per_s() == pytest.approx(2.0)
    assert fold.eta_s() == pytest.approx(19 / 2.0)
    assert fold.losses.points()[0] == [float(i) for i in range(1, 11)]
    assert fold.evals.points() == ([5.0, 10.0], [0.4, 0.2])
    summary = fold.apply(RunSummary(id="r", status="running"))
    assert (summary.steps, summary.total_steps) == (11, 30)
    assert summary.final_loss == pytest.approx(0.1) and summary.best_loss == pytest.approx(0.1)
    assert summary.final_eval_loss == pytest.approx(0.2)
    assert summary.throughput == 40.0 and summary.throughput_unit == "img/s"
    assert summary.eta_s() == pytest.approx(19 / 2.0)
    # An ended run has no ETA, whatever its last rate.
    summary.status = "succeeded"
    assert summary.eta_s() is None


def test_a_rate_needs_two_reports_that_move_forward() -> None:
    fold = MetricsFold()
    fold.add({"t": 1.0, "step": 5, "total_steps": 10})
    assert fold.steps_per_s() is None and fold.eta_s() is None
    fold.add({"t": 1.0, "step": 6})  # same instant: no rate
    assert fold.steps_per_s() is None
