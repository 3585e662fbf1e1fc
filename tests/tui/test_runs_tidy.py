"""Tidying the history from the runs screen: delete (never a run going), notes and tags."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Label

from gpustation.runs import rundir
from gpustation.runs.launch.start import launch
from gpustation.runs.launch.stop import stop_run
from gpustation.runs.presets import RunPreset, load_presets
from gpustation.runs.store.index import RunStore
from gpustation.tui.runs import RunsScreen
from gpustation.tui.runs.tidy import DeleteRunsDialog, NoteDialog, TagDialog

from .conftest import BUILTIN_SCREENS, notifications, runs_ui, wait_for
from .conftest import make_app as make_dashboard
from .pastruns import write_run

pytestmark = pytest.mark.timeout(120)


def make_app() -> Any:
    from gpustation.tui.modes import SCREENS_BY_MODE

    runs = next(e for e in SCREENS_BY_MODE if e.mode == "runs")
    app, _ = make_dashboard(count=2, screens=[*BUILTIN_SCREENS, runs])
    return app


def past_runs(root: Path, specs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Finished runs of shipped presets (oldest first), indexed."""
    presets, _ = load_presets()
    ids = []
    for n, (name, overrides) in enumerate(specs):
        run_id = f"{name}-2023111{4 + n}-221320-ab{n:02d}"
        write_run(root, run_id, presets[name], overrides=overrides, started_at=1.7e9 + n * 3600)
        ids.append(run_id)
    return ids


async def open_runs(pilot: Pilot[Any], history: int) -> Any:
    app = pilot.app
    await wait_for(pilot, lambda: app.frame is not None)  # type: ignore[attr-defined]
    await pilot.press("r")
    ui = runs_ui(app)
    await wait_for(pilot, lambda: ui.presets is not None and len(ui.history_ids) == history)
    await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
    app.screen.query_one("#runs-table", DataTable).focus()
    await pilot.pause()
    return ui


async def select(pilot: Pilot[Any], run_id: str) -> None:
    table = pilot.app.screen.query_one("#runs-table", DataTable)
    ui = runs_ui(pilot.app)
    table.move_cursor(row=table.get_row_index(run_id))
    await wait_for(pilot, lambda: ui.selected == run_id)


def notes_cell(pilot: Pilot[Any], run_id: str) -> str:
    table = pilot.app.screen.query_one("#runs-table", DataTable)
    return str(table.get_cell(run_id, "notes"))


def tags_in(path: Path) -> list[str] | None:
    """The tags an annotations file holds (None while there is none)."""
    return json.loads(path.read_text()).get("tags") if path.exists() else None


def label(pilot: Pilot[Any], selector: str) -> str:
    return str(pilot.app.screen.query_one(selector, Label).render())


async def test_delete_marked_runs_after_naming_them(gpustation_dirs: dict[str, Path]) -> None:
    root = gpustation_dirs["data"] / "runs"
    old, kept, other = past_runs(
        root, [("resnet50-bf16", {}), ("lora-tiny", {}), ("resnet50-bf16", {"batch_size": 64})]
    )
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        ui = await open_runs(pilot, 3)
        for run_id in (old, other):
            await select(pilot, run_id)
            await pilot.press("space")
        await wait_for(pilot, lambda: ui.views[old].marked and ui.views[other].marked)
        await pilot.press("delete")
        await wait_for(pilot, lambda: isinstance(app.screen, DeleteRunsDialog))
        named = label(pilot, "#delete-runs")
        assert old in named and other in named and kept not in named
        assert "Delete 2 runs?" in label(pilot, "#delete-question")
        # Enter on the unread dialog cancels.
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        assert (root / old).is_dir() and (root / other).is_dir()

        await pilot.press("delete")
        await wait_for(pilot, lambda: isinstance(app.screen, DeleteRunsDialog))
        await pilot.press("y")
        await wait_for(pilot, lambda: ui.history_ids == [kept])
        assert not (root / old).exists() and not (root / other).exists()
        assert (root / kept).is_dir()
        store = RunStore()
        assert store.get(old) is None and store.get(other) is None and store.get(kept)
        table = app.screen.query_one("#runs-table", DataTable)
        await wait_for(pilot, lambda: table.row_count == 1)
        assert ui.selected == kept
        assert "Deleted 2 runs." in notifications(app)


def sleeper(preset_dir: Path, release: Path) -> RunPreset:
    """A user preset whose child waits until ``release`` exists."""
    preset_dir.mkdir(parents=True, exist_ok=True)
    code = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)"
    (preset_dir / "a-wait.toml").write_text(
        f"command = [{json.dumps(sys.executable)}, '-c', {json.dumps(code)}]\ngpus = 1\n"
    )
    return load_presets()[0]["a-wait"]


async def test_a_run_still_going_is_not_deleted(
    gpustation_dirs: dict[str, Path], tmp_path: Path
) -> None:
    root = gpustation_dirs["data"] / "runs"
    (done,) = past_runs(root, [("lora-tiny", {})])
    preset = sleeper(gpustation_dirs["config"] / "presets" / "runs", tmp_path / "release")
    handle = launch(preset, {}, None, simulate=2)
    try:
        app = make_app()
        async with app.run_test(size=(160, 48)) as pilot:
            ui = await open_runs(pilot, 2)  # the run going has its row too
            await wait_for(pilot, lambda: handle.id in ui.views and ui.views[handle.id].live)
            # Marked with a finished run: nothing is deleted, the run going is named.
            for run_id in (done, handle.id):
                await select(pilot, run_id)
                await pilot.press("space")
            await pilot.press("delete")
            await wait_for(pilot, lambda: any("still going" in n for n in notifications(app)))
            note = next(n for n in notifications(app) if "still going" in n)
            assert handle.id in note and "stop it first" in note
            assert isinstance(app.screen, RunsScreen)
            assert handle.run_dir.is_dir() and (root / done).is_dir()
            assert RunStore().get(handle.id) is not None
    finally:
        (tmp_path / "release").touch()
        stop_run(handle.run_dir, grace_s=1.0, wait_s=10.0)


async def test_note_and_tags_are_written_and_shown(gpustation_dirs: dict[str, Path]) -> None:
    root = gpustation_dirs["data"] / "runs"
    first, second = past_runs(root, [("resnet50-bf16", {}), ("resnet50-bf16", {"lr": 0.2})])
    notes_file = root / first / rundir.ANNOTATIONS_JSON
    app = make_app()
    # wide enough for the table's tags and note column
    async with app.run_test(size=(240, 70)) as pilot:
        await open_runs(pilot, 2)
        await select(pilot, first)
        # The preset's own tags (train, vision, bench) are not repeated in every row.
        assert notes_cell(pilot, first) == ""

        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, NoteDialog))
        field = app.screen.query_one("#note-input", Input)
        assert field.value == ""
        await pilot.press(*"before the fix")
        await pilot.press("enter")
        await wait_for(pilot, lambda: notes_file.exists())
        assert json.loads(notes_file.read_text())["note"] == "before the fix"
        await wait_for(pilot, lambda: notes_cell(pilot, first) == "before the fix")
        record = RunStore().get(first)
        assert record is not None and record.note == "before the fix"

        # The editor opens with the note as it is.
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, NoteDialog))
        assert app.screen.query_one("#note-input", Input).value == "before the fix"
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))

        # Tags for both marked runs.
        for run_id in (first, second):
            await select(pilot, run_id)
            await pilot.press("space")
        await pilot.press("T")
        await wait_for(pilot, lambda: isinstance(app.screen, TagDialog))
        await pilot.press(*"baseline lr:3e-4")
        await pilot.press("enter")
        for run_id in (first, second):
            path = root / run_id / rundir.ANNOTATIONS_JSON
            await wait_for(pilot, lambda p=path: tags_in(p) == ["baseline", "lr:3e-4"])  # type: ignore[misc]
        shown = "#baseline #lr:3e-4 before the fix"
        await wait_for(pilot, lambda: notes_cell(pilot, first) == shown)
        await wait_for(pilot, lambda: notes_cell(pilot, second) == "#baseline #lr:3e-4")

        # Taking one off again, with the dialog's Remove.
        await pilot.press("T")
        await wait_for(pilot, lambda: isinstance(app.screen, TagDialog))
        assert "baseline lr:3e-4" in label(pilot, "#tag-now")
        await pilot.press(*"baseline")
        await pilot.click("#remove")
        await wait_for(pilot, lambda: notes_cell(pilot, second) == "#lr:3e-4")
        assert json.loads((root / second / rundir.ANNOTATIONS_JSON).read_text())["tags"] == [
            "lr:3e-4"
        ]

        # A tag the history refuses is said, and nothing is written.
        await pilot.press("T")
        await wait_for(pilot, lambda: isinstance(app.screen, TagDialog))
        await pilot.press(*"bad!")
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("'bad!'" in n for n in notifications(app)))
        assert "bad!" not in (root / second / rundir.ANNOTATIONS_JSON).read_text()
        assert notes_cell(pilot, second) == "#lr:3e-4"


async def test_a_note_with_brackets_is_shown_as_written(gpustation_dirs: dict[str, Path]) -> None:
    root = gpustation_dirs["data"] / "runs"
    (first,) = past_runs(root, [("resnet50-bf16", {})])
    app = make_app()
    # wide enough for the table's tags and note column
    async with app.run_test(size=(240, 70)) as pilot:
        await open_runs(pilot, 1)
        await select(pilot, first)
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, NoteDialog))
        await pilot.press(*"[/] lr [red]x")
        await pilot.press("enter")
        await wait_for(pilot, lambda: notes_cell(pilot, first) == "[/] lr [red]x")
        assert isinstance(app.screen, RunsScreen)
