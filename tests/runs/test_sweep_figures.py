"""A sweep point's figures from its run directory: warm-up left out, power honest."""

from __future__ import annotations

import json
from pathlib import Path

from gpustation.runs import rundir
from gpustation.runs.sweep.report import point_figures


def write_point(directory: Path, readings_w: list[float], counter_w: float) -> None:
    """A point whose power readings stay at ``readings_w`` while the energy
    counter moves at ``counter_w`` a second (power that swings between readings)."""
    directory.mkdir()
    t0 = 1_000.0
    with open(directory / rundir.TELEMETRY_FILE, "w") as fh:
        for i, watts in enumerate(readings_w):
            gpu = {"index": 0, "power_w": watts, "energy_j": 5_000.0 + counter_w * i,
                   "temperature_c": 50, "memory_used_mib": 1000}  # fmt: skip
            fh.write(json.dumps({"t": float(i), "time": t0 + i, "gpus": [gpu]}) + "\n")
    with open(directory / rundir.METRICS_FILE, "w") as fh:
        for i in range(1, len(readings_w)):
            fh.write(json.dumps({"step": i, "time": t0 + i, "throughput": 100.0,
                                 "unit": "img/s"}) + "\n")  # fmt: skip


def test_energy_per_unit_from_the_counter_and_peak_never_below_the_mean(tmp_path: Path) -> None:
    point = tmp_path / "p"
    write_point(point, readings_w=[300.0] * 11, counter_w=600.0)
    f = point_figures(point)
    assert f["throughput"] == 100.0 and f["work_unit"] == "img"
    assert abs(f["avg_power_w"] - 600.0) < 1e-6  # the counter, which sees between readings
    assert abs(f["energy_per_unit_j"] - 6.0) < 1e-6
    assert f["peak_power_w"] >= f["avg_power_w"]  # a 1 s mean from the counter is a peak too


def test_peak_is_the_highest_reading_when_the_readings_are_higher(tmp_path: Path) -> None:
    point = tmp_path / "p"
    write_point(point, readings_w=[200.0, 650.0, 200.0, 200.0, 200.0], counter_w=250.0)
    f = point_figures(point)
    assert f["peak_power_w"] == 650.0
    assert f["peak_temp_c"] == 50 and f["peak_vram_mib"] == 1000
