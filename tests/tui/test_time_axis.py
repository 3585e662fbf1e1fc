"""The history graph's time axis: ticks that say how long ago, under the right columns."""

from __future__ import annotations

import re

import pytest

from gpustation.telemetry.model import GpuSample, Snapshot
from gpustation.telemetry.rings import History, bucket
from gpustation.tui.render import ago, history_text, time_axis
from gpustation.tui.widgets import HistoryGraph

from .conftest import first_frame, make_app

LABEL = re.compile(r"-(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def labels(axis: str) -> list[tuple[int, float]]:
    """(seconds ago, centre column) of each tick label on an axis line."""
    out = []
    for m in re.finditer(r"-\S+", axis):
        h, mins, s = (int(g or 0) for g in LABEL.fullmatch(m.group()).groups())  # type: ignore[union-attr]
        out.append((h * 3600 + mins * 60 + s, (m.start() + m.end() - 1) / 2))
    return out


def column_of(times: list[float], width: int, when: float) -> int:
    cols = bucket(list(times), width)
    pad = width - len(cols)
    return pad + min(range(len(cols)), key=lambda i: abs(cols[i] - when))  # type: ignore[operator]


@pytest.mark.parametrize("width", [40, 76, 98, 150, 216])
@pytest.mark.parametrize("samples", [20, 301, 600])
def test_each_tick_sits_under_the_column_of_its_time(width: int, samples: int) -> None:
    times = [1000.0 + i for i in range(samples)]
    axis = time_axis(times, width)
    assert len(axis) == width and axis.endswith("now")
    found = labels(axis)
    assert found, axis
    ticks = [s for s, _ in found]
    assert ticks == sorted(ticks, reverse=True)  # oldest on the left
    assert len(set(ticks)) == len(ticks) and all(s <= samples for s in ticks)
    for seconds, centre in found:
        expected = column_of(times, width, times[-1] - seconds)
        assert abs(centre - expected) <= 3, (axis, seconds)


def test_ten_minutes_read_in_minutes_and_a_short_history_in_seconds() -> None:
    ten_min = time_axis([float(t) for t in range(601)], 76)
    assert [s for s, _ in labels(ten_min)] == [600, 480, 360, 240, 120]
    assert ten_min.lstrip().startswith("-10m")
    # 20 s of samples, one column each on the right of the graph: the ticks are there too
    short = time_axis([float(t) for t in range(21)], 76)
    assert [s for s, _ in labels(short)] == [20, 10]
    assert short.index("-20s") >= 76 - 21 - 2


def test_a_pause_in_sampling_shows_in_the_ticks() -> None:
    # 5 minutes of samples, 10 minutes without, 5 minutes more
    times = [float(t) for t in range(300)] + [float(t) for t in range(900, 1200)]
    found = dict(labels(time_axis(times, 100)))
    # the pause takes no columns: -5m is the middle, the left edge is 20 minutes ago
    assert abs(found[300] - 50) <= 3
    assert found[1200] < 3


def test_the_oldest_column_says_its_age_when_no_tick_is_there() -> None:
    axis = time_axis([float(t) for t in range(600)], 76)  # 599 s: no 10-minute tick
    assert axis.startswith("-10m ") and labels(axis)[1][0] == 480


def test_one_sample_is_just_now() -> None:
    assert time_axis([5.0], 20) == " " * 17 + "now"
    assert time_axis([], 20) == " " * 17 + "now"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(10, "-10s"), (60, "-1m"), (90, "-1m30s"), (3600, "-1h"), (5400, "-1h30m")],
)
def test_tick_labels(seconds: int, text: str) -> None:
    assert ago(seconds) == text


def test_the_graph_text_ends_with_one_axis_for_every_gpu() -> None:
    history = History()
    for t in range(120):
        history.add(
            Snapshot(
                hostname="h",
                time=float(t),
                gpus=[GpuSample(index=i, utilization_gpu_pct=50.0) for i in (0, 1)],
            )
        )
    lines = history_text(history, [0, 1], "util", 60, 2, 600.0).plain.split("\n")
    assert len(lines) == 2 * 3 + 1
    assert lines[-1].endswith("now") and "-1m" in lines[-1] and len(lines[-1]) == 60
    assert all("now" not in line for line in lines[:-1])


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (160, 48), (220, 60)])
async def test_the_dashboard_graph_shows_its_time_axis_at_every_size(
    size: tuple[int, int],
) -> None:
    app, _ = make_app(count=2, prefill=300)
    async with app.run_test(size=size) as pilot:
        await first_frame(pilot)
        await pilot.pause()
        graph = app.screen.query_one(HistoryGraph)
        for _ in range(3):  # m cycles the metric: the axis stays
            axis = graph.plain.split("\n")[-1]
            assert axis.rstrip().endswith("now") and "-4m" in axis, axis
            # the axis line is drawn inside the graph, on screen
            assert graph.line_count == graph.size.height
            assert graph.region.bottom <= size[1] - 2
            await pilot.press("m")
            await pilot.pause()
