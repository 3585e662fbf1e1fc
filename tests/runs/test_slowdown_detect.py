"""When a run counts as slowed down: the detector against built series of throughput."""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest

from gpustation.runs.slowdown.detect import Change, Detector, DetectSettings, StepRate

T0 = 1_700_000_000.0
#: a report every 0.2 s, the test workload's pace
EVERY_S = 0.2
#: no warm-up, so the series below start steady
COLD = DetectSettings(warmup_reports=0, warmup_s=0.0)


def series(*parts: tuple[float, float], start: float = 0.0) -> list[tuple[float, float]]:
    """(seconds, throughput) parts one after another, a point every EVERY_S."""
    points = []
    t = start
    for seconds, value in parts:
        for _ in range(round(seconds / EVERY_S)):
            points.append((T0 + t, value))
            t += EVERY_S
    return points


def feed(detector: Detector, points: Iterable[tuple[float, float]]) -> list[Change]:
    changes = []
    for t, value in points:
        changes += detector.add(t, value)
    return changes


def test_a_drop_is_confirmed_after_min_s_and_ends_when_the_throughput_is_back() -> None:
    detector = Detector(COLD)
    changes = feed(detector, series((30, 100.0), (12, 50.0), (10, 100.0)))
    assert [c.what for c in changes] == ["started", "ended"]
    span = changes[0].span
    # It started at the first slow point, and was confirmed min_s (5 s) later.
    assert span.start == pytest.approx(T0 + 30)
    assert span.confirmed == pytest.approx(T0 + 35)
    assert span.steady == 100.0 and span.lost_pct == pytest.approx(50.0)
    # It ended at the first point back, once the throughput had stayed back a second.
    assert span.end == pytest.approx(T0 + 42)
    assert span.length_s() == pytest.approx(12.0)
    assert detector.current is None


def test_a_second_drop_is_a_second_slowdown() -> None:
    detector = Detector(COLD)
    points = series((30, 100.0), (8, 60.0), (20, 100.0), (8, 70.0), (5, 100.0))
    changes = feed(detector, points)
    assert [(c.what, c.span.id) for c in changes] == [
        ("started", 1),
        ("ended", 1),
        ("started", 2),
        ("ended", 2),
    ]
    assert changes[2].span.lost_pct == pytest.approx(30.0)


def test_a_steady_noisy_run_has_none() -> None:
    noise = random.Random(7)
    detector = Detector(COLD)
    points = [(T0 + i * EVERY_S, 100.0 * (1 + noise.uniform(-0.12, 0.12))) for i in range(3000)]
    assert feed(detector, points) == []
    assert detector.steady == pytest.approx(100.0, rel=0.03)


def test_a_dip_shorter_than_min_s_is_noise() -> None:
    detector = Detector(COLD)
    assert feed(detector, series((30, 100.0), (4, 40.0), (30, 100.0))) == []


def test_one_point_back_above_is_forgiven_two_are_not() -> None:
    settings = DetectSettings(warmup_reports=0, warmup_s=0.0, min_s=2.0)
    one = Detector(settings)
    blip = [*series((30, 100.0), (1, 50.0)), (T0 + 31, 85.0), *series((2, 50.0), start=31.2)]
    assert [c.what for c in feed(one, blip)] == ["started"]
    assert one.current is not None and one.current.start == pytest.approx(T0 + 30)
    two = Detector(settings)
    back = [(T0 + 31, 85.0), (T0 + 31.1, 85.0)]
    points = [*series((30, 100.0), (1, 50.0)), *back, *series((1.6, 50.0), start=31.2)]
    # The second point back above ends that candidate: the next one starts at 31.2 s
    # and has not lasted min_s yet.
    assert feed(two, points) == []


def test_the_drop_must_exceed_drop_pct() -> None:
    assert feed(Detector(COLD), series((30, 100.0), (20, 85.0))) == []
    found = feed(Detector(COLD), series((30, 100.0), (20, 75.0)))
    assert [c.what for c in found] == ["started"]
    strict = DetectSettings(drop_pct=10.0, warmup_reports=0, warmup_s=0.0)
    assert [c.what for c in feed(Detector(strict), series((30, 100.0), (20, 85.0)))] == ["started"]


def test_recovery_needs_half_the_drop_back_hysteresis() -> None:
    detector = Detector(COLD)
    # Back to 85 % of the steady level: above the 80 % that started it, below the
    # 90 % that ends it.
    changes = feed(detector, series((30, 100.0), (10, 50.0), (10, 85.0)))
    assert [c.what for c in changes] == ["started"] and detector.current is not None
    changes = feed(detector, series((5, 95.0), start=50.0))
    assert [c.what for c in changes] == ["ended"]
    assert changes[0].span.end == pytest.approx(T0 + 50)


def test_the_warm_up_is_not_taken_as_a_drop() -> None:
    # A burst at the start (a prefetched queue, a cache) that settles at half of it.
    points = series((10, 200.0), (60, 100.0))
    warm = DetectSettings(warmup_s=10.0, warmup_reports=3)
    detector = Detector(warm)
    assert feed(detector, points) == []
    assert detector.steady_since == pytest.approx(T0 + 10)
    # Without the warm-up left out, the same start would read as a slowdown.
    assert [c.what for c in feed(Detector(COLD), points)] == ["started"]
    # By count too: a run reporting rarely leaves its first reports out.
    rare = [(T0 + 10 * i, 200.0 if i < 3 else 100.0) for i in range(30)]
    assert feed(Detector(DetectSettings(warmup_s=0.0, warmup_reports=3)), rare) == []


def test_points_of_a_slowdown_never_lower_the_steady_level() -> None:
    settings = DetectSettings(warmup_reports=0, warmup_s=0.0, window_s=60.0)
    detector = Detector(settings)
    # Slowed for longer than the window: its own points would have become the level.
    changes = feed(detector, series((30, 100.0), (90, 50.0)))
    assert [c.what for c in changes] == ["started"]
    assert detector.current is not None and detector.current.steady == 100.0


def test_a_slowdown_going_on_ends_with_the_run() -> None:
    detector = Detector(COLD)
    feed(detector, series((30, 100.0), (10, 50.0)))
    span = detector.finish(T0 + 41)
    assert span is not None and span.end == pytest.approx(T0 + 41)
    assert span.length_s() == pytest.approx(11.0)
    assert detector.current is None and detector.finish(T0 + 42) is None


def test_steps_a_second_from_the_step_alone() -> None:
    rate = StepRate()
    got = [rate.add(T0 + 0.1 * i, 3 * i) for i in range(31)]
    figures = [g for g in got if g is not None]
    # One figure a second, of 30 steps a second.
    assert figures == pytest.approx([30.0, 30.0, 30.0])
    # A report at the same step (an eval) gives nothing; a step back starts afresh.
    assert rate.add(T0 + 5.0, 90) is None
    assert rate.add(T0 + 6.0, 5) is None and rate.add(T0 + 7.0, 15) == pytest.approx(10.0)
