"""The replay dashboard driven through its keys, and its timeline marks."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from textual.widgets import Input

from gpustation.control.journal import JournalEntry, journal_path
from gpustation.runs.store.index import RunStore
from gpustation.runs.summary import RunSummary
from gpustation.telemetry.recording.file import Recording
from gpustation.telemetry.sim import SimBackend
from gpustation.tui.replay.marks import (
    ALERT,
    CONTROL,
    RUN_END,
    RUN_START,
    SYMBOLS,
    collect_marks,
    timeline_cells,
    timeline_text,
)
from gpustation.tui.replay.screen import ReplayApp
from gpustation.tui.replay.source import ReplaySource
from gpustation.tui.widgets import GpuCard, LiveText
from tests.telemetry.recording_tools import START, make_recording

from .conftest import notifications, record_notifications, wait_for

pytestmark = pytest.mark.timeout(120)


def lose_gpu1(backend: SimBackend) -> None:
    backend.poke(1, lost=True)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def banner(app: ReplayApp) -> str:
    return app.screen.query_one("#banner", LiveText).plain


async def test_keys_pause_step_seek_and_speed_move_the_shown_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "r.zst"
    make_recording(path, n=120, events={50: lose_gpu1})
    rec = Recording(path)
    source = ReplaySource(rec, start=START + 20, playing=False)
    app = ReplayApp(source)
    record_notifications(app)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.latest is not None and bool(app.screen.query(GpuCard)))
        assert app.latest is not None and app.latest.time == START + 20
        assert "REPLAY" in banner(app) and "paused" in banner(app)
        # the recording's time, not the wall time
        assert "1970-01-12" in banner(app)

        async def shown(t: float) -> None:
            await wait_for(pilot, lambda: app.latest is not None and app.latest.time == t)

        await pilot.press("full_stop")
        await shown(START + 21)
        await pilot.press("comma", "comma")
        await shown(START + 19)
        await pilot.press("right")
        await shown(START + 29)
        await pilot.press("left", "left")
        await shown(START + 9)
        await pilot.press("shift+right")
        await shown(START + 69)
        await pilot.press("shift+left")
        await shown(START + 9)
        # the graphs start again after a jump back: nothing after the position
        assert max(app.history.times(0)) == START + 9

        await pilot.press("right_square_bracket", "right_square_bracket")
        assert source.speed == 4.0
        await pilot.press("left_square_bracket")
        assert source.speed == 2.0
        await pilot.press("space")
        await wait_for(pilot, lambda: "▶ 2x" in banner(app))
        await wait_for(pilot, lambda: app.latest is not None and app.latest.time >= START + 12)
        await pilot.press("space")
        await wait_for(pilot, lambda: "paused" in banner(app))
        stopped = app.latest.time if app.latest else 0.0
        # played over, every snapshot reached the graphs
        times = app.history.times(0)
        assert times == [START + i for i in range(int(times[0] - START), int(stopped - START) + 1)]

        # marks: the simulated cards hit their power limit at 35 s; GPU 1 was lost at 50 s
        await wait_for(pilot, lambda: app.marks is not None)
        await pilot.press("n")
        await shown(START + 35)
        assert "held back by its power limit" in banner(app)
        await pilot.press("n")
        await shown(START + 50)
        assert f"last {_clock(START + 50)} ! GPU 1 is lost" in banner(app)
        await pilot.press("N")
        await shown(START + 35)
        await pilot.press("N")
        await wait_for(pilot, lambda: "no mark that way" in notifications(app))


def test_timeline_marks_runs_alerts_and_control_changes_of_the_recorded_period(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r.zst"
    make_recording(path, n=120, events={50: lose_gpu1})
    rec = Recording(path)
    store = RunStore()
    store.upsert(
        RunSummary(
            id="r1", title="resnet", started_at=START + 10.5, ended_at=START + 90, status="done"
        )
    )
    store.upsert(RunSummary(id="r0", started_at=START - 500, ended_at=START - 400, status="done"))
    here = os.uname().nodename
    lines = []
    for t, host in ((START + 70, here), (START + 80, "another-host"), (START + 500, here)):
        entry = JournalEntry(
            time=t,
            host=host,
            gpu=0,
            uuid=None,
            what="power_limit",
            previous=450.0,
            new=300.0,
            command="gpustation power set 300W",
            outcome="made",
            id=f"id{t}",
        )
        lines.append(json.dumps(entry.to_dict()))
    journal_path().write_text("\n".join(lines) + "\n")

    marks = collect_marks(rec)
    got = {(m.kind, m.time) for m in marks}
    assert (RUN_START, START + 10.5) in got and (RUN_END, START + 90) in got
    assert (CONTROL, START + 70) in got
    assert (ALERT, START + 50) in got
    # nothing from outside the period, nor another host's journal entries
    assert all(rec.start <= m.time <= rec.end for m in marks)
    assert (CONTROL, START + 80) not in got
    assert [m.text for m in marks if m.kind == CONTROL] == [
        "GPU 0 power limit 450 W → 300 W: made, by gpustation power set 300W"
    ]

    width = 100
    line = timeline_text(rec.start, rec.end, START + 20, marks, width).plain
    left = len(_clock(rec.start) + " ")
    n = len(line) - left - len(" " + _clock(rec.end))
    cells = line[left : left + n]
    for mark in marks:
        col = timeline_cells(rec.start, rec.end, mark.time, n)
        assert cells[col] in (SYMBOLS[mark.kind], "!"), (mark, cells)  # an alert wins a shared cell
    assert cells[timeline_cells(rec.start, rec.end, START + 20, n)] == "┃"
    assert cells[timeline_cells(rec.start, rec.end, START + 70, n)] == "◆"
    assert cells[timeline_cells(rec.start, rec.end, START + 10.5, n)] == "["
    assert cells[timeline_cells(rec.start, rec.end, START + 90, n)] == "]"


async def test_go_to_a_time_and_the_end_of_the_recording(tmp_path: Path) -> None:
    path = tmp_path / "r.zst"
    make_recording(path, n=120, gpus=1)
    source = ReplaySource(Recording(path), start=START + 20, playing=False)
    app = ReplayApp(source, marks=lambda: [])
    record_notifications(app)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.latest is not None and app.latest.time == START + 20)

        async def go(text: str) -> None:
            await pilot.press("g")
            await wait_for(pilot, lambda: isinstance(app.focused, Input))
            app.focused.value = text  # type: ignore[union-attr]
            await pilot.press("enter")

        await go("+30s")
        await wait_for(pilot, lambda: app.latest is not None and app.latest.time == START + 50)
        await go(_clock(START + 95.5))
        await wait_for(pilot, lambda: app.latest is not None and app.latest.time == START + 95)
        await go("yesterday")
        await wait_for(pilot, lambda: any("a clock time (20:02" in n for n in notifications(app)))
        await go("+1h")
        await wait_for(pilot, lambda: any("outside the recording" in n for n in notifications(app)))
        assert app.latest is not None and app.latest.time == START + 95
        # played to the end, it stops there and says so; playing again starts over
        source.set_speed(16)
        await go("end")
        await wait_for(pilot, lambda: app.latest is not None and app.latest.time == START + 119)
        await pilot.press("space")
        await wait_for(pilot, lambda: app.latest is not None and app.latest.time < START + 119)
        await pilot.press("space")
        await wait_for(pilot, lambda: "paused" in banner(app))
        await go(_clock(START + 117))
        await wait_for(pilot, lambda: app.latest is not None and app.latest.time == START + 117)
        await pilot.press("space")
        await wait_for(pilot, lambda: "⏹ end" in banner(app))
        assert app.latest is not None and app.latest.time == START + 119
