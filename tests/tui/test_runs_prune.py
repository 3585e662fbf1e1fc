"""Pruning and filtering the history from the runs screen, as `runs prune` and `runs list` do."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Select

from gpustation.runs.presets import load_presets
from gpustation.runs.store.index import RunStore
from gpustation.runs.summary import RunSummary
from gpustation.tui.runs import RunsScreen
from gpustation.tui.runs.model import RunView
from gpustation.tui.runs.prune import FilterDialog, PruneDialog, matches
from gpustation.tui.runs.tidy import DeleteRunsDialog

from .conftest import notifications, wait_for
from .pastruns import write_run
from .test_runs_tidy import label, make_app, open_runs

pytestmark = pytest.mark.timeout(120)
DAY = 86_400.0


def runs_of(root: Path, specs: list[tuple[str, float, str]]) -> list[str]:
    """Finished runs: (preset, days ago it started, status)."""
    presets, _ = load_presets()
    ids = []
    now = time.time()
    for n, (name, days, status) in enumerate(specs):
        run_id = f"{name}-2026110{n}-120000-cd{n:02d}"
        code = 0 if status == "succeeded" else 1
        write_run(root, run_id, presets[name], status=status, duration_s=60.0,
                  started_at=now - days * DAY, exit_code=code)  # fmt: skip
        ids.append(run_id)
    return ids


async def test_prune_names_the_old_runs_and_deletes_only_them(
    gpustation_dirs: dict[str, Path],
) -> None:
    root = gpustation_dirs["data"] / "runs"
    old_failed, old_ok, recent = runs_of(
        root, [("resnet50-bf16", 40, "failed"), ("lora-tiny", 45, "succeeded"),
               ("lora-tiny", 2, "failed")],
    )  # fmt: skip
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        ui = await open_runs(pilot, 3)
        await pilot.press("D")
        await wait_for(pilot, lambda: isinstance(app.screen, PruneDialog))
        # A span that is not one is said in the dialog, and nothing is looked up.
        app.screen.query_one("#prune-span", Input).value = "soon"
        await pilot.press("enter")
        await wait_for(pilot, lambda: "a span (90s, 5m" in label(pilot, "#prune-error"))
        assert isinstance(app.screen, PruneDialog)
        # the user's own words in the error are shown as typed, never read as markup
        app.screen.query_one("#prune-span", Input).value = "[/]"
        await pilot.press("enter")
        await wait_for(pilot, lambda: "'[/]'" in label(pilot, "#prune-error"))
        assert isinstance(app.screen, PruneDialog)
        app.screen.query_one("#prune-span", Input).value = "30d"
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DeleteRunsDialog))
        named = label(pilot, "#delete-runs")
        assert old_failed in named and old_ok in named and recent not in named
        await pilot.press("y")
        await wait_for(pilot, lambda: ui.history_ids == [recent])
        assert not (root / old_failed).exists() and not (root / old_ok).exists()
        assert (root / recent).is_dir() and RunStore().get(recent) is not None
        assert "Deleted 2 runs." in notifications(app)


async def test_prune_by_status_and_nothing_to_prune(gpustation_dirs: dict[str, Path]) -> None:
    root = gpustation_dirs["data"] / "runs"
    old_failed, old_ok = runs_of(
        root, [("resnet50-bf16", 40, "failed"), ("lora-tiny", 45, "succeeded")]
    )
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        ui = await open_runs(pilot, 2)
        await pilot.press("D")
        await wait_for(pilot, lambda: isinstance(app.screen, PruneDialog))
        app.screen.query_one("#prune-status", Select).value = "failed"
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DeleteRunsDialog))
        assert old_failed in label(pilot, "#delete-runs")
        assert old_ok not in label(pilot, "#delete-runs")
        await pilot.press("y")
        await wait_for(pilot, lambda: ui.history_ids == [old_ok])
        await pilot.press("D")
        await wait_for(pilot, lambda: isinstance(app.screen, PruneDialog))
        app.screen.query_one("#prune-span", Input).value = "60d"
        await pilot.press("enter")
        said = "No run ended before 60d ago."
        await wait_for(pilot, lambda: said in notifications(app))
        assert isinstance(app.screen, RunsScreen) and (root / old_ok).is_dir()


async def test_the_filter_shows_the_matching_runs(gpustation_dirs: dict[str, Path]) -> None:
    root = gpustation_dirs["data"] / "runs"
    resnet, lora_a, lora_b = runs_of(
        root, [("resnet50-bf16", 3, "succeeded"), ("lora-tiny", 2, "failed"),
               ("lora-tiny", 1, "succeeded")],
    )  # fmt: skip
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await open_runs(pilot, 3)
        table = app.screen.query_one("#runs-table", DataTable)

        async def set_filter(text: str) -> None:
            await pilot.press("slash")
            await wait_for(pilot, lambda: isinstance(app.screen, FilterDialog))
            app.screen.query_one("#filter-text", Input).value = text
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))

        def shown() -> set[str]:
            return {str(key.value) for key in table.rows}

        await set_filter("preset:lora-tiny")
        await wait_for(pilot, lambda: shown() == {lora_a, lora_b})
        assert "filter: preset:lora-tiny" in str(table.border_title)
        await set_filter("preset:lora-tiny status:failed")
        await wait_for(pilot, lambda: shown() == {lora_a})
        await set_filter("[red]nothing")  # shown as typed, never read as markup
        await wait_for(pilot, lambda: shown() == set())
        assert "[red]nothing" in str(table.border_title)
        await set_filter("")
        await wait_for(pilot, lambda: shown() == {resnet, lora_a, lora_b})


def test_matches_preset_tag_status_and_text() -> None:
    summary = RunSummary(
        id="lora-tiny-1", preset="lora-tiny", status="failed",
        tags=["train", "baseline"], note="lr sweep, try 3e-4",
    )  # fmt: skip
    view = RunView.of(summary)
    assert matches(view, "preset:lora-tiny tag:baseline status:failed")
    assert matches(view, "SWEEP") and matches(view, "")
    assert not matches(view, "preset:lora") and not matches(view, "tag:base")
    assert not matches(view, "status:succeeded") and not matches(view, "resnet")
    assert matches(view, "tag:mine", user_tags=["mine"])
