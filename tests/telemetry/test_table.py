"""The snapshot table renders the real H200 document and missing values."""

from __future__ import annotations

import json
from pathlib import Path

from gpustation.telemetry.model import GpuSample, Snapshot
from gpustation.telemetry.table import render_snapshot

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "h200-snapshot.json"


def _h200() -> Snapshot:
    return Snapshot.from_dict(json.loads(FIXTURE.read_text()))


def test_real_h200_document_renders_its_values() -> None:
    snap = _h200()
    g = snap.gpus[0]
    text = render_snapshot(snap)
    row = next(line for line in text.splitlines() if line.startswith("0 NVIDIA H200"))
    assert "no fans" in row
    assert f"/{g.power_limit_w:.0f}" in row and g.power_limit_w == 700
    assert "Gen5 x16/Gen5 x16" in row
    assert f"{g.temperature_c:.0f}/{g.temperature_slowdown_c:.0f}" in row
    assert "SIMULATED" not in text
    assert f"driver {snap.driver_version}" in text
    assert "\x1b[" not in text  # no colour unless asked for


def test_missing_values_read_na_and_a_lost_gpu_says_so() -> None:
    snap = _h200()
    snap.gpus[0].temperature_c = None
    snap.gpus[0].throttle_reasons = None
    snap.gpus.append(GpuSample(index=1, name="NVIDIA H200", lost=True))
    lines = render_snapshot(snap).splitlines()
    row0 = next(line for line in lines if line.startswith("0 NVIDIA H200"))
    assert row0.split()[3].startswith("n/a/")  # temperature column
    assert row0.rstrip().endswith("n/a")  # throttle column
    row1 = next(line for line in lines if line.startswith("1 NVIDIA H200"))
    assert "GPU LOST" in row1


def test_simulated_snapshots_are_labelled_and_colour_is_optional() -> None:
    snap = _h200()
    snap.simulated = True
    plain = render_snapshot(snap)
    assert plain.splitlines()[0].startswith(" SIMULATED ")
    coloured = render_snapshot(snap, color=True)
    assert "\x1b[" in coloured and "SIMULATED" in coloured
