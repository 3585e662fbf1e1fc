"""The compare view: the marked runs' loss curves overlaid, with the table below."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Static

from gpustation.tui.runs import CompareScreen, RunsScreen
from gpustation.tui.runs.overlay import MAX_OVERLAY, OverlayPlot

from .conftest import notifications, wait_for
from .test_runs_tidy import make_app, open_runs, past_runs, select

pytestmark = pytest.mark.timeout(120)


def static_text(screen: Any, selector: str) -> str:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(screen.query_one(selector, Static).content)
    return console.export_text()


async def mark(pilot: Pilot[Any], run_ids: list[str]) -> None:
    for run_id in run_ids:
        await select(pilot, run_id)
        await pilot.press("space")


async def test_the_overlay_names_each_run_and_toggles_its_axis(
    gpustation_dirs: dict[str, Path],
) -> None:
    root = gpustation_dirs["data"] / "runs"
    ids = past_runs(
        root,
        [
            ("resnet50-bf16", {"batch_size": 192}),
            ("resnet50-bf16", {}),
            ("lora-tiny", {}),
        ],
    )
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await open_runs(pilot, 3)
        await mark(pilot, ids)
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))
        compare = app.screen
        assert isinstance(compare, CompareScreen)
        await wait_for(pilot, lambda: compare.shown == ids)  # oldest first
        plot = compare.query_one("#compare-plot", OverlayPlot)
        await wait_for(pilot, lambda: plot.draws >= 1)
        legend = static_text(compare, "#compare-legend").splitlines()
        assert len(legend) == 3
        for line, run_id, preset in zip(
            legend, ids, ["resnet50-bf16", "resnet50-bf16", "lora-tiny"], strict=True
        ):
            assert run_id in line and preset in line
            assert "(x eval loss)" in line  # the fixture runs report an eval loss
        # Each run in its own colour, in legend order.
        styles = [span.style for span in compare.query_one("#compare-legend", Static).content.spans]  # type: ignore[union-attr]
        colours = [str(s) for s in styles if str(s).startswith("bold color(")]
        assert len(set(colours)) == 3
        # The settings told apart: the batch size one run set.
        assert "batch_size=192" in legend[0] and "batch_size=256" in legend[1]
        table = static_text(compare, "#compare-table")
        assert "set batch_size" in table and "same:" in table

        by_step = plot.draws
        assert not plot.by_time
        await pilot.press("x")
        await wait_for(pilot, lambda: plot.draws > by_step)
        assert plot.by_time and "time (s)" in str(plot.content)
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))


async def test_more_runs_than_colours_are_refused(gpustation_dirs: dict[str, Path]) -> None:
    root = gpustation_dirs["data"] / "runs"
    ids = past_runs(root, [("resnet50-bf16", {"batch_size": 8 * (n + 1)}) for n in range(9)])
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await open_runs(pilot, 9)
        await mark(pilot, ids)
        await pilot.press("v")
        await wait_for(pilot, lambda: any("colours" in n for n in notifications(app)))
        said = next(n for n in notifications(app) if "colours" in n)
        assert "9 runs are marked" in said and f"{MAX_OVERLAY} colours" in said
        assert isinstance(app.screen, RunsScreen)
        # One unmarked: the eight left are overlaid.
        await select(pilot, ids[0])
        await pilot.press("space")
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))
        compare = app.screen
        await wait_for(pilot, lambda: compare.shown == ids[1:])  # type: ignore[attr-defined]
        legend = static_text(compare, "#compare-legend").splitlines()
        assert [run_id for run_id in ids[1:] if any(run_id in line for line in legend)] == ids[1:]
