"""Finding runs again from their directories, in-process: which processes keep a run
going, when a run is lost or stopped, what its end records, and which writer
records it. The runs here are directories naming real processes (``sleep``), gone
ones, or none: no supervisor runs."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpustation import paths
from gpustation.runs import rundir
from gpustation.runs.rundir import RunState
from gpustation.runs.store import reconcile
from gpustation.runs.store.index import RunStore


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def sleeper(started: list[subprocess.Popen[bytes]]) -> tuple[int, float]:
    """A live process (pid, start time) to stand for a supervisor or a run's child."""
    proc = subprocess.Popen(["sleep", "120"])
    started.append(proc)
    return proc.pid, psutil.Process(proc.pid).create_time()


def gone() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def make_run(name: str, log: str = "", **state: object) -> Path:
    directory = paths.runs_dir() / name
    directory.mkdir(parents=True)
    rundir.write_json(directory / rundir.RUN_JSON, {"id": name, "preset": {"name": "p"}})
    rundir.write_state(directory, RunState(id=name, **state))  # type: ignore[arg-type]
    if log:
        (directory / rundir.OUTPUT_LOG).write_text(log)
    return directory


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def on_disk(directory: Path) -> str:
    data = rundir.read_json(directory / rundir.STATE_JSON)
    assert data is not None
    return str(data["status"])


def test_a_stop_reads_as_who_asked_and_the_last_signal_sent() -> None:
    assert reconcile.stopped_reason({"by": "user", "signals": ["SIGTERM", "SIGKILL"]}) == (
        "stopped by user (SIGKILL)"
    )
    assert reconcile.stopped_reason({}) == "stopped by request"
    assert reconcile.stopped_reason({"by": "sweep", "signals": []}) == "stopped by sweep"
    assert reconcile.stopped_reason({"by": "sweep", "signals": "SIGTERM"}) == "stopped by sweep"


def test_an_end_found_takes_the_log_s_time_and_its_last_lines(gpustation_dirs: object) -> None:
    lines = "".join(f"line {n}\n" for n in range(25))
    directory = make_run("a", log=lines, status="running")
    age(directory / rundir.OUTPUT_LOG, 100.0)
    stamp = (directory / rundir.OUTPUT_LOG).stat().st_mtime
    state = reconcile.ended(directory, RunState(id="a", status="running"), "lost", "why")
    assert (state.status, state.reason, state.ended_at) == ("lost", "why", stamp)
    assert state.error_tail == [f"line {n}" for n in range(5, 25)]
    kept = reconcile.ended(directory, RunState(id="a", ended_at=5.0), "stopped", "asked")
    assert kept.ended_at == 5.0
    (directory / rundir.OUTPUT_LOG).unlink()
    before = time.time()
    bare = reconcile.ended(directory, RunState(id="a"), "lost", "why")
    assert bare.ended_at is not None and bare.ended_at >= before and bare.error_tail == []
    assert on_disk(directory) == "running"  # found in memory: nothing was written


def test_marking_an_end_writes_the_row_then_the_state(gpustation_dirs: object) -> None:
    directory = make_run("b", log="boom\n", status="running")
    state = reconcile.mark_ended(
        directory, RunState(id="b", status="running"), "failed", "it broke"
    )
    assert state.status == "failed"
    assert on_disk(directory) == "failed"
    saved = rundir.read_state(directory)
    assert saved is not None and (saved.reason, saved.error_tail) == ("it broke", ["boom"])
    row = RunStore().get("b")
    assert row is not None and row.status == "failed"


def test_an_end_that_cannot_be_recorded_says_which_half_failed(
    gpustation_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    directory = make_run("c", status="running")
    state = RunState(id="c", status="succeeded")
    (gpustation_dirs["data"] / "runs.db").mkdir()  # the history cannot be opened
    assert reconcile.record_end(directory, state) == (False, True)
    assert on_disk(directory) == "succeeded"
    err = capsys.readouterr().err
    assert err.startswith("gpustation: could not record run c in the history: ")
    blocked = make_run("blocked", status="running")
    (blocked / rundir.STATE_JSON).unlink()
    (blocked / rundir.STATE_JSON).mkdir()  # state.json cannot be replaced
    elsewhere = RunStore(gpustation_dirs["state"] / "other.db")
    state = RunState(id="blocked", status="failed")
    assert reconcile.record_end(blocked, state, elsewhere) == (True, False)
    assert capsys.readouterr().err.startswith(
        "gpustation: could not write the state of run blocked: "
    )
    row = elsewhere.get("blocked")
    assert row is not None and row.status == "failed"


def test_a_run_whose_supervisor_lives_is_as_it_says(
    gpustation_dirs: object, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    pid, started = sleeper(sleepers)
    directory = make_run("d", status="running", supervisor_pid=pid, supervisor_create_time=started)
    state = reconcile.check_run(directory)
    assert state is not None and state.status == "running"
    assert reconcile.check_run(paths.runs_dir() / "none") is None
    done = make_run("e", status="succeeded")
    finished = reconcile.check_run(done)
    assert finished is not None and finished.status == "succeeded"


def test_a_reused_pid_is_not_the_supervisor(
    gpustation_dirs: object, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    pid, started = sleeper(sleepers)
    directory = make_run(
        "f", status="running", supervisor_pid=pid, supervisor_create_time=started - 1000.0
    )
    state = reconcile.check_run(directory)
    assert state is not None and (state.status, state.reason) == ("lost", reconcile.LOST_REASON)


def test_a_run_just_launched_waits_for_its_supervisor_s_pid(gpustation_dirs: object) -> None:
    directory = make_run("g", status="starting")
    fresh = reconcile.check_run(directory)
    assert fresh is not None and fresh.status == "starting"
    age(directory / rundir.STATE_JSON, 60.0)
    late = reconcile.check_run(directory)
    assert late is not None and late.status == "lost"
    recent = reconcile.check_run(directory, starting_grace_s=120.0)
    assert recent is not None and recent.status == "starting"


def test_a_run_whose_supervisor_is_gone_but_child_lives_is_still_going(
    gpustation_dirs: object, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    pid, started = sleeper(sleepers)
    directory = make_run(
        "h", status="running", supervisor_pid=gone(), child_pid=pid, child_create_time=started
    )
    state = reconcile.check_run(directory)
    assert state is not None and state.status == "running"
    [active] = reconcile.list_active_runs()
    assert (active.id, active.run_dir, active.supervised) == ("h", directory, False)
    assert active.run["id"] == "h"
    other = make_run(
        "i",
        status="running",
        supervisor_pid=gone(),
        child_pid=pid,
        child_create_time=started - 1000.0,  # the pid was reused
    )
    lost = reconcile.check_run(other)
    assert lost is not None and lost.status == "lost"


def test_a_run_asked_to_stop_whose_supervisor_died_was_stopped(gpustation_dirs: object) -> None:
    directory = make_run("j", log="bye\n", status="running", supervisor_pid=gone())
    rundir.request_stop(directory, "user")
    rundir.note_stop_signal(directory, "SIGTERM")
    state = reconcile.check_run(directory)
    assert state is not None and state.status == "stopped"
    assert state.reason == "stopped by user (SIGTERM)" + reconcile.STOPPED_UNRECORDED
    assert state.error_tail == ["bye"] and state.ended_at is not None
    assert on_disk(directory) == "running"  # a reader: nothing written


def test_a_supervisor_that_ended_between_two_reads_has_its_own_end(
    gpustation_dirs: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = make_run("k", status="running", supervisor_pid=gone())
    real = rundir.read_state
    reads = 0

    def read(d: Path) -> RunState | None:
        nonlocal reads
        reads += 1
        if reads == 2:  # the supervisor records its end just before the second read
            rundir.write_state(d, RunState(id="k", status="succeeded", exit_code=0))
        return real(d)

    monkeypatch.setattr(rundir, "read_state", read)
    state = reconcile.check_run(directory)
    assert state is not None and (state.status, state.exit_code) == ("succeeded", 0)


def test_the_launcher_records_the_ends_found_and_leaves_the_rest(
    gpustation_dirs: object, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    assert reconcile.record_lost_runs() == []  # no runs directory yet
    done_first = make_run("0-done", status="failed")
    garbage = make_run("0-garbage", status="running")
    (garbage / rundir.STATE_JSON).write_text("{not json")
    pid, started = sleeper(sleepers)
    live = make_run("1-live", status="running", supervisor_pid=pid, supervisor_create_time=started)
    lost = make_run("2-lost", log="out of memory\n", status="running", supervisor_pid=gone())
    stopped = make_run("3-stopped", status="running", supervisor_pid=gone())
    rundir.request_stop(stopped, "user")
    done = make_run("4-done", status="succeeded")
    (paths.runs_dir() / "5-empty").mkdir()
    found = reconcile.record_lost_runs()
    assert [(s.id, s.status) for s in found] == [("2-lost", "lost"), ("3-stopped", "stopped")]
    assert [on_disk(d) for d in (done_first, live, lost, stopped, done)] == [
        "failed",
        "running",
        "lost",
        "stopped",
        "succeeded",
    ]
    rows = {r.id: r.status for r in RunStore().list_runs()}
    assert (rows["2-lost"], rows["3-stopped"], rows["1-live"]) == ("lost", "stopped", "running")
    assert reconcile.record_lost_runs() == []  # recorded once


def test_an_end_left_only_in_exit_status_is_recorded(gpustation_dirs: object) -> None:
    directory = make_run("x", status="running", supervisor_pid=gone())
    rundir.prepare_exit_status(directory)
    rundir.write_exit_status(directory, RunState(id="x", status="succeeded", exit_code=0))
    [state] = reconcile.record_lost_runs()
    assert (state.id, state.status) == ("x", "succeeded")
    assert on_disk(directory) == "succeeded"
    assert reconcile.record_lost_runs() == []


def test_an_end_in_exit_status_while_its_supervisor_still_writes_is_left_to_it(
    gpustation_dirs: object, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    pid, started = sleeper(sleepers)
    directory = make_run("y", status="running", supervisor_pid=pid, supervisor_create_time=started)
    rundir.prepare_exit_status(directory)
    rundir.write_exit_status(directory, RunState(id="y", status="failed", exit_code=1))
    assert reconcile.record_lost_runs() == []
    assert on_disk(directory) == "running"


def test_the_runs_still_going_are_listed_oldest_first(
    gpustation_dirs: object, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    assert reconcile.list_active_runs() == []  # no runs directory yet
    pid, started = sleeper(sleepers)
    make_run("0-lost", status="running", supervisor_pid=gone())
    make_run("0-done", status="failed")
    (make_run("0-garbage", status="running") / rundir.STATE_JSON).write_text("{not json")
    make_run("b-live", status="running", supervisor_pid=pid, supervisor_create_time=started)
    make_run("a-starting", status="starting")
    other, other_started = sleeper(sleepers)
    make_run(  # its supervisor's pid now names another process; its child still runs
        "c-unsupervised",
        status="running",
        supervisor_pid=pid,
        supervisor_create_time=started - 1000.0,
        child_pid=other,
        child_create_time=other_started,
    )
    (paths.runs_dir() / "e-empty").mkdir()
    found = reconcile.list_active_runs()
    assert [(r.id, r.state.status, r.supervised) for r in found] == [
        ("a-starting", "starting", True),
        ("b-live", "running", True),
        ("c-unsupervised", "running", False),
    ]
    assert found[1].run == {"id": "b-live", "preset": {"name": "p"}}
    assert on_disk(paths.runs_dir() / "0-lost") == "running"  # listing writes nothing


def test_a_step_of_the_clock_leaves_a_running_run_running(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    """psutil's start time is the boot time plus the ticks since boot, and the boot
    time moves with every step of the clock: after a step of a second, the times
    written at the start no longer agree with the live processes' (as below). The
    start tokens, ticks since boot, still do: the run is still running, and a stop
    still finds its processes."""
    sup, sup_time = sleeper(sleepers)
    child, child_time = sleeper(sleepers)
    worker, worker_time = sleeper(sleepers)
    stepped = 1.0  # what a one-second step of the clock does to the times read now
    directory = make_run(
        "stepped",
        status="running",
        supervisor_pid=sup,
        supervisor_create_time=sup_time - stepped,
        supervisor_start=rundir.start_of(sup),
        child_pid=child,
        child_create_time=child_time - stepped,
        child_start=rundir.start_of(child),
        descendants=[[worker, worker_time - stepped, rundir.start_of(worker)]],
    )
    state = reconcile.check_run(directory)
    assert state is not None and state.status == "running"
    assert [r.id for r in reconcile.list_active_runs()] == ["stepped"]
    assert reconcile.record_lost_runs() == []
    assert rundir.descendant_matches(state.descendants[0])
    # Without the tokens (a state written before they were kept), the times decide:
    # the same step reads as the processes gone.
    legacy = make_run(
        "legacy",
        status="running",
        supervisor_pid=sup,
        supervisor_create_time=sup_time - stepped,
        child_pid=child,
        child_create_time=child_time - stepped,
    )
    assert (found := reconcile.check_run(legacy)) is not None and found.status == "lost"
    assert not rundir.descendant_matches([worker, worker_time - stepped])
    assert rundir.descendant_matches([worker, worker_time])


def test_a_start_token_of_another_process_is_not_the_run_s(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    """A pid reused by another process: its token differs, whatever the times say."""
    sup, sup_time = sleeper(sleepers)
    other, _ = sleeper(sleepers)
    directory = make_run(
        "reused",
        status="running",
        supervisor_pid=sup,
        supervisor_create_time=sup_time,
        supervisor_start=f"{rundir.start_of(other)}1",  # another start, the same pid
        child_pid=gone(),
    )
    state = reconcile.check_run(directory)
    assert state is not None and state.status == "lost"
