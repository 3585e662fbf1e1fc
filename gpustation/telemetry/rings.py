"""Ring buffers of recent samples: per GPU, per metric, the last N values.

The dashboard draws its history graphs from these; the exporter and the CLI
can reuse them. At the default 1 s refresh the default length (1200) covers
20 minutes, twice what the graphs show, so a slower refresh still fills them.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from gpustation.telemetry.model import GpuSample, Snapshot

DEFAULT_LENGTH = 1200


@dataclass(frozen=True)
class Metric:
    """A graphable GPU metric: how to read it and what its full scale is."""

    key: str
    label: str
    unit: str
    value: Callable[[GpuSample], float | None]
    #: the top of the graph's scale for this card (limit, maximum, total)
    scale: Callable[[GpuSample], float | None]
    digits: int = 0


METRICS: dict[str, Metric] = {
    m.key: m
    for m in (
        Metric("util", "GPU utilisation", "%", lambda g: g.utilization_gpu_pct, lambda g: 100.0),
        Metric(
            "power",
            "power",
            "W",
            lambda g: g.power_w,
            lambda g: g.power_max_w or g.power_limit_w,
        ),
        Metric(
            "temp",
            "temperature",
            "C",
            lambda g: g.temperature_c,
            lambda g: g.temperature_shutdown_c or g.temperature_slowdown_c or 100.0,
        ),
        Metric(
            "sm_clock",
            "SM clock",
            "MHz",
            lambda g: g.clock_sm_mhz,
            lambda g: g.clock_sm_max_mhz,
        ),
        Metric(
            "vram",
            "VRAM used",
            "%",
            lambda g: g.memory_pct,
            lambda g: 100.0,
        ),
    )
}
METRIC_KEYS: tuple[str, ...] = tuple(METRICS)


class History:
    """Per GPU, per metric ring buffers of the last ``length`` samples.

    Missing values are kept as ``None`` so the time axis stays regular; a
    graph shows them as gaps.
    """

    def __init__(self, length: int = DEFAULT_LENGTH) -> None:
        if length < 1:
            raise ValueError("history length must be at least 1")
        self.length = length
        self._times: dict[int, deque[float]] = {}
        self._values: dict[tuple[int, str], deque[float | None]] = {}
        self._scale: dict[tuple[int, str], float | None] = {}

    def add(self, snapshot: Snapshot) -> None:
        """Append one value per GPU and metric from ``snapshot``."""
        for gpu in snapshot.gpus:
            times = self._times.get(gpu.index)
            if times is None:
                times = self._times[gpu.index] = deque(maxlen=self.length)
            times.append(snapshot.time)
            for key, metric in METRICS.items():
                buf = self._values.get((gpu.index, key))
                if buf is None:
                    buf = self._values[(gpu.index, key)] = deque(maxlen=self.length)
                buf.append(None if gpu.lost else metric.value(gpu))
                if not gpu.lost:
                    scale = metric.scale(gpu)
                    if scale:
                        self._scale[(gpu.index, key)] = scale

    def clear(self) -> None:
        """Forget every sample (a replay that jumps back starts its graphs again)."""
        self._times.clear()
        self._values.clear()
        self._scale.clear()

    def gpus(self) -> list[int]:
        """GPU indices seen so far."""
        return sorted(self._times)

    def __len__(self) -> int:
        return max((len(t) for t in self._times.values()), default=0)

    def values(self, index: int, metric: str) -> list[float | None]:
        """All buffered values of one GPU's metric, oldest first."""
        return list(self._values.get((index, metric), ()))

    def times(self, index: int) -> list[float]:
        return list(self._times.get(index, ()))

    def window(self, index: int, metric: str, seconds: float) -> list[float | None]:
        """The values of the last ``seconds`` (by sample time), oldest first."""
        values = self._values.get((index, metric))
        if values is None:
            return []
        n = self._in_window(index, seconds)
        return list(itertools.islice(values, max(0, len(values) - n), None))

    def window_times(self, index: int, seconds: float) -> list[float]:
        """The times of the samples :meth:`window` returns, oldest first."""
        times = self._times.get(index)
        if not times:
            return []
        n = self._in_window(index, seconds)
        return list(itertools.islice(times, max(0, len(times) - n), None))

    def _in_window(self, index: int, seconds: float) -> int:
        """How many of the newest samples lie in the last ``seconds`` (at least one)."""
        times = self._times.get(index)
        if not times:
            return 0
        since = times[-1] - seconds
        n = 0
        # Walk back from the newest sample; cheaper than scanning all 1200.
        for t in reversed(times):
            if t <= since:
                break
            n += 1
        return max(n, 1)

    def scale(self, index: int, metric: str) -> float | None:
        """The latest full-scale value for the metric on that GPU."""
        return self._scale.get((index, metric))

    def last(self, index: int, metric: str) -> float | None:
        buf = self._values.get((index, metric))
        return buf[-1] if buf else None


def bucket(values: list[float | None], width: int) -> list[float | None]:
    """Squeeze (or keep) ``values`` into at most ``width`` columns.

    Each column is the mean of its samples, so a 10 minute window fits any
    width; a column whose samples are all missing stays ``None``.
    """
    if width <= 0:
        return []
    n = len(values)
    if n <= width:
        return list(values)
    edges = [col * n // width for col in range(width + 1)]
    if None not in values:
        # Prefix sums: one pass over the samples, then one subtraction per column.
        present = cast("list[float]", values)
        sums: list[float] = [0.0, *itertools.accumulate(present)]
        return [(sums[hi] - sums[lo]) / (hi - lo) for lo, hi in itertools.pairwise(edges)]
    out: list[float | None] = []
    for lo, hi in itertools.pairwise(edges):
        chunk = [v for v in values[lo:hi] if v is not None]
        out.append(sum(chunk) / len(chunk) if chunk else None)
    return out
