"""The README lists every dcgm-exporter name the exporter emits."""

from __future__ import annotations

from pathlib import Path

from gpustation.serve.exporter import _DCGM_GAUGES

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_dcgm_metric_the_exporter_emits_is_in_the_readme() -> None:
    text = README.read_text()
    names = [name for name, _, _ in _DCGM_GAUGES]
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in names
    missing = [name for name in names if f"`{name}`" not in text]
    assert missing == []
