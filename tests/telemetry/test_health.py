"""The health rules stated at their edges: a threshold moved by one, a rule
turned round or a name left long fails here."""

from __future__ import annotations

import pytest

from gpustation.telemetry import health
from gpustation.telemetry.model import GpuSample, PcieInfo


def gpu(**kw: object) -> GpuSample:
    return GpuSample(index=0, name="NVIDIA H200", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("temperature_c", "band"),
    [
        (84.0, health.CRITICAL),  # 5 below slowdown: critical, the edge included
        (83.9, health.HOT),
        (74.0, health.HOT),  # 15 below: still hot
        (73.9, health.WARM),
        (59.0, health.WARM),  # 30 below: still warm
        (58.9, health.COOL),
        (20.0, health.COOL),
    ],
)
def test_the_temperature_band_by_the_distance_to_slowdown(temperature_c: float, band: str) -> None:
    card = gpu(temperature_c=temperature_c, temperature_slowdown_c=89.0)
    assert health.temperature_band(card) == band
    assert health.near_slowdown(card) is (band == health.CRITICAL)


def test_no_band_without_both_temperatures() -> None:
    assert health.temperature_band(gpu(temperature_c=80.0)) is None
    assert health.temperature_band(gpu(temperature_slowdown_c=89.0)) is None
    assert not health.near_slowdown(gpu())


def test_only_the_reasons_that_hold_a_card_back_count() -> None:
    held = gpu(throttle_reasons=["gpu_idle", "sw_power_cap", "hw_thermal", "sync_boost"])
    assert health.limiting_reasons(held) == ["sw_power_cap", "hw_thermal"]
    assert health.is_limited(held)
    idle = gpu(throttle_reasons=["gpu_idle"])
    assert health.limiting_reasons(idle) == [] and not health.is_limited(idle)
    assert health.limiting_reasons(gpu()) == [] and not health.is_limited(gpu())


def test_a_slow_link_matters_only_above_the_busy_threshold() -> None:
    slow = PcieInfo(gen=3, width=16, max_gen=5, max_width=16)
    assert slow.below_max
    assert health.slow_link_under_load(gpu(pcie=slow, utilization_gpu_pct=21.0))
    assert not health.slow_link_under_load(gpu(pcie=slow, utilization_gpu_pct=20.0))
    assert not health.slow_link_under_load(gpu(pcie=slow))
    full = PcieInfo(gen=5, width=16, max_gen=5, max_width=16)
    assert not health.slow_link_under_load(gpu(pcie=full, utilization_gpu_pct=99.0))


def test_vram_is_full_above_95_percent() -> None:
    assert health.vram_full(gpu(memory_used_mib=95.1, memory_total_mib=100.0))
    assert not health.vram_full(gpu(memory_used_mib=95.0, memory_total_mib=100.0))
    assert not health.vram_full(gpu(memory_total_mib=100.0))


def test_unowned_memory_is_worth_a_line_from_a_gib_or_one_percent() -> None:
    small = dict(memory_total_mib=24_000.0)
    assert health.unowned_worth_noting(gpu(unowned_memory_mib=1024.0, **small))
    assert not health.unowned_worth_noting(gpu(unowned_memory_mib=1023.0, **small))
    big = dict(memory_total_mib=143_771.0)  # 1 % of it is above a GiB
    assert not health.unowned_worth_noting(gpu(unowned_memory_mib=1200.0, **big))
    assert health.unowned_worth_noting(gpu(unowned_memory_mib=1437.71, **big))
    # an unknown total: a GiB is the measure
    assert health.unowned_worth_noting(gpu(unowned_memory_mib=1024.0))
    assert not health.unowned_worth_noting(gpu(unowned_memory_mib=None, **small))


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("NVIDIA GeForce RTX 4090 (simulated)", "RTX 4090 (sim)"),
        ("NVIDIA H200", "H200"),
        ("Tesla V100-SXM2-16GB", "V100-SXM2-16GB"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("", "unknown GPU"),
        (None, "unknown GPU"),
    ],
)
def test_short_names(name: str | None, short: str) -> None:
    assert health.short_name(name) == short
