"""The launch form: fields from the runner's own parser, the argv, save as preset, run again."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from textual.app import App
from textual.widgets import Button, Checkbox, DataTable, Input, Label, Select, Static, Switch

from gpustation.runs.launch.runner_args import RunnerArg, read_parser
from gpustation.runs.presets import RunPreset, load_preset_file
from gpustation.tui.modes import SCREENS_BY_MODE
from gpustation.tui.runs import LaunchDialog, LaunchRequest

from .conftest import BUILTIN_SCREENS, make_app, runs_ui, wait_for
from .pastruns import write_run

pytestmark = pytest.mark.timeout(120)

RUNS_ENTRY = next(e for e in SCREENS_BY_MODE if e.mode == "runs")
_OPTIONS: list[RunnerArg] = []


def fake_options() -> list[RunnerArg]:
    """tests/tui/fake_runner.py's parser, read the way the form reads a runner's (once)."""
    if not _OPTIONS:
        _OPTIONS.extend(read_parser("tests.tui.fake_runner"))
    return _OPTIONS


def test_a_runner_s_parser_is_read_in_a_child_process(gpustation_dirs: dict[str, Path]) -> None:
    options = {o.dest: o for o in fake_options()}
    assert "simulate_oom_at_step" not in options  # hidden options stay hidden
    assert options["steps"].kind == "int" and options["steps"].default == 100
    assert options["lr"].kind == "float"
    assert options["precision"].kind == "choice"
    assert options["precision"].choices == ("fp32", "bf16", "fp16")
    assert options["compile"].kind == "bool" and options["compile"].default is True
    assert options["compile"].flags == ("--compile", "--no-compile")
    assert options["device"].default is None
    assert options["steps"].help == "optimizer steps to run"


class FormApp(App[None]):
    """Just the form, on a machine with two GPUs; keeps what it was dismissed with."""

    def __init__(self, preset: RunPreset) -> None:
        super().__init__()
        self.preset = preset
        self.result: list[LaunchRequest | None] = []

    def on_mount(self) -> None:
        dialog = LaunchDialog(self.preset, 2, options=fake_options())
        self.push_screen(dialog, self.result.append)


def preset() -> RunPreset:
    return RunPreset(
        name="fake-train",
        title="Fake training",
        runner="resnet",  # a runner that exists, so a saved preset loads back
        gpus=1,
        args={"steps": 100, "lr": 0.1, "precision": "bf16", "compile": True},
    )


def field(dialog: LaunchDialog, key: str) -> Any:
    return dialog.query_one(f"#arg-{dialog.keys.index(key)}")


def argv(dialog: LaunchDialog) -> str:
    return str(dialog.query_one("#launch-argv", Static).render())


async def test_fields_follow_the_parser_and_the_argv_follows_the_fields(
    gpustation_dirs: dict[str, Path],
) -> None:
    app = FormApp(preset())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchDialog))
        dialog = app.screen
        assert isinstance(dialog, LaunchDialog)
        assert isinstance(field(dialog, "precision"), Select)
        assert isinstance(field(dialog, "compile"), Switch)
        assert isinstance(field(dialog, "steps"), Input)
        helps = [str(label.render()) for label in dialog.query(".launch-help").results(Label)]
        assert "optimizer steps to run" in helps and "number format" in helps
        assert "CUDA_VISIBLE_DEVICES=0 python -m gpustation.runners.resnet" in argv(dialog)
        assert "--precision bf16 --compile" in argv(dialog)

        # Choose a Select option and flip the Switch: the argv follows.
        precision = field(dialog, "precision")
        precision.focus()
        await pilot.press("enter")  # opens the list
        await pilot.pause()
        await pilot.press("down", "enter")  # bf16 -> fp16
        await wait_for(pilot, lambda: precision.value == "fp16")
        field(dialog, "compile").toggle()
        await wait_for(pilot, lambda: "--precision fp16 --no-compile" in argv(dialog))

        # A bad number is refused with a message and the launch button is disabled.
        lr = field(dialog, "lr")
        lr.focus()
        await pilot.press(*["backspace"] * 3, *"fast")
        launch = dialog.query_one("#launch", Button)
        await wait_for(pilot, lambda: launch.disabled)
        error = str(dialog.query_one("#launch-error", Label).render())
        assert "lr: expected a number" in error, error
        await pilot.press("enter")
        assert isinstance(app.screen, LaunchDialog) and app.result == []
        await pilot.press(*["backspace"] * 4, *"0.02")
        await wait_for(pilot, lambda: not launch.disabled and "--lr 0.02" in argv(dialog))

        # An option the preset does not list is added from the parser's others.
        add = dialog.query_one("#launch-add", Select)
        options = [value for _, value in add._options]
        assert "device" in options and "seed" in options and "steps" not in options
        add.value = "device"
        await wait_for(pilot, lambda: "device" in dialog.keys)
        device = field(dialog, "device")
        assert isinstance(device, Select)
        device.value = "cpu"
        await wait_for(pilot, lambda: "--device cpu" in argv(dialog))

        # The GPUs are checkboxes.
        dialog.query_one("#gpu-1", Checkbox).value = True
        await wait_for(pilot, lambda: "CUDA_VISIBLE_DEVICES=0,1 " in argv(dialog))
        await pilot.click("#launch")
        await wait_for(pilot, lambda: bool(app.result))
    (request,) = app.result
    assert request is not None
    # the fields' typed values, handed on as they are (no text to parse again)
    assert request.overrides == {"compile": False, "lr": 0.02, "precision": "fp16", "device": "cpu"}
    assert request.gpus == [0, 1]


async def test_save_as_preset_writes_a_user_preset_that_loads_back(
    gpustation_dirs: dict[str, Path],
) -> None:
    app = FormApp(preset())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchDialog))
        dialog = app.screen
        assert isinstance(dialog, LaunchDialog)
        field(dialog, "steps").value = "500"
        field(dialog, "compile").value = False
        dialog.query_one("#gpu-1", Checkbox).value = True
        name = dialog.query_one("#launch-save-name", Input)
        name.value = "bad name!"
        await pilot.click("#save")
        await wait_for(
            pilot,
            lambda: (
                "cannot name a preset" in str(dialog.query_one("#launch-error", Label).render())
            ),
        )
        name.value = "my-fake"
        path = gpustation_dirs["config"] / "presets" / "runs" / "my-fake.toml"
        name.focus()
        await pilot.press("enter")  # Enter in the name field saves too
        error = dialog.query_one("#launch-error", Label)
        await wait_for(pilot, lambda: path.exists() or "not saved" in str(error.render()))
        assert path.exists(), str(error.render())
        assert isinstance(app.screen, LaunchDialog)  # saving does not launch
    saved, problems = load_preset_file(path)
    assert problems == [] and saved is not None
    assert saved.name == "my-fake" and saved.runner == "resnet" and saved.origin == "user"
    assert saved.args == {"steps": 500, "lr": 0.1, "precision": "bf16", "compile": False}
    assert saved.gpus == [0, 1]


async def test_run_again_opens_the_form_with_the_run_s_settings(
    gpustation_dirs: dict[str, Path], tmp_path: Path
) -> None:
    preset_dir = gpustation_dirs["config"] / "presets" / "runs"
    preset_dir.mkdir(parents=True)
    trainer = tmp_path / "trainer.py"
    trainer.write_text("print('hi')\n")
    (preset_dir / "again.toml").write_text(
        f'title = "Again"\ncommand = ["{sys.executable}", "{trainer}"]\ngpus = 1\n'
        "[args]\nsteps = 100000\nsleep = 0.05\nfast = false\n"
    )
    again, problems = load_preset_file(preset_dir / "again.toml")
    assert again is not None, problems
    run_dir = write_run(
        gpustation_dirs["data"] / "runs",
        "again-20231114-221320-ab12",
        again,
        overrides={"steps": 42, "fast": True},
        gpus=[1],
    )
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
        await pilot.press("g")
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchDialog))
        dialog = app.screen
        assert isinstance(dialog, LaunchDialog)
        assert dialog.preset.name == "again"
        assert field(dialog, "steps").value == "42"
        assert field(dialog, "sleep").value == "0.05"
        assert field(dialog, "fast").value is True
        boxes = [b.value for b in dialog.query("#launch-gpus Checkbox").results(Checkbox)]
        assert boxes == [False, True]
        await wait_for(pilot, lambda: "--steps 42" in argv(dialog) and "--fast" in argv(dialog))
        await pilot.press("escape")


def test_a_saved_preset_keeps_odd_values_and_refuses_bad_names(
    gpustation_dirs: dict[str, Path],
) -> None:
    from gpustation.errors import UsageError
    from gpustation.runs.preset_writer import write_user_preset

    source = RunPreset(
        name="src",
        title='Quotes " and \\ and ünïcode',
        runner="resnet",
        tags=["a", "b"],
        env={"NCCL_DEBUG": "WARN"},
        args={"model": 'x"y', "lr": 1e-4, "sizes": [1, 2], "compile": False},
    )
    path = write_user_preset("odd.values_1", source, dict(source.args), [0])
    loaded, problems = load_preset_file(path)
    assert problems == [] and loaded is not None
    assert loaded.title == source.title and loaded.args == source.args
    assert loaded.env == source.env and loaded.tags == ["a", "b"] and loaded.gpus == [0]
    for bad in ("", "../x", "a b", "-x"):
        with pytest.raises(UsageError):
            write_user_preset(bad, source, {}, None)
    assert sorted(p.name for p in path.parent.iterdir()) == ["odd.values_1.toml"]


def test_a_past_run_opened_again_leaves_out_the_values_its_run_json_does_not_keep() -> None:
    from gpustation.redact import REDACTED
    from gpustation.tui.runs.form import preset_of

    run = {
        "preset": {
            "name": "python",
            "command": [sys.executable, "-c", "pass"],
            "env": {"API_TOKEN": REDACTED, "OMP_NUM_THREADS": "1"},
        }
    }
    preset = preset_of(run, {})
    assert preset is not None and preset.env == {"OMP_NUM_THREADS": "1"}
