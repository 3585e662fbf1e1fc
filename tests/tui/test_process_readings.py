"""The process table's SM % and device-node holders, the unowned-VRAM line, and
GPM read only while something on screen shows it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from textual.pilot import Pilot

from gpustation.telemetry.sim import SimBackend
from gpustation.tui.app import DashboardApp
from gpustation.tui.dialogs import KillDialog
from gpustation.tui.source import DataSource
from gpustation.tui.widgets import LiveText, ProcessTable, ProcList

from .conftest import (
    BUILTIN_SCREENS,
    Clock,
    RealLookingSim,
    first_frame,
    fixed_host,
    make_app,
    notifications,
    record_notifications,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)


def notes_of(app: DashboardApp) -> LiveText:
    return app.screen.query_one("#proc-notes", LiveText)


async def test_the_sm_column_shows_each_process_s_share_and_sorts() -> None:
    app, backend = make_app(count=2)
    backend.poke(0, load=0.5)
    backend.poke(1, load=1.0)
    backend.poke(1, holders=[(4321, "python stuck.py")])
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        table = app.screen.query_one(ProcessTable)
        await wait_for(pilot, lambda: len(table.visible_rows()) == 3)
        assert "SM %" in app.screen.query_one(ProcList).plain.splitlines()[0]
        by_pid = {r.pid: r for r in table.visible_rows()}
        snap = app.latest
        assert snap is not None
        for gpu in snap.gpus:
            for proc in gpu.processes:
                assert by_pid[proc.pid].sm_pct == proc.sm_pct
        shares = sorted(r.sm_pct for r in table.visible_rows() if r.sm_pct is not None)
        assert len(shares) == 2 and shares[0] < shares[1]  # GPU 1 works twice as hard
        await pilot.press("s")  # from GPU MEM to SM %
        await pilot.pause()
        assert table.sort_key == "sm" and table.sort_reverse
        rows = table.visible_rows()
        assert [r.sm_pct for r in rows] == [shares[1], shares[0], None]  # n/a last
        lines = app.screen.query_one(ProcList).plain.splitlines()
        assert "SM %▼" in lines[0]
        sm_col = lines[0].index("SM %")
        assert lines[1][sm_col:].split()[0] == f"{shares[1]:.0f}"
        assert lines[3][sm_col:].split()[0] == "n/a"  # the holder: NVML has no share
        await pilot.press("S")
        await pilot.pause()
        assert [r.sm_pct for r in table.visible_rows()] == [None, shares[0], shares[1]]


async def test_a_holder_is_a_row_of_its_own_and_the_unowned_vram_a_line() -> None:
    app, backend = make_app(count=2)
    backend.poke(0, load=0.0, orphaned_mib=3277, holders=[(4321, "python stuck.py")])
    backend.poke(1, load=1.0)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        table = app.screen.query_one(ProcessTable)
        await wait_for(pilot, lambda: any(r.holder for r in table.visible_rows()))
        holder = next(r for r in table.visible_rows() if r.holder)
        assert (holder.pid, holder.gpu, holder.command) == (4321, 0, "python stuck.py")
        line = next(ln for ln in app.screen.query_one(ProcList).plain.splitlines() if "4321" in ln)
        assert line.split()[:5] == ["4321", "sim", "0", "holder", "?"]
        notes = notes_of(app)
        assert notes.display
        assert notes.plain == (
            "GPU 0: 3.2 GiB of VRAM held by no listed process (holders: PID 4321 python stuck.py)"
        )
        # The holder lets go and the memory with it: the line goes.
        backend.poke(0, orphaned_mib=0, holders=[])
        app.sample_now()
        await wait_for(pilot, lambda: not notes.display)
        assert not any(r.holder for r in table.visible_rows())


async def test_no_unowned_line_for_an_idle_card_or_the_driver_s_reservation() -> None:
    app, backend = make_app(count=2, card="h200")
    backend.poke(0, load=0.0)
    # what NVML's v1 memory info counts as used on an idle H200 (its reservation)
    backend.poke(1, load=0.0, orphaned_mib=581)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        snap = app.latest
        assert snap is not None
        assert snap.gpus[0].unowned_memory_mib == 0
        assert snap.gpus[1].unowned_memory_mib == 581
        assert not notes_of(app).display and notes_of(app).plain == ""


async def test_a_holder_found_in_proc_is_signalled_after_the_dialog_names_it(
    tmp_path: Path,
) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        # A /proc where the child holds /dev/nvidia0 open (as a process in
        # another container, or one stuck while exiting, does).
        fd_dir = tmp_path / str(child.pid) / "fd"
        fd_dir.mkdir(parents=True)
        os.symlink("/dev/nvidia0", fd_dir / "7")
        clk = Clock()
        backend = RealLookingSim(count=1, seed=0, state_path=None, clock=clk)
        backend.poke(0, load=0.0)
        source = DataSource(
            lambda: backend,
            host_source=fixed_host,
            hostname="workstation",
            clock=clk,
            proc_root=str(tmp_path),
        )
        app = DashboardApp(source, refresh_s=10.0, screens=BUILTIN_SCREENS)
        record_notifications(app)
        async with app.run_test(size=(160, 48)) as pilot:
            await first_frame(pilot)
            table = app.screen.query_one(ProcessTable)
            await wait_for(pilot, lambda: any(r.pid == child.pid for r in table.visible_rows()))
            row = next(r for r in table.visible_rows() if r.pid == child.pid)
            assert row.holder and "time.sleep(600)" in row.command
            table.table.focus()
            table.table.action_move(table.visible_rows().index(row) - table.table.cursor)
            await pilot.press("k")
            await wait_for(pilot, lambda: isinstance(app.screen, KillDialog))
            dialog = app.screen
            assert str(dialog.query_one("#kill-title").render()).startswith(
                f"Signal PID {child.pid}"
            )
            assert "device node" in str(dialog.query_one("#kill-holder").render())
            await pilot.press("K")
            await wait_for(pilot, lambda: not isinstance(app.screen, KillDialog))
            assert child.wait(timeout=10) == -signal.SIGKILL
            await wait_for(pilot, lambda: any("Sent SIGKILL" in n for n in notifications(app)))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


async def test_a_simulated_holder_is_offered_but_never_signalled() -> None:
    kills: list[tuple[int, int]] = []
    app, backend = make_app(count=1, kill=lambda pid, sig: kills.append((pid, sig)))
    backend.poke(0, load=0.0, holders=[(4321, "python stuck.py")])
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        table = app.screen.query_one(ProcessTable)
        await wait_for(pilot, lambda: bool(table.visible_rows()))
        assert table.selected() is not None and table.selected().pid == 4321  # type: ignore[union-attr]
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, KillDialog))
        await pilot.press("t")
        await wait_for(pilot, lambda: any("simulated process" in n for n in notifications(app)))
        assert kills == []


# ---- GPM only while shown ------------------------------------------------------------------


def h200_app(**kwargs: object) -> tuple[DashboardApp, SimBackend]:
    app, backend = make_app(count=1, card="h200", **kwargs)  # type: ignore[arg-type]
    backend.poke(0, load=1.0)
    return app, backend


async def next_pass(pilot: Pilot[int], app: DashboardApp) -> None:
    done = app.passes
    app.sample_now()
    await wait_for(pilot, lambda: app.passes > done)


async def test_gpm_is_read_while_the_full_cards_show_it_and_not_on_other_screens() -> None:
    app, backend = h200_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        await next_pass(pilot, app)
        assert backend.read_gpm
        assert app.latest is not None and app.latest.gpus[0].tensor_active_pct
        assert "tensor" in app.screen.query_one("#gpu-0", LiveText).plain
        await pilot.press("t")
        await next_pass(pilot, app)
        assert not backend.read_gpm
        assert app.latest.gpus[0].tensor_active_pct is None
        await pilot.press("t")  # back to the dashboard
        await next_pass(pilot, app)
        assert backend.read_gpm and app.latest.gpus[0].tensor_active_pct


async def test_gpm_stays_on_under_a_dialog_and_off_with_compact_cards() -> None:
    app, backend = h200_app(backend_cls=RealLookingSim)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        await wait_for(pilot, lambda: bool(app.screen.query_one(ProcessTable).visible_rows()))
        await pilot.press("k")  # the cards stay in view behind the dialog
        await wait_for(pilot, lambda: isinstance(app.screen, KillDialog))
        await next_pass(pilot, app)
        assert backend.read_gpm
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, KillDialog))
        await pilot.resize_terminal(80, 24)  # two-line cards: no GPM on them
        await wait_for(pilot, lambda: not app.screen.shows_gpm)  # type: ignore[attr-defined]
        await next_pass(pilot, app)
        assert not backend.read_gpm
        assert "tensor" not in app.screen.query_one("#gpu-0", LiveText).plain


async def test_a_live_run_keeps_gpm_on_wherever_the_dashboard_is() -> None:
    app, backend = h200_app()
    live = [True]
    app.gpm_hooks.append(lambda: live[0])
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        await pilot.press("a")  # the alert log shows no GPM
        await next_pass(pilot, app)
        assert backend.read_gpm
        live[0] = False  # the run ended
        await next_pass(pilot, app)
        assert not backend.read_gpm


def test_the_source_reads_gpm_only_when_asked() -> None:
    clk = Clock()
    backend = SimBackend(count=1, card="h200", seed=0, state_path=None, clock=clk)
    backend.poke(0, load=1.0)
    source = DataSource(lambda: backend, host_source=fixed_host, clock=clk)
    try:
        assert source.sample().snapshot.gpus[0].tensor_active_pct is None
        assert not backend.read_gpm
        source.want_gpm = True
        assert source.sample().snapshot.gpus[0].tensor_active_pct
        source.want_gpm = False
        assert source.sample().snapshot.gpus[0].tensor_active_pct is None
    finally:
        source.close()
