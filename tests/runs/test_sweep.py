"""Sweeps on simulated GPUs: every point's limit on every GPU, read back and
journalled; the limits restored after the last point, after Ctrl-C and after a
killed sweep; failed points recorded; the recommendation from the figures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from gpustation.control import journal
from gpustation.errors import EXIT_NEEDS_ROOT, NeedsRootError
from gpustation.runs import rundir, sweep
from gpustation.runs.sweep_report import measured, recommend
from gpustation.telemetry.sim import SimBackend
from tests.conftest import child_env, gpustation_cmd
from tests.runs.conftest import command_preset, wait_until

TIMEOUT = 180.0


def _preset(runs_env: dict, sleep: float = 0.3) -> None:
    runs_env["write_preset"](
        "sweepy",
        command_preset(
            "sweepy", "sweep_point", args=f"batch_size = 8\nsteps = 3\nsleep = {sleep}"
        ).replace("gpus = 1", "gpus = 2"),
    )


def _limits() -> list[float | None]:
    sim = SimBackend.open(count=2)
    return [g.power_limit_w for g in sim.read_gpus([0, 1], slow=False)]


def gs(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpustation_cmd(*args), capture_output=True, text=True, env=child_env(), timeout=timeout
    )


def test_a_power_limit_sweep_sets_reads_back_journals_and_restores(runs_env: dict) -> None:
    _preset(runs_env)
    before = _limits()
    result = gs(
        "sweep",
        "sweepy",
        "--simulate",
        "2",
        "--set",
        "batch_size=4,16,999",
        "--power-limit",
        "60%,80%",
    )
    assert result.returncode == 0, result.stderr
    (done,) = sweep.list_sweeps()
    assert done.status == "finished" and len(done.points) == 6
    assert done.original_limits_w == {0: before[0], 1: before[1]} and done.restored
    assert _limits() == before  # put back after the last point
    for p in done.points:
        want = {"60%": 270.0, "80%": 360.0}[p.power or ""]  # of the RTX 4090's 450 W
        assert p.limits_w == {0: want, 1: want}  # on every GPU, read back
        run = rundir.read_run(runs_env["dirs"]["data"] / "runs" / str(p.run_id)) or {}
        assert f"sweep:{done.id}" in run["preset"]["tags"]
    oom = [p for p in done.points if p.overrides["batch_size"] == "999"]
    assert {p.status for p in oom} == {"oom"}  # recorded as such; the sweep went on
    # the journal holds every change, made and read back, then the restore
    entries = [e for e in journal.read_entries() if done.id in e.command]
    # the limit alternates 60 %, 80 % over the 6 points: a change on both GPUs each
    # time, then the restore on both
    assert len(entries) == 6 * 2 + 2
    assert all(e.outcome == journal.MADE for e in entries)
    assert [e.new for e in entries if "restore" in e.command] == before
    # the recommendation comes from the recorded figures
    ok = measured(done)
    fastest = max(ok, key=lambda p: p.figures["throughput"])
    assert recommend(done)["fastest"] == fastest.index
    assert fastest.figures["throughput"] == pytest.approx(160.0)  # warm-up left out
    assert "Fastest: batch_size=16" in result.stdout
    assert (done.directory / "plot.svg").read_text().startswith("<svg")
    shown = gs("sweeps", "show", "last", "--json")
    assert json.loads(shown.stdout)["id"] == done.id


def test_ctrl_c_stops_the_point_and_restores_the_limits(runs_env: dict) -> None:
    _preset(runs_env, sleep=5.0)
    before = _limits()
    proc = subprocess.Popen(
        gpustation_cmd(
            "sweep",
            "sweepy",
            "--simulate",
            "2",
            "--set",
            "batch_size=4,8",
            "--power-limit",
            "70%",
            "--grace",
            "2",
        ),
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: any(
                p.status == "running" and p.run_id for s in sweep.list_sweeps() for p in s.points
            ),
            TIMEOUT,
            "the first point's run",
        )
        assert _limits() == [315.0, 315.0]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=TIMEOUT) == 130
    finally:
        proc.kill()
        proc.communicate()
    (stopped,) = sweep.list_sweeps()
    assert stopped.status == "stopped" and stopped.restored
    assert _limits() == before
    run_id = stopped.points[0].run_id
    state = rundir.read_state(runs_env["dirs"]["data"] / "runs" / str(run_id))
    assert state is not None and state.status == "stopped"


def test_limits_a_killed_sweep_left_are_restored_by_the_next(runs_env: dict) -> None:
    _preset(runs_env, sleep=5.0)
    before = _limits()
    proc = subprocess.Popen(
        gpustation_cmd("sweep", "sweepy", "--simulate", "2", "--power-limit", "70%"),
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(lambda: _limits() == [315.0, 315.0], TIMEOUT, "the sweep's first limit")
    proc.send_signal(signal.SIGKILL)  # no handler runs: the limits stay changed
    proc.wait(timeout=TIMEOUT)
    assert _limits() == [315.0, 315.0]
    result = gs("sweeps", "restore", "last", "--simulate", "2")
    assert result.returncode == 0, result.stderr
    assert _limits() == before
    for d in (runs_env["dirs"]["data"] / "runs").glob("*"):
        state = rundir.read_state(d)
        if state is not None and state.child_pid:
            try:
                os.killpg(state.pgid or 0, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def test_a_power_limit_axis_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    planned = sweep.Sweep(id="x", preset="p", axes={}, power_limits=["70%"], gpus=[0])
    monkeypatch.setattr(sweep.os, "geteuid", lambda: 1000)
    with pytest.raises(NeedsRootError) as err:
        sweep.require_root_for(planned, simulated=False)
    assert err.value.exit_code == EXIT_NEEDS_ROOT
    sweep.require_root_for(planned, simulated=True)  # simulated cards change nothing real


def test_dry_run_prints_every_point_with_its_limit_per_gpu_and_changes_nothing(
    runs_env: dict,
) -> None:
    _preset(runs_env)
    before = _limits()
    result = gs(
        "sweep",
        "sweepy",
        "--simulate",
        "2",
        "--set",
        "batch_size=4,8",
        "--power-limit",
        "60%,100%",
        "--dry-run",
    )
    assert result.returncode == 0, result.stderr
    lines = [x for x in result.stdout.splitlines() if "->" in x]
    assert len(lines) == 4 and all("GPU 0" in x and "GPU 1" in x for x in lines)
    assert _limits() == before and sweep.list_sweeps() == []
    assert not journal.journal_path().exists()
    bad = gs("sweep", "sweepy", "--simulate", "2", "--power-limit", "10%", "--dry-run")
    assert bad.returncode == 2 and "outside the card's range" in bad.stderr


def test_a_sweep_reads_its_points_back_from_disk(tmp_path: Path) -> None:
    s = sweep.Sweep(id="s1", preset="p", axes={"a": ["1"]}, power_limits=[], gpus=[0])
    s.points = sweep.grid(s.axes, [], 1)
    s.points[0].limits_w = {0: 300.0}
    s.save()
    again = sweep.load_sweep("s1")
    assert again == s
