"""The runs screen marks a run's slowdowns on its plot with their cause, and says a live one."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpustation.runs.slowdown import records
from gpustation.runs.summary import RunSummary
from gpustation.runs.timeline import SlowdownSpan, Timeline
from gpustation.tui.runs import LossPlot
from gpustation.tui.runs.model import RunView
from gpustation.tui.runs.widgets import run_header

from .conftest import wait_for
from .test_runs_detail import START, finished_run, select
from .test_runs_screen import make_app, open_runs

pytestmark = pytest.mark.timeout(120)

POWER_CAP = "power cap: 450 W limit, GPU at 450 W, SM clock 2783 of 3105 MHz"


def write_slowdown(directory: Path, start_s: float, end_s: float) -> None:
    """A slowdown as the supervisor's watch writes it: confirmed, then ended."""
    records.append(
        directory,
        {
            "id": 1,
            "state": "ongoing",
            "start_time": START + start_s,
            "start_s": start_s,
            "confirmed_time": START + start_s + 5,
            "steady": 100.0,
            "throughput": 52.0,
            "unit": "img/s",
            "lost_pct": 48.0,
            "lost": 48.0,
            "cause": {
                "kind": "power_cap",
                "label": "power cap",
                "detail": POWER_CAP.removeprefix("power cap: "),
                "words": POWER_CAP,
                "evidence": {"power_w": 450.0},
            },
        },
    )
    records.append(
        directory,
        {
            "id": 1,
            "state": "ended",
            "end_time": START + end_s,
            "length_s": end_s - start_s,
            "throughput": 52.0,
            "lost_pct": 48.0,
            "lost": 48.0,
            "ended_with_run": False,
        },
    )


async def test_a_slowdown_is_marked_on_the_plot_with_its_cause(
    gpustation_dirs: dict[str, Path],
) -> None:
    slowed = finished_run(gpustation_dirs, "slowed-run")
    write_slowdown(slowed, 6.0, 12.0)
    steady = finished_run(gpustation_dirs, "steady-run")
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        ui = await open_runs(pilot)
        await select(pilot, slowed.name)
        view = ui.views[slowed.name]
        await wait_for(pilot, lambda: len(view.timeline.slowdowns) == 1)
        (span,) = view.timeline.slowdowns
        # On the run's time axis: seconds since it started, read from the file's Unix times.
        assert (span.start_s, span.end_s, span.ongoing) == (6.0, 12.0, False)
        plot = app.screen.query_one("#run-plot", LossPlot)
        await wait_for(pilot, lambda: "power cap" in str(plot.render()))
        drawn = str(plot.render())
        assert "━" in drawn, drawn  # the span along the top of the plot
        # A finished run's slowdown is no alert.
        assert "slowed down" not in str(app.screen.query_one("#run-header").render())
        # A run without slowdowns has no mark.
        await select(pilot, steady.name)
        await wait_for(pilot, lambda: plot.shows(ui.views[steady.name]))
        assert "power cap" not in str(plot.render()) and "━" not in str(plot.render())


def test_a_live_run_s_slowdown_going_on_is_an_alert_in_its_header() -> None:
    summary = RunSummary(id="r1", preset="p", status="running", started_at=START)
    view = RunView(id="r1", run_dir=Path("/nonexistent"), summary=summary)
    going = SlowdownSpan(42.0, None, "power cap", POWER_CAP, 48.0, ongoing=True)
    view.timeline = Timeline(slowdowns=(going,))
    header = run_header(view, START + 60).plain
    assert f"slowed down since 0:42, 48 % below its steady level: {POWER_CAP}" in header
    # Once it ended, or once the run did, there is no alert.
    over = SlowdownSpan(42.0, 50.0, "power cap", POWER_CAP, 48.0)
    view.timeline = Timeline(slowdowns=(over,))
    assert "slowed down" not in run_header(view, START + 60).plain
    view.timeline = Timeline(slowdowns=(going,))
    view.take(RunSummary(id="r1", preset="p", status="succeeded", started_at=START), START)
    assert "slowed down" not in run_header(view, START + 60).plain
