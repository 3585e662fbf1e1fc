"""A run beside simulated GPUs: every figure read from them says SIMULATED, wherever it is
shown (the run's last line, ``runs show``, ``runs compare``, ``energy``), and its peak VRAM
is the run's own, not the simulated card's."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpustation.runs.store.index import RunStore
from gpustation.runs.summary import RunSummary
from tests.conftest import child_env, gpustation_cmd
from tests.control.conftest import cli
from tests.runs.conftest import RunsEnv, command_preset

TIMEOUT_S = 120


def gs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpustation_cmd(*args), capture_output=True, text=True, env=child_env(), timeout=TIMEOUT_S
    )


def _lines(text: str, label: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip().startswith(label)]


def test_a_run_on_simulated_gpus_is_marked_wherever_its_gpu_figures_show(
    runs_env: RunsEnv,
) -> None:
    write_preset = runs_env["write_preset"]
    write_preset("tiny", command_preset("tiny", "train_ok", "--steps", "5", "--sleep", "0.2"))
    done = gs("run", "tiny")
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "GPU energy" in last and last.endswith("Wh SIMULATED"), last

    (record,) = RunStore().list_runs()
    assert record.simulated and record.energy_j
    # The run said its own peak was 1,005 MiB; the simulated card's memory is no figure of it.
    assert record.peak_vram_mib == pytest.approx(1005.0)

    shown = gs("runs", "show", record.id)
    assert shown.returncode == 0, shown.stderr
    for label in ("energy  ", "energy per", "power avg", "peak temperature", "throttled"):
        (line,) = _lines(shown.stdout, label)
        assert line.endswith("SIMULATED"), line
    (vram,) = _lines(shown.stdout, "peak VRAM")
    assert "1005 MiB" in vram and "SIMULATED" not in vram

    listed = gs("runs", "list")
    assert "Wh SIMULATED" in listed.stdout or "J SIMULATED" in listed.stdout


def test_compare_marks_each_simulated_cell_and_energy_keeps_them_apart(
    gpustation_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    store = RunStore()
    for run_id, simulated, joules in (("real", False, 3.6e6), ("sim", True, 7.2e6)):
        store.upsert(
            RunSummary(
                id=run_id,
                preset="p",
                status="succeeded",
                started_at=1.7e9,
                energy_j=joules,
                avg_power_w=300.0,
                peak_temp_c=60.0,
                simulated=simulated,
                final_loss=0.5,
            )
        )
    code, out, _ = cli(capsys, "runs", "compare", "real", "sim")
    assert code == 0
    for label in ("energy (kWh)", "avg power (W)", "peak temp"):
        (line,) = _lines(out, label)
        cells = line.split()
        # The real run's cell has no mark, the simulated run's has it.
        assert line.count("SIMULATED") == 1 and cells[-1].rstrip(")") in ("SIMULATED", "%"), line
    (loss,) = _lines(out, "final loss")
    assert "SIMULATED" not in loss

    code, out, _ = cli(capsys, "energy", "--since", "100000d", "--by", "preset")
    assert code == 0
    (total,) = _lines(out, "total  ")
    (sim_total,) = _lines(out, "total SIMULATED")
    assert total.split()[-1] == "1.000" and sim_total.split()[-1] == "2.000"
    code, out, _ = cli(capsys, "energy", "--since", "100000d", "--by", "preset", "--json")
    rows = {row["simulated"]: row for row in json.loads(out)}
    assert rows[False]["kwh"] == pytest.approx(1.0) and rows[True]["kwh"] == pytest.approx(2.0)
