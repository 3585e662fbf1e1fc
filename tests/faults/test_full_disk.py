"""The child's exit status survives a full data disk.

The data dir is a small tmpfs (mounted for the test: everything here runs as
root, CI included) and the run itself fills it; and, for machines where no
tmpfs can be mounted, ENOSPC is injected into every Python process through a
sitecustomize (tests/faults/enospc). The supervisor's writes at the end fail
with ENOSPC; it must keep the status, leave it in its pre-allocated
``exit-status`` file (overwritten in place, no new blocks), and write
``state.json`` and the history row once there is room again.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpustation.runs import rundir
from gpustation.runs.launch.start import launch
from gpustation.runs.presets import load_presets
from gpustation.runs.store.index import db_path
from tests.conftest import child_env, gpustation_cmd
from tests.runs.conftest import RunsEnv, command_preset, runs_environment, wait_until

TIMEOUT = 60.0


ENOSPC_DIR = Path(__file__).resolve().parent / "enospc"


@dataclass
class FullDisk:
    data: Path
    #: makes room again
    free: Callable[[], None]
    #: the writes are refused by the test's hook, not by a real filesystem
    injected: bool = False


@pytest.fixture(params=["tmpfs", "injected"])
def full_disk(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FullDisk]:
    if request.param == "injected":
        data, flag = tmp_path / "data", tmp_path / "disk-is-full"
        data.mkdir()
        monkeypatch.setenv("GPUSTATION_DATA_DIR", str(data))
        monkeypatch.setenv("GPUSTATION_TEST_ENOSPC_DIR", str(data))
        monkeypatch.setenv("GPUSTATION_TEST_ENOSPC_FLAG", str(flag))
        monkeypatch.setenv("PYTHONPATH", f"{ENOSPC_DIR}{os.pathsep}{os.environ['PYTHONPATH']}")
        yield FullDisk(data, lambda: flag.unlink(), injected=True)
        return
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (the injected case stands in): {done.stderr}")
    monkeypatch.setenv("GPUSTATION_DATA_DIR", str(mount))
    try:
        yield FullDisk(mount, lambda: next(mount.glob("runs/*/filler")).unlink())
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def runs_env(
    full_disk: FullDisk, gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunsEnv]:
    yield from runs_environment({**gpustation_dirs, "data": full_disk.data}, monkeypatch)


def test_the_exit_status_survives_a_full_disk(runs_env: RunsEnv, full_disk: FullDisk) -> None:
    runs_env["write_preset"]("fill", command_preset("fill", "fill_disk"))
    presets, problems = load_presets()
    assert "fill" in presets, problems
    handle = launch(presets["fill"])
    assert (handle.run_dir / rundir.EXIT_STATUS).stat().st_size == rundir.EXIT_STATUS_BYTES

    # The disk is full and the run has ended: the end is read from exit-status.
    wait_until(
        lambda: (s := rundir.read_state(handle.run_dir)) is not None and not s.active,
        TIMEOUT,
        "the end of the run",
    )
    state = rundir.read_state(handle.run_dir)
    assert state is not None and (state.status, state.exit_code) == ("failed", 7)
    on_disk = json.loads((handle.run_dir / rundir.STATE_JSON).read_text())
    # (starting: with ENOSPC injected the disk may fill before the first write)
    if on_disk["status"] not in rundir.ACTIVE_STATUSES:
        # The tmpfs had room for state.json at the end after all (the few blocks the
        # filler leaves vary): then the end is in exit-status as well.
        assert full_disk.injected is False and on_disk["status"] == "failed", on_disk
        final = rundir.read_exit_status(handle.run_dir)
        assert final is not None and (final["status"], final["exit_code"]) == ("failed", 7)
        return
    supervisor = state.supervisor_pid
    assert rundir.process_matches(supervisor, state.supervisor_create_time), "it did not die"
    listed = subprocess.run(
        gpustation_cmd("runs", "list", "--json"),
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=TIMEOUT,
    )
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["status"], row["exit_code"]) == ("failed", 7)

    # Room again: the supervisor's retries write state.json and the row.
    full_disk.free()
    wait_until(
        lambda: json.loads((handle.run_dir / rundir.STATE_JSON).read_text())["status"] == "failed",
        TIMEOUT,
        "state.json to be written",
    )
    assert json.loads((handle.run_dir / rundir.STATE_JSON).read_text())["exit_code"] == 7

    def row_status() -> object:
        conn = sqlite3.connect(db_path(), timeout=10)
        try:
            return conn.execute(
                "SELECT status, exit_code FROM runs WHERE id = ?", (handle.id,)
            ).fetchone()
        finally:
            conn.close()

    wait_until(lambda: row_status() == ("failed", 7), TIMEOUT, "the history row")
    wait_until(lambda: not rundir.process_matches(supervisor, None), TIMEOUT, "the supervisor")


def test_an_end_left_only_in_exit_status_is_recorded_by_the_next_writer(
    runs_env: RunsEnv, full_disk: FullDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The disk stayed full until the supervisor gave up: the end is in exit-status only.
    from gpustation.runs.launch import supervisor
    from gpustation.runs.store.reconcile import record_lost_runs

    runs_env["write_preset"]("fill", command_preset("fill", "fill_disk"))
    presets, _ = load_presets()
    handle = launch(presets["fill"])
    wait_until(
        lambda: (s := rundir.read_state(handle.run_dir)) is not None and not s.active,
        TIMEOUT,
        "the end of the run",
    )
    state = rundir.read_state(handle.run_dir)
    assert state is not None
    os.kill(state.supervisor_pid or 0, 9)  # as if it had given up
    wait_until(
        lambda: not rundir.process_matches(state.supervisor_pid, state.supervisor_create_time),
        TIMEOUT,
        "the supervisor to go",
    )
    on_disk = json.loads((handle.run_dir / rundir.STATE_JSON).read_text())
    assert on_disk["status"] in rundir.ACTIVE_STATUSES
    full_disk.free()
    assert [s.status for s in record_lost_runs()] == ["failed"]
    on_disk = json.loads((handle.run_dir / rundir.STATE_JSON).read_text())
    assert (on_disk["status"], on_disk["exit_code"]) == ("failed", 7)
    assert supervisor.END_RETRY_S > 0


def test_a_supervisor_retrying_the_end_goes_at_once_on_sigterm(
    runs_env: RunsEnv, full_disk: FullDisk
) -> None:
    # The disk stays full: the supervisor keeps retrying state.json and the row,
    # and SIGTERM (a shutdown, `systemctl stop`) must end that, not wait it out.
    import signal

    runs_env["write_preset"]("fill", command_preset("fill", "fill_disk"))
    presets, _ = load_presets()
    handle = launch(presets["fill"])
    wait_until(
        lambda: (s := rundir.read_state(handle.run_dir)) is not None and not s.active,
        TIMEOUT,
        "the end of the run",
    )
    state = rundir.read_state(handle.run_dir)
    assert state is not None and state.supervisor_pid
    on_disk = json.loads((handle.run_dir / rundir.STATE_JSON).read_text())
    assert on_disk["status"] in rundir.ACTIVE_STATUSES, "the end was written: nothing to retry"
    assert rundir.process_matches(state.supervisor_pid, state.supervisor_create_time)
    os.kill(state.supervisor_pid, signal.SIGTERM)
    wait_until(
        lambda: not rundir.process_matches(state.supervisor_pid, state.supervisor_create_time),
        10.0,
        "the supervisor to go on SIGTERM",
    )
    # The end is kept where a full disk lets it be: the next writer records it.
    final = rundir.read_state(handle.run_dir)
    assert final is not None and (final.status, final.exit_code) == ("failed", 7)
