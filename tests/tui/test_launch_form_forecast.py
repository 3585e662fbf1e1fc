"""The launch form's forecast line: made from the preset's history in a worker, again as the
settings change, against the GPUs' free memory the dashboard last sampled."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from textual.app import App
from textual.widgets import Checkbox, DataTable, Static

from gpustation.runs import rundir
from gpustation.runs.forecast.model import GpuRoom
from gpustation.runs.presets import RunPreset, load_preset_file
from gpustation.runs.store.index import sync_run
from gpustation.tui.modes import SCREENS_BY_MODE
from gpustation.tui.runs import LaunchDialog, LaunchRequest

from .conftest import BUILTIN_SCREENS, make_app, runs_ui, wait_for
from .pastruns import write_run
from .test_launch_form import fake_options, field

pytestmark = pytest.mark.timeout(120)

RUNS_ENTRY = next(e for e in SCREENS_BY_MODE if e.mode == "runs")
ROOMS = [GpuRoom(0, 24576.0, 4096.0, 450.0), GpuRoom(1, 24576.0, 23552.0, 450.0)]


def preset(name: str = "fake-train") -> RunPreset:
    return RunPreset(
        name=name,
        title="Fake training",
        runner="resnet",
        gpus=1,
        args={"steps": 150, "lr": 0.1, "precision": "bf16", "compile": True},
    )


def with_peak(directory: Path, peak_mib: float) -> None:
    """The run reported its peak memory too (on simulated GPUs its own is its peak)."""
    with open(directory / rundir.METRICS_FILE, "a") as fh:
        fh.write(f'{{"t": 75.0, "mem_peak_mib": {peak_mib}}}\n')
    sync_run(directory)


class FormApp(App[None]):
    """The form alone, on two GPUs of which the second is nearly full."""

    def __init__(self, preset: RunPreset) -> None:
        super().__init__()
        self.preset = preset
        self.result: list[LaunchRequest | None] = []

    def on_mount(self) -> None:
        dialog = LaunchDialog(self.preset, 2, options=fake_options(), rooms=ROOMS, simulated=True)
        self.push_screen(dialog, self.result.append)


def forecast_text(dialog: LaunchDialog) -> str:
    return str(dialog.query_one("#launch-forecast", Static).render())


async def test_the_forecast_follows_the_fields_and_the_gpus(
    gpustation_dirs: dict[str, Path],
) -> None:
    runs = gpustation_dirs["data"] / "runs"
    for n in range(3):
        # 150 steps reported at 0.5 s a step; 754 s in all; 7.5 GiB at its peak
        run_id = f"2023111{n}-000000-fake-train-{n:04x}"
        with_peak(write_run(runs, run_id, preset(), telemetry=True), 7680.0)
    app = FormApp(preset())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchDialog))
        dialog = app.screen
        assert isinstance(dialog, LaunchDialog)
        await wait_for(pilot, lambda: "past runs" in forecast_text(dialog))
        line = forecast_text(dialog)
        assert line.startswith("forecast: about 12 min 34 s, ") and "SIMULATED" in line
        assert "fits, 7.5 GiB of 20.0 GiB free on GPU 0" in line
        assert "from 3 past runs of fake-train" in line and "extrapolated" not in line

        # twice the steps: only the stepping doubles (75 s more)
        steps = field(dialog, "steps")
        steps.value = "300"
        await wait_for(pilot, lambda: "steps 150 -> 300 extrapolated" in forecast_text(dialog))
        assert "about 13 min 49 s" in forecast_text(dialog)

        # GPU 1 has 1 GiB free: the peak no longer fits there
        dialog.query_one("#gpu-0", Checkbox).value = False
        dialog.query_one("#gpu-1", Checkbox).value = True
        await wait_for(pilot, lambda: "on GPU 1" in forecast_text(dialog))
        assert "will not fit: needs about 7.5 GiB, 1.0 GiB free on GPU 1" in forecast_text(dialog)

        # another precision: none of the history ran so; said, not hidden
        field(dialog, "precision").value = "fp16"
        await wait_for(pilot, lambda: "precision differ" in forecast_text(dialog))
        await pilot.press("escape")


async def test_a_preset_that_never_ran_names_the_probe(gpustation_dirs: dict[str, Path]) -> None:
    app = FormApp(preset("fresh"))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchDialog))
        dialog = app.screen
        assert isinstance(dialog, LaunchDialog)
        await wait_for(pilot, lambda: "never ran here" in forecast_text(dialog))
        assert "`gpustation run fresh --dry-run --probe`" in forecast_text(dialog)


async def test_the_runs_screen_gives_the_form_the_gpus_it_samples(
    gpustation_dirs: dict[str, Path], tmp_path: Path
) -> None:
    preset_dir = gpustation_dirs["config"] / "presets" / "runs"
    preset_dir.mkdir(parents=True)
    trainer = tmp_path / "trainer.py"
    trainer.write_text("print('hi')\n")
    (preset_dir / "again.toml").write_text(
        f'title = "Again"\ncommand = ["{sys.executable}", "{trainer}"]\ngpus = 1\n'
        "[args]\nsteps = 150\n"
    )
    again, problems = load_preset_file(preset_dir / "again.toml")
    assert again is not None, problems
    run_dir = write_run(
        gpustation_dirs["data"] / "runs", "again-20231114-221320-ab12", again, telemetry=True
    )
    with_peak(run_dir, 2048.0)
    app, _ = make_app(count=2, screens=[*BUILTIN_SCREENS, RUNS_ENTRY])
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.frame is not None)
        await pilot.press("r")
        ui = runs_ui(app)
        await wait_for(pilot, lambda: run_dir.name in ui.history_ids and ui.presets is not None)
        table = app.screen.query_one("#runs-table", DataTable)
        table.focus()
        table.move_cursor(row=table.get_row_index(run_dir.name))
        await wait_for(pilot, lambda: ui.selected == run_dir.name)
        await pilot.press("g")  # run again: the form, with the run's settings
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchDialog))
        dialog = app.screen
        assert isinstance(dialog, LaunchDialog)
        await wait_for(pilot, lambda: "past run" in forecast_text(dialog))
        line = forecast_text(dialog)
        assert "from 1 past run of again" in line and "SIMULATED" in line
        assert "free on GPU 0" in line  # the simulated card's memory, as sampled
        await pilot.press("escape")
