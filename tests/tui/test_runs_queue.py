"""The GPU queue over the runs screen (Q): what waits and for what, cancelled, reordered, paused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Button, DataTable

from gpustation.runs import rundir
from gpustation.runs.launch.start import prepare
from gpustation.runs.presets import command_preset
from gpustation.runs.queue import entries as queue
from gpustation.tui.runs.queue import CancelQueuedDialog, QueueScreen

from .conftest import notifications, screen_text, wait_for
from .test_runs_screen import make_app, open_runs

pytestmark = pytest.mark.timeout(120)


def queued(names: list[str]) -> list[str]:
    """Queue a command run per name for GPU 0 (the queue paused: none starts)."""
    queue.pause()
    ids = []
    for name in names:
        request, _ = prepare(command_preset(["true"], name, []), simulate=1)
        ids.append(queue.submit(request, gpus=[0], gpus_count=None).id)
    return ids


def order() -> list[str]:
    return [e.id for e in queue.entries()]


async def test_the_queue_view_lists_cancels_reorders_and_pauses(
    gpustation_dirs: dict[str, Path],
) -> None:
    first, second, third = queued(["alpha", "beta", "gamma"])
    queue.set_waiting(queue.find(first), "GPU 0: pid 4242 (alice, python serve.py) holds 22 GiB")
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_runs(pilot)
        await pilot.press("Q")
        await wait_for(pilot, lambda: isinstance(app.screen, QueueScreen))
        view = app.screen
        assert isinstance(view, QueueScreen)
        await wait_for(pilot, lambda: len(view.order) == 3)
        text = screen_text(app)
        assert "3 queued" in text and "PAUSED" in text
        assert "pid 4242 (alice, python serve.py) holds 22 GiB" in text
        assert all(run_id in text for run_id in (first, second, third))

        # the third to the front, then one place down: second, third, first ... as the queue says
        table = view.query_one("#queue-table", DataTable)
        table.move_cursor(row=2)
        await pilot.press("f")
        await wait_for(pilot, lambda: order() == [third, first, second])
        await wait_for(pilot, lambda: view.selected() == third)
        await pilot.press("d")
        await wait_for(pilot, lambda: order() == [first, third, second])
        await wait_for(pilot, lambda: [e.id for e in view.order] == order())

        # cancelling asks first, naming the run; keeping it changes nothing
        await wait_for(pilot, lambda: view.selected() == third)
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, CancelQueuedDialog))
        assert third in screen_text(app)
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen is view)
        assert order() == [first, third, second]
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, CancelQueuedDialog))
        app.screen.query_one("#cancel-run", Button).press()
        await wait_for(pilot, lambda: order() == [first, second])
        state = rundir.read_state(rundir.run_dir(third))
        assert state is not None and state.status != rundir.QUEUED

        # p resumes the queue and p again pauses it (emptied first: no scheduler starts a run)
        for run_id in (first, second):
            queue.cancel(run_id)
        await wait_for(pilot, lambda: "The queue is empty" in screen_text(app))
        await pilot.press("p")
        await wait_for(pilot, lambda: not queue.paused())
        await wait_for(pilot, lambda: "queue resumed" in screen_text(app))
        assert "PAUSED" not in screen_text(app)
        await pilot.press("p")
        await wait_for(pilot, lambda: queue.paused() and "PAUSED" in screen_text(app))
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, QueueScreen))


async def test_a_read_only_dashboard_shows_the_queue_and_changes_nothing(
    gpustation_dirs: dict[str, Path],
) -> None:
    ids = queued(["alpha", "beta"])
    app, _ = make_app(count=1)
    app.read_only = True
    async with app.run_test(size=(80, 24)) as pilot:
        await open_runs(pilot)
        await pilot.press("Q")
        await wait_for(pilot, lambda: isinstance(app.screen, QueueScreen))
        view: Any = app.screen
        await wait_for(pilot, lambda: len(view.order) == 2)
        for key in ("f", "d", "c", "p"):
            await pilot.press(key)
        await pilot.pause()
        assert order() == ids and queue.paused()
        assert any("read-only: no changes to the queue" in n for n in notifications(app))
