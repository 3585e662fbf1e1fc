"""The selected process's details and whole command line (Enter on the process table)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from typing import Any

import psutil
import pytest
from textual.containers import VerticalScroll

from gpustation.telemetry.model import GpuSample, ProcessInfo
from gpustation.telemetry.sim import SimBackend
from gpustation.tui.app import DashboardApp
from gpustation.tui.dialogs import KillDialog, ProcessDialog
from gpustation.tui.widgets import ProcessTable

from .conftest import RealLookingSim, first_frame, make_app, notifications, wait_for
from .test_app import FakeKill

pytestmark = pytest.mark.timeout(120)

#: a long argv, with what another user may hide in one: a retitle, a clipboard write, markup
LONG_TAIL = " ".join(f"--option-{n}=value-{n}" for n in range(40))
HOSTILE_COMMAND = (
    "python train.py \x1b]0;owned\x07--run [bold]x[/bold] \x1b]52;c;aGk=\x07" + LONG_TAIL + " END"
)


class LongCommandSim(SimBackend):
    """Simulated GPUs where GPU 0 also runs a process with a very long, hostile argv."""

    extra_pid = 4242

    def read_gpus(self, indices: Sequence[int], slow: bool) -> list[GpuSample]:
        gpus = super().read_gpus(indices, slow)
        gpus[0].processes.append(
            ProcessInfo(
                pid=self.extra_pid,
                gpu_memory_mib=30_000.0,  # the most: the first row of the table
                user="eve",
                name="python",
                command=HOSTILE_COMMAND,
            )
        )
        return gpus


class MyProcessSim(RealLookingSim):
    """Simulated GPUs reported as real, with this test process on GPU 1."""

    def read_gpus(self, indices: Sequence[int], slow: bool) -> list[GpuSample]:
        gpus = super().read_gpus(indices, slow)
        gpus[1].processes.append(
            ProcessInfo(pid=os.getpid(), gpu_memory_mib=30_000.0, user="me", command="pytest")
        )
        return gpus


def details(app: DashboardApp) -> str:
    return str(app.screen.query_one("#process-details").render())


async def select(app: DashboardApp, pilot: Any, pid: int) -> None:
    await first_frame(pilot)
    table = app.screen.query_one(ProcessTable)
    await wait_for(pilot, lambda: any(r.pid == pid for r in table.visible_rows()))
    table.table.focus()
    while (row := table.selected()) is not None and row.pid != pid:
        await pilot.press("down")


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_enter_shows_the_whole_command_the_table_cuts_wrapped_and_safe(
    size: tuple[int, int],
) -> None:
    app, _ = make_app(count=2, backend_cls=LongCommandSim)
    async with app.run_test(size=size) as pilot:
        await select(app, pilot, LongCommandSim.extra_pid)
        table_text = app.screen.query_one("#proc-table").plain  # type: ignore[attr-defined]
        assert "END" not in table_text  # the table cuts the command at its width
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ProcessDialog))
        shown = details(app)
        assert f"PID        {LongCommandSim.extra_pid}" in shown and "eve" in shown
        assert "GPU memory 29.3G" in shown
        assert "started    n/a" in shown  # a simulated process has no start time
        # the whole argv, its escapes removed, its markup left as characters
        assert "--run [bold]x[/bold]" in shown and LONG_TAIL + " END" in shown
        assert "\x1b" not in shown and "\x07" not in shown and "owned" not in shown
        label = app.screen.query_one("#process-details")
        view = app.screen.query_one("#process-scroll", VerticalScroll)
        box = app.screen.query_one("#process-box")
        # wrapped onto as many lines as it needs, the dialog on screen, its end in reach
        assert label.size.height > 8 + len(HOSTILE_COMMAND) // max(1, label.size.width)
        assert box.region.right <= size[0] and box.region.bottom <= size[1]
        assert view.region.bottom <= box.region.bottom
        await pilot.press("end")
        await pilot.pause()
        assert view.scroll_offset.y + view.size.height >= label.outer_size.height
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ProcessDialog))


async def test_the_kill_dialog_shows_that_command_safe_too() -> None:
    app, _ = make_app(count=2, backend_cls=LongCommandSim)
    async with app.run_test(size=(160, 48)) as pilot:
        await select(app, pilot, LongCommandSim.extra_pid)
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, KillDialog))
        shown = str(app.screen.query_one("#kill-command").render())
        assert shown.startswith("python train.py --run [bold]x[/bold] ")
        assert "\x1b" not in shown and "\x07" not in shown


async def test_a_real_process_shows_its_start_time_and_k_asks_to_signal_it() -> None:
    kill = FakeKill()
    app, _ = make_app(count=2, backend_cls=MyProcessSim, kill=kill, refresh_s=0.25)
    me = os.getpid()
    async with app.run_test(size=(160, 48)) as pilot:
        await select(app, pilot, me)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ProcessDialog))
        started = time.localtime(psutil.Process(me).create_time())
        assert f"started    {time.strftime('%Y-%m-%d %H:%M:%S', started)}" in details(app)
        assert "GPU        1" in details(app)
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, KillDialog))
        await pilot.press("t")
        await wait_for(pilot, lambda: bool(kill.calls))
        assert kill.calls == [(me, int(signal.SIGTERM))]


async def test_enter_with_no_process_says_to_select_one() -> None:
    app, backend = make_app(count=1)
    backend.poke(0, load=0.0)  # an idle GPU: no process
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        table = app.screen.query_one(ProcessTable)
        assert table.selected() is None
        table.table.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: "Select a process in the table first." in notifications(app))
        assert not isinstance(app.screen, ProcessDialog)
