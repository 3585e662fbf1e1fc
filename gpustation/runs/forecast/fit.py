"""The lines a forecast fits: robust to a stalled report (Theil-Sen), or least squares."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

#: points a fit uses at most (evenly spread over them)
MAX_FIT_POINTS = 120


def theil_sen(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """(slope, intercept) of the line through ``points``, robust to outliers.

    The slope is the median of the pairwise slopes (Theil-Sen), the intercept
    the median of ``y - slope * x``: a few reports delayed by an evaluation or a
    checkpoint do not tilt it. None with fewer than two distinct x.
    """
    if len(points) > MAX_FIT_POINTS:
        stride = len(points) / MAX_FIT_POINTS
        points = [points[int(i * stride)] for i in range(MAX_FIT_POINTS)] + [points[-1]]
    slopes = [
        (y2 - y1) / (x2 - x1)
        for i, (x1, y1) in enumerate(points)
        for x2, y2 in points[i + 1 :]
        if x2 != x1
    ]
    if not slopes:
        return None
    slope = statistics.median(slopes)
    return slope, statistics.median(y - slope * x for x, y in points)


def least_squares(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """(slope, intercept) by least squares; None with fewer than two distinct x."""
    xs = {x for x, _ in points}
    if len(xs) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return slope, my - slope * mx
