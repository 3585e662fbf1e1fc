"""The README lists every dcgm-exporter name the exporter emits."""

from __future__ import annotations

from pathlib import Path

from gpustation.telemetry.promnames import GPU_SERIES

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_dcgm_metric_the_exporter_emits_is_in_the_readme() -> None:
    text = README.read_text()
    names = [s.name for s in GPU_SERIES if s.exported and s.name.startswith("DCGM_")]
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in names
    missing = [name for name in names if f"`{name}`" not in text]
    assert missing == []
