"""Readers never write: following, listing and showing runs leave runs.db and the run
directory exactly as they were, a lost run included (it is only shown lost)."""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import pytest

from gpustation.commands import run_follow
from gpustation.commands import runs as runs_cmd
from gpustation.runs import rundir
from gpustation.runs.follow import RunFollower
from gpustation.runs.launch.start import launch
from gpustation.runs.launch.stop import wait_for_end
from gpustation.runs.presets import load_presets
from gpustation.runs.store.index import RunStore, db_path
from gpustation.runs.store.reconcile import list_active_runs
from tests.runs.conftest import RunsEnv, command_preset, wait_until

TIMEOUT = 60.0


def snapshot(run_dirs: list[Path]) -> dict[str, tuple[int, int, str]]:
    """Every file a reader could change: (mtime, size, content hash) by path."""
    db = db_path()
    # SQLite itself may create an empty write-ahead log beside the database for
    # a reader's connection: what counts there is the content, none or empty.
    wal = db.with_name(db.name + "-wal")
    wal_data = wal.read_bytes() if wal.exists() else b""
    out: dict[str, tuple[int, int, str]] = {"wal": (0, len(wal_data), str(hash(wal_data)))}
    paths = [db]
    for directory in run_dirs:
        paths += sorted(p for p in directory.rglob("*") if p.is_file())
        paths.append(directory)
    for path in paths:
        if not path.exists():
            continue
        st = path.stat()
        digest = "" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
        listing = ",".join(sorted(p.name for p in path.iterdir())) if path.is_dir() else ""
        out[str(path)] = (st.st_mtime_ns, st.st_size, digest + listing)
    return out


def read_everything(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """Follow the run to its end and list and show it, every way a user can."""
    with RunFollower(run_dir) as follower:
        deadline = time.monotonic() + TIMEOUT
        while not (update := follower.poll()).ended:
            assert time.monotonic() < deadline, "the follower never saw the end"
            time.sleep(0.02)
    run_follow.follow(run_dir, stop_on_interrupt=False)
    list_active_runs()
    store = RunStore()
    store.list_runs()
    store.get(run_dir.name)
    capsys.readouterr()
    runs_cmd.run(argparse.Namespace(runs_action="list", limit=50, status=None, json=True))
    listed = json.loads(capsys.readouterr().out)
    runs_cmd.run(argparse.Namespace(runs_action="show", id=run_dir.name, json=True))
    shown = json.loads(capsys.readouterr().out)
    assert update.state is not None
    return {
        "followed": update.state.status,
        "listed": next(r["status"] for r in listed if r["id"] == run_dir.name),
        "shown": shown["status"],
    }


def test_following_a_finished_run_writes_nothing(
    runs_env: RunsEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    runs_env["write_preset"]("ok", command_preset("ok", "train_ok", args="steps = 3"))
    presets, _ = load_presets()
    handle = launch(presets["ok"])
    final = wait_for_end(handle.run_dir, TIMEOUT)
    assert final is not None and final.status == "succeeded"
    # The supervisor's last write (the row, then state.json) is done once it has exited.
    supervisor = (handle.state or final).supervisor_pid
    wait_until(lambda: not rundir.process_matches(supervisor, None), TIMEOUT, "the supervisor")
    before = snapshot([handle.run_dir])
    seen = read_everything(handle.run_dir, capsys)
    assert seen == {"followed": "succeeded", "listed": "succeeded", "shown": "succeeded"}
    assert snapshot([handle.run_dir]) == before


def test_a_lost_run_is_shown_lost_and_nothing_is_written(
    runs_env: RunsEnv, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = tmp_path / "release"
    runs_env["write_preset"]("wait", command_preset("wait", "wait_file", str(release)))
    presets, _ = load_presets()
    handle = launch(presets["wait"])
    running = rundir.read_state(handle.run_dir)
    assert running is not None and running.status == "running"
    release.touch()
    wait_for_end(handle.run_dir, TIMEOUT)
    supervisor = running.supervisor_pid
    wait_until(lambda: not rundir.process_matches(supervisor, None), TIMEOUT, "the supervisor")
    # As if the machine had restarted mid-run: the files say running, no process is left.
    rundir.write_state(handle.run_dir, running)
    rundir.prepare_exit_status(handle.run_dir)  # no end written there either
    row = RunStore().get(handle.id)
    assert row is not None
    row.status = "running"
    RunStore().upsert(row)
    before = snapshot([handle.run_dir])
    seen = read_everything(handle.run_dir, capsys)
    assert seen == {"followed": "lost", "listed": "lost", "shown": "lost"}
    assert snapshot([handle.run_dir]) == before
    assert (rundir.read_state(handle.run_dir) or running).status == "running"
