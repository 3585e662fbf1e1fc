"""A run's telemetry keeps its GPUs' memory temperature; the run's record and
``runs show`` give its peak."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpustation.runs.gputrace import compact_sample, summarize_telemetry
from gpustation.runs.store.index import apply_telemetry
from gpustation.runs.summary import RunSummary
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend


def test_each_telemetry_line_has_the_memory_temperature_hbm_cards_report() -> None:
    for card, reported in (("h200", True), ("rtx4090", False)):
        sim = SimBackend(count=1, card=card, state_path=None, clock=lambda: 1e6)
        line = compact_sample(Sampler(sim, with_host=False, clock=lambda: 1e6).sample(), 1.0)
        value = line["gpus"][0]["memory_temperature_c"]
        assert (value is not None) is reported


def test_the_peak_memory_temperature_reaches_runs_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "telemetry.jsonl"
    rows = [
        {"t": 0, "gpus": [{"index": 0, "power_w": 100, "memory_temperature_c": 41}]},
        {"t": 1, "gpus": [{"index": 0, "power_w": 600, "memory_temperature_c": 78.5}]},
        {"t": 2, "gpus": [{"index": 0, "power_w": 500, "memory_temperature_c": 77}]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tele = summarize_telemetry(path)
    assert tele.peak_memory_temp_c == 78.5
    record = apply_telemetry(RunSummary(id="r1"), tele, tmp_path)
    assert record.peak_memory_temp_c == 78.5

    from gpustation.commands.runs import _print_show

    _print_show(record)
    assert "peak memory temperature  78 °C" in capsys.readouterr().out


def test_runs_on_gddr_cards_have_no_memory_peak_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "telemetry.jsonl"
    path.write_text(json.dumps({"t": 0, "gpus": [{"index": 0, "memory_temperature_c": None}]}))
    record = apply_telemetry(RunSummary(id="r2"), summarize_telemetry(path), tmp_path)
    assert record.peak_memory_temp_c is None
    from gpustation.commands.runs import _print_show

    _print_show(record)
    assert "memory temperature" not in capsys.readouterr().out
