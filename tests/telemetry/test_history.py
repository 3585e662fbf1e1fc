"""Ring buffers behind the history graphs."""

from __future__ import annotations

from gpustation.telemetry.model import GpuSample, Snapshot
from gpustation.telemetry.rings import DEFAULT_LENGTH, History, bucket


def snap(t: float, util: float | None, power: float = 100.0, lost: bool = False) -> Snapshot:
    g = GpuSample(
        index=0,
        lost=lost,
        utilization_gpu_pct=util,
        power_w=power,
        power_limit_w=450.0,
        power_max_w=600.0,
        memory_used_mib=1024.0,
        memory_total_mib=4096.0,
    )
    return Snapshot(hostname="h", time=t, gpus=[g])


def test_default_length_covers_ten_minutes_at_one_second_twice() -> None:
    assert DEFAULT_LENGTH >= 1200


def test_ring_keeps_only_the_last_n_samples_per_gpu_and_metric() -> None:
    h = History(length=5)
    for i in range(8):
        h.add(snap(float(i), float(i)))
    assert h.values(0, "util") == [3.0, 4.0, 5.0, 6.0, 7.0]
    assert h.times(0) == [3.0, 4.0, 5.0, 6.0, 7.0]
    assert h.values(0, "vram") == [25.0] * 5
    assert h.last(0, "power") == 100.0
    assert h.scale(0, "power") == 600.0  # the card's maximum is the graph's top
    assert len(h) == 5


def test_window_selects_by_sample_time_not_count() -> None:
    h = History()
    for i in range(100):
        h.add(snap(i * 2.0, float(i)))  # one sample every 2 s
    # the last 10 seconds hold 5 samples at a 2 s refresh
    assert h.window(0, "util", 10.0) == [95.0, 96.0, 97.0, 98.0, 99.0]


def test_missing_values_and_lost_gpus_are_gaps() -> None:
    h = History()
    h.add(snap(0.0, None))
    h.add(snap(1.0, 50.0, lost=True))
    h.add(snap(2.0, 70.0))
    assert h.values(0, "util") == [None, None, 70.0]


def test_bucket_squeezes_by_mean_and_keeps_gaps() -> None:
    assert bucket([1.0, 3.0, 5.0, 7.0], 2) == [2.0, 6.0]
    assert bucket([None, None, 4.0, 8.0], 2) == [None, 6.0]
    assert bucket([1.0, 2.0], 5) == [1.0, 2.0]
    assert bucket([1.0], 0) == []
    assert len(bucket([float(i) for i in range(600)], 150)) == 150
