"""Sweeps on simulated GPUs: every point's limit on every GPU, read back and
journalled; the limits restored after the last point, after Ctrl-C and after a
killed sweep; failed points recorded; the recommendation from the figures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpustation.control import journal
from gpustation.errors import EXIT_NEEDS_ROOT, NeedsRootError
from gpustation.runs import rundir
from gpustation.runs.store.index import RunStore
from gpustation.runs.summary import RunSummary
from gpustation.runs.sweep import model as sweep
from gpustation.runs.sweep import owner as sweep_owner
from gpustation.runs.sweep.report import measured, recommend
from gpustation.runs.sweep.runner import require_root_for
from gpustation.telemetry.sim import SimBackend
from tests.conftest import child_env, gpustation_cmd, run_gpustation
from tests.runs.conftest import RunsEnv, sim_limits, sweep_preset, wait_until

TIMEOUT = 180.0


def _preset(runs_env: RunsEnv, sleep: float = 0.3) -> None:
    sweep_preset(runs_env, sleep)


_limits = sim_limits


def gs(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    return run_gpustation(*args, timeout=timeout)


def test_a_power_limit_sweep_sets_reads_back_journals_and_restores(runs_env: RunsEnv) -> None:
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


def test_ctrl_c_stops_the_point_and_restores_the_limits(runs_env: RunsEnv) -> None:
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


def test_limits_a_killed_sweep_left_are_restored_by_the_next(runs_env: RunsEnv) -> None:
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
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NeedsRootError) as err:
        require_root_for(planned, simulated=False)
    assert err.value.exit_code == EXIT_NEEDS_ROOT
    require_root_for(planned, simulated=True)  # simulated cards change nothing real


def test_dry_run_prints_every_point_with_its_limit_per_gpu_and_changes_nothing(
    runs_env: RunsEnv,
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
    assert "estimated time: unknown: sweepy has not run here yet" in result.stdout
    # with earlier runs of the preset, each point is timed by their median
    store = RunStore()
    for i, seconds in enumerate((30.0, 90.0, 60.0)):
        store.upsert(
            RunSummary(id=f"past-{i}", preset="sweepy", status="succeeded", duration_s=seconds)
        )
    store.upsert(RunSummary(id="past-f", preset="sweepy", status="failed", duration_s=900.0))
    timed = gs("sweep", "sweepy", "--simulate", "2", "--set", "batch_size=4,8", "--dry-run")
    assert "estimated time: about 2 min (2 x 60 s" in timed.stdout, timed.stdout
    bad = gs("sweep", "sweepy", "--simulate", "2", "--power-limit", "10%", "--dry-run")
    assert bad.returncode == 2 and "outside the card's range" in bad.stderr


def test_a_sweep_reads_its_points_back_from_disk(tmp_path: Path) -> None:
    s = sweep.Sweep(id="s1", preset="p", axes={"a": ["1"]}, power_limits=[], gpus=[0])
    s.points = sweep.grid(s.axes, [], 1)
    s.points[0].limits_w = {0: 300.0}
    s.save()
    again = sweep.load_sweep("s1")
    assert again == s


def _kill_orphaned_runs(runs_env: RunsEnv) -> None:
    """The point a killed sweep was running goes on under its supervisor: end it."""
    for d in (runs_env["dirs"]["data"] / "runs").glob("*"):
        state = rundir.read_state(d)
        if state is not None and state.child_pid and state.active:
            try:
                os.killpg(state.pgid or 0, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def test_a_plain_sweep_restores_first_the_limits_a_killed_sweep_left(runs_env: RunsEnv) -> None:
    _preset(runs_env, sleep=5.0)
    before = _limits()
    proc = subprocess.Popen(
        gpustation_cmd("sweep", "sweepy", "--simulate", "2", "--power-limit", "70%"),
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: any(p.run_id for s in sweep.list_sweeps() for p in s.points),
            TIMEOUT,
            "the first point's run",
        )
        assert _limits() == [315.0, 315.0]
        proc.send_signal(signal.SIGKILL)  # mid-point: no handler runs, the limits stay
        proc.wait(timeout=TIMEOUT)
        (killed,) = sweep.list_sweeps()
        assert killed.status == "running" and not killed.restored
        assert killed.points[0].status == "running"
        # --dry-run says what it would put back, and changes nothing
        dry = gs("sweep", "sweepy", "--simulate", "2", "--set", "steps=1", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert f"sweep {killed.id}: GPU 0 315 W -> {before[0]:g} W, GPU 1 315 W" in dry.stdout
        assert _limits() == [315.0, 315.0] and not sweep.load_sweep(killed.id).restored
        # the killed sweep's point run goes on: the next sweep refuses, naming it
        plain_argv: tuple[str, ...] = ("sweep", "sweepy", "--simulate", "2", "--set", "sleep=0.05")
        plain_argv += ("--set", "steps=1")
        busy = gs(*plain_argv)
        assert busy.returncode == 1, busy.stderr
        assert f"run {killed.points[0].run_id} on GPU 0, 1 is still going" in busy.stderr
        assert _limits() == [315.0, 315.0]  # nothing changed
        _kill_orphaned_runs(runs_env)
        wait_until(lambda: not sweep_owner.runs_on([0, 1], True), TIMEOUT, "the run's end")
        # a sweep with no power-limit axis puts them back before its first point
        plain = gs(*plain_argv)
    finally:
        proc.kill()
        proc.wait(timeout=TIMEOUT)
        _kill_orphaned_runs(runs_env)
    assert plain.returncode == 0, plain.stderr
    assert _limits() == before  # read back from the simulated cards
    restoring = plain.stderr.index("restoring them first")
    assert restoring < plain.stderr.index("point 1/1")
    assert sweep.load_sweep(killed.id).restored
    restores = [e for e in journal.read_entries() if f"{killed.id}: restore" in e.command]
    assert [e.new for e in restores] == before and all(e.outcome == journal.MADE for e in restores)
    new = next(s for s in sweep.list_sweeps() if s.id != killed.id)
    assert new.status == "finished" and new.original_limits_w == {}  # it changed nothing itself


def _left_by_a_killed_sweep(limits: dict[int, float], simulated: bool) -> sweep.Sweep:
    """sweep.json as a SIGKILLed sweep leaves it: limits taken, never restored, its process gone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = sweep.Sweep(
        id="20240101-000000-sweep-sweepy",
        preset="sweepy",
        axes={},
        power_limits=["70%"],
        gpus=sorted(limits),
        status="running",
        simulated=simulated,
        original_limits_w=dict(limits),
        pid=gone.pid,
    )
    left.save()
    return left


def test_without_root_a_sweep_refuses_to_run_over_a_killed_sweeps_limits(
    runs_env: RunsEnv,
    fake_nvml: object,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gpustation import cli

    _preset(runs_env)
    monkeypatch.delenv("GPUSTATION_SIMULATE")  # the (fake) driver's cards
    left = _left_by_a_killed_sweep({0: 400.0, 1: 650.0}, simulated=False)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["sweep", "sweepy", "--set", "steps=1"]) == EXIT_NEEDS_ROOT
    err = capsys.readouterr().err
    assert "GPU 0 450 W -> 400 W, GPU 1 700 W -> 650 W" in err
    assert f"sudo gpustation sweeps restore {left.id}" in err
    assert not sweep.load_sweep(left.id).restored
    assert [s.id for s in sweep.list_sweeps()] == [left.id]  # no sweep started
    assert not (runs_env["dirs"]["data"] / "runs").exists() or not any(
        (runs_env["dirs"]["data"] / "runs").iterdir()
    )


def test_a_simulated_card_that_needs_root_refuses_the_restore_the_same_way(
    runs_env: RunsEnv, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpustation import cli

    _preset(runs_env)
    before = _limits()
    left = _left_by_a_killed_sweep({0: 400.0, 1: 400.0}, simulated=True)
    SimBackend.open(count=2).control.set_power_limit(0, 315.0)  # what the killed sweep set
    monkeypatch.setenv("GPUSTATION_SIM_REQUIRE_ROOT", "1")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["sweep", "sweepy", "--simulate", "2", "--set", "steps=1"]) == EXIT_NEEDS_ROOT
    err = capsys.readouterr().err
    assert f"GPU 0 315 W -> 400 W, GPU 1 {before[1]:g} W -> 400 W" in err
    assert f"sudo gpustation sweeps restore {left.id}" in err
    assert _limits() == [315.0, before[1]] and not sweep.load_sweep(left.id).restored


def test_two_sweeps_started_in_the_same_second_get_directories_of_their_own() -> None:
    first = sweep.Sweep(
        id=sweep.new_sweep_id("p", now=1e9), preset="p", axes={}, power_limits=[], gpus=[0]
    )
    first.save()
    second_id = sweep.new_sweep_id("p", now=1e9)
    assert second_id == f"{first.id}-2"
    sweep.Sweep(id=second_id, preset="p", axes={}, power_limits=[], gpus=[1]).save()
    assert sweep.new_sweep_id("p", now=1e9) == f"{first.id}-3"
    assert [s.gpus for s in sweep.list_sweeps()] == [[0], [1]]


@pytest.fixture
def tokyo_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A local zone nine hours ahead of UTC, so a local stamp and a UTC one differ."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_sweep_ids_are_stamped_in_utc_and_last_is_the_newest_whatever_its_id(
    tokyo_time: None,
) -> None:
    assert sweep.new_sweep_id("p", now=1e9) == "20010909-014640-sweep-p"  # 1e9 s is 01:46:40 UTC
    # a sweep of an older version, its id stamped in local time, an hour before a new one
    old = sweep.Sweep(
        id="20010909-104640-sweep-p", preset="p", axes={}, power_limits=[], gpus=[0], created_at=1e9
    )
    old.save()
    new = sweep.Sweep(
        id=sweep.new_sweep_id("p", now=1e9 + 3600),
        preset="p",
        axes={},
        power_limits=[],
        gpus=[1],
        created_at=1e9 + 3600,
    )
    new.save()
    assert new.id < old.id  # the names alone would put them the wrong way round
    assert sweep.load_sweep("last").id == new.id
    assert [s.id for s in sweep.list_sweeps()] == [old.id, new.id]
    assert sweep.load_sweep("20010909-1046").id == old.id  # an old id still reads
