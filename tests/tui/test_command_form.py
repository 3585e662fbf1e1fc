"""The command form: any command launched from the runs screen as a supervised run."""

from __future__ import annotations

import shlex
import sys
from typing import Any

import pytest
from textual.widgets import Button, Checkbox, Input, Label, Static, TextArea

from gpustation.runs import rundir
from gpustation.tui.runs import LaunchDialog, RunsScreen, poller
from gpustation.tui.runs.command_form import CommandDialog, split_command

from .conftest import wait_for
from .test_runs_screen import highlight_preset, log_text, make_app, open_runs
from .test_runs_screen import presets as presets  # the fixture: user presets, runs stopped after

pytestmark = pytest.mark.timeout(120)

SCRIPT = (
    'import os; print("from the form:", os.environ["GREETING"], os.environ["CUDA_VISIBLE_DEVICES"])'
)


def error(dialog: CommandDialog) -> str:
    return str(dialog.query_one("#command-error", Label).render())


def argv(dialog: CommandDialog) -> str:
    return str(dialog.query_one("#command-argv", Static).render())


@pytest.mark.parametrize("found_first", [False, True], ids=["launched", "found-while-starting"])
async def test_any_command_from_the_form_runs_supervised_and_its_output_reaches_the_log(
    presets: dict[str, Any], monkeypatch: pytest.MonkeyPatch, found_first: bool
) -> None:
    if found_first:
        # The screen looks for runs going on every pass: it finds the run while its
        # launch is still waiting for it to start, before the launch returns.
        monkeypatch.setattr(poller, "DISCOVER_EVERY_S", 0.0)
    app, _ = make_app(count=2)
    async with app.run_test(size=(160, 48)) as pilot:
        ui = await open_runs(pilot)
        before = set(ui.views)
        await highlight_preset(pilot, "a-train")
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchDialog))
        await pilot.click("#command")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandDialog))
        dialog = app.screen
        assert isinstance(dialog, CommandDialog)
        launch = dialog.query_one("#launch", Button)
        # empty: nothing to launch, and the form says what it needs
        assert launch.disabled and "give the command to run" in error(dialog)
        # the GPUs the preset form had chosen carry over
        assert [b.value for b in dialog.query("#command-gpus Checkbox").results(Checkbox)] == [
            True,
            False,
        ]
        line = dialog.query_one("#command-line", Input)
        await wait_for(pilot, lambda: line.has_focus)
        await pilot.press(*"python -c 'print(1)")
        assert launch.disabled and "No closing quotation" in error(dialog)
        line.value = f"{shlex.quote(sys.executable)} -c {shlex.quote(SCRIPT)}"
        await pilot.pause()
        assert not launch.disabled and error(dialog) == ""
        # environment lines: checked as --env is, shown in the argv line
        env = dialog.query_one("#command-env", TextArea)
        env.focus()
        await pilot.press(*"1X=2")
        await pilot.pause()
        assert launch.disabled and "env '1X=2': expected KEY=VALUE" in error(dialog)
        env.text = "\nGREETING=hello there\n"
        dialog.query_one("#command-name", Input).value = "greeter"
        await pilot.pause()
        shown = argv(dialog)
        assert shown.startswith("CUDA_VISIBLE_DEVICES=0 GREETING='hello there' python -c "), shown
        assert not launch.disabled
        line.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        await wait_for(pilot, lambda: set(ui.views) - before != set(), timeout=40)
        (new,) = set(ui.views) - before
        view = ui.views[new]
        await wait_for(pilot, lambda: view.status == "succeeded", timeout=40)
        await wait_for(pilot, lambda: "from the form: hello there 0" in log_text(app))
        # the same run as `gpustation run --name greeter --env ... -- COMMAND`
        run = rundir.read_run(view.run_dir) or {}
        assert view.preset == "greeter" and view.gpus == [0]
        assert run["preset"]["command"] == [sys.executable, "-c", SCRIPT]
        # the child had the value (above); run.json keeps only the name
        assert run["preset"]["env"] == {"GREETING": "***"}
        assert run["preset"]["origin"] == "command"


async def test_cancelling_the_command_form_goes_back_to_the_preset_form(
    presets: dict[str, Any],
) -> None:
    app, _ = make_app(count=2)
    async with app.run_test(size=(100, 30)) as pilot:
        ui = await open_runs(pilot)
        await highlight_preset(pilot, "a-train")
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchDialog))
        await pilot.click("#command")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandDialog))
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchDialog))
        assert not ui.launching and not ui.live_active()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", ["give the command to run"]),
        ("   ", ["give the command to run"]),
        ("python 'x", ["No closing quotation"]),
        ("python x\\", ["No escaped character"]),
    ],
)
def test_a_command_line_that_cannot_be_split_says_why(text: str, words: list[str]) -> None:
    from gpustation.errors import UsageError

    with pytest.raises(UsageError) as caught:
        split_command(text)
    assert all(w in str(caught.value) for w in words)


def test_a_command_line_splits_as_a_shell_would() -> None:
    assert split_command("python -c 'print(1)' --lr=3e-4 \"a b\"") == [
        "python",
        "-c",
        "print(1)",
        "--lr=3e-4",
        "a b",
    ]
