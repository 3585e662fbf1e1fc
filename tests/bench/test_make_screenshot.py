"""The README's runs picture is made from a live run: ``bench/make_screenshot.py runs``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools import missing

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_the_runs_picture_shows_a_live_lora_run_with_its_loss_curve(tmp_path: Path) -> None:
    for module in ("torch", "peft"):
        if importlib.util.find_spec(module) is None:
            missing(f"{module} (the 'train' extra)")
    out = tmp_path / "runs.svg"
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "make_screenshot.py"), "runs", str(out)],
        capture_output=True,
        text=True,
        timeout=360,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    svg = out.read_text()
    # an SVG renders spaces as &#160;
    text = svg.replace("&#160;", " ")
    assert "lora-tiny" in text and "running" in text and "SIMULATED" in text
    assert "eval loss" in text and "smoothed" in text  # the curve's legend: it was drawn
    assert "tokens/s" in text  # the run's own log lines reached the pane
    # the run went to the script's own temporary directories, not the caller's
    data = os.environ.get("GPUSTATION_DATA_DIR")
    assert data is None or not list(Path(data).glob("runs/*"))
