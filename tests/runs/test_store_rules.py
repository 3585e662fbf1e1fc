"""The run index's own rules, in-process: every column keeps its type, a damaged or
missing index is rebuilt from the run directories and says so, a lagging row is
caught up, a lock is waited for only so long."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from gpustation.runs import rundir
from gpustation.runs.gputrace import TelemetrySummary
from gpustation.runs.rundir import RunState
from gpustation.runs.store import index as store_mod
from gpustation.runs.store.index import (
    RunStore,
    apply_telemetry,
    record_from_dir,
    runs_by_status,
    sync_run,
)
from gpustation.runs.store.tidy import annotate
from gpustation.runs.summary import RunSummary


def _run(root: Path, name: str, status: str = "succeeded", started: float = 1000.0) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    rundir.write_json(
        directory / rundir.RUN_JSON,
        {"id": name, "created_at": started, "preset": {"name": "p"}, "gpus": [0]},
    )
    rundir.write_state(
        directory, RunState(id=name, status=status, started_at=started, ended_at=started + 5)
    )
    return directory


def _got(store: RunStore, run_id: str) -> RunSummary:
    """The run's row; a missing one fails the test."""
    got = store.get(run_id)
    assert got is not None, f"no row for {run_id}"
    return got


def _numeric_looking(annotation: str) -> object:
    """A value of the field's type that a column of the wrong type would change."""
    if annotation.startswith("bool"):
        return True
    if annotation.startswith("int"):
        return 7
    if annotation.startswith("float"):
        return 7.0  # a whole number: a column of the wrong type makes it an int
    if annotation.startswith("list"):
        return ["7"] if "str" in annotation else [7]
    if annotation.startswith("dict"):
        return {"lr": "7"}
    return "7"  # text that looks like a number


def test_every_column_gives_back_the_type_it_was_given(tmp_path: Path) -> None:
    values: dict[str, Any] = {
        f.name: _numeric_looking(str(f.type))
        for f in dataclasses.fields(RunSummary)
        if f.name != "id"
    }
    record = RunSummary(id="20260101-000000-p-abcd", **values)
    store = RunStore(tmp_path / "runs.db")
    store.upsert(record)
    got = store.get(record.id)
    assert got is not None
    assert got.to_dict() == record.to_dict()
    assert {k: type(v) for k, v in got.to_dict().items()} == {
        k: type(v) for k, v in record.to_dict().items()
    }


def test_an_unreadable_index_is_set_aside_and_rebuilt_with_a_warning(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    _run(root, "a")
    _run(root, "b", status="failed", started=2000.0)
    db = tmp_path / "runs.db"
    db.write_bytes(b"this is not a database" * 100)
    for extra in ("-wal", "-shm"):
        Path(f"{db}{extra}").write_bytes(b"x")
    said: list[str] = []
    store = RunStore(db, warn=said.append)
    assert [r.id for r in store.list_runs()] == ["b", "a"]  # read from the directories
    assert said == [
        f"{db} is unreadable (file is not a database); rebuilt the run history from 2 run "
        "directories (the next run writes it again)"
    ]
    said.clear()
    _run(root, "c", started=3000.0)
    sync_run(root / "c", store)  # a writer puts the index right
    (aside,) = tmp_path.glob("runs.db.bad-*")
    assert aside.read_bytes().startswith(b"this is not a database")
    assert said == [
        f"{db} was unreadable (file is not a database); kept it as {aside.name} and rebuilt "
        "the run history from 2 run directories"
    ]
    for extra in ("-wal", "-shm"):  # the old WAL files went with it
        old = Path(f"{db}{extra}")
        assert not old.exists() or old.read_bytes() != b"x"
    rows = sqlite3.connect(db).execute("SELECT id, status FROM runs ORDER BY id").fetchall()
    assert rows == [("a", "succeeded"), ("b", "failed"), ("c", "succeeded")]


def test_a_missing_index_is_rebuilt_and_says_so_only_when_there_were_runs(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    said: list[str] = []
    empty = RunStore(tmp_path / "runs.db", warn=said.append)
    _run(root, "first")
    sync_run(root / "first", empty)  # the one being written is not counted as rebuilt
    assert said == []
    (tmp_path / "runs.db").unlink()
    _run(root, "second", started=2000.0)
    again = RunStore(tmp_path / "runs.db", warn=said.append)
    sync_run(root / "second", again)
    assert said == [
        f"{tmp_path / 'runs.db'} was missing; rebuilt the run history from 1 run directories"
    ]
    assert {r.id for r in again.list_runs()} == {"first", "second"}


def test_a_row_that_lags_its_directory_is_read_from_it_and_caught_up(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    store = RunStore(tmp_path / "runs.db")
    directory = _run(root, "r", status="running")
    sync_run(directory, store)
    assert store.catch_up() == 0
    rundir.write_state(
        directory, RunState(id="r", status="stopped", started_at=1000.0, ended_at=1009.0)
    )
    unsynced = _run(root, "new", started=2000.0)  # a run whose row was never written
    assert {r.id: r.status for r in store.list_runs()} == {"new": "succeeded", "r": "stopped"}
    rows = dict(sqlite3.connect(store.db).execute("SELECT id, status FROM runs").fetchall())
    assert rows == {"r": "running"}  # a reader writes nothing
    assert store.catch_up() == 2
    rows = dict(sqlite3.connect(store.db).execute("SELECT id, status FROM runs").fetchall())
    assert rows == {"r": "stopped", "new": "succeeded"}
    assert store.catch_up() == 0
    assert unsynced.is_dir()


def test_a_row_written_without_a_key_is_taken_as_it_is(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    store = RunStore(tmp_path / "runs.db")
    directory = _run(root, "r")
    record = sync_run(directory, store)
    record.title = "as the follower wrote it"
    store.upsert(record)  # no key
    assert _got(store, "r").title == "as the follower wrote it"
    assert store.catch_up() == 0


def test_runs_by_status_counts_rows_and_is_empty_without_a_sound_index(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    store = RunStore(tmp_path / "runs.db")
    for name, status in (("a", "failed"), ("b", "succeeded"), ("c", "failed")):
        sync_run(_run(root, name, status=status), store)
    assert runs_by_status(store.db) == {"failed": 2, "succeeded": 1}
    assert runs_by_status(tmp_path / "none.db") == {}
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"garbage" * 100)
    assert runs_by_status(bad) == {}


def test_a_write_waits_for_a_lock_only_as_long_as_it_may(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    store = RunStore(tmp_path / "runs.db", write_wait_s=0.5)
    sync_run(_run(root, "a"), store)
    holder = sqlite3.connect(store.db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        began = time.monotonic()
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            store.delete("a")
        assert time.monotonic() - began >= 0.5
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store.delete("a")
    assert sqlite3.connect(store.db).execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_an_index_found_damaged_under_a_writer_is_rebuilt_once(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    said: list[str] = []
    store = RunStore(tmp_path / "runs.db", warn=said.append)
    sync_run(_run(root, "a"), store)
    store.db.write_bytes(b"damaged under us" * 100)
    for extra in ("-wal", "-shm"):
        Path(f"{store.db}{extra}").unlink(missing_ok=True)
    sync_run(_run(root, "b", started=2000.0), store)
    assert any("kept it as runs.db.bad-" in s for s in said), said
    ids = [r[0] for r in sqlite3.connect(store.db).execute("SELECT id FROM runs ORDER BY id")]
    assert ids == ["a", "b"]


def test_errors_are_told_busy_or_corrupt() -> None:
    assert store_mod._busy(sqlite3.OperationalError("database is locked"))
    assert store_mod._busy(sqlite3.OperationalError("Database Busy"))
    assert not store_mod._busy(sqlite3.OperationalError("disk I/O error"))
    assert store_mod._corrupt(sqlite3.DatabaseError("file is not a database"))
    assert store_mod._corrupt(sqlite3.OperationalError("database disk image is MALFORMED"))
    assert store_mod._corrupt(sqlite3.OperationalError("file is not a database"))
    assert not store_mod._corrupt(sqlite3.OperationalError("database is locked"))
    assert not store_mod._corrupt(sqlite3.Error("something else"))


def test_an_index_of_an_older_version_gains_the_new_columns(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    old = sqlite3.connect(db)
    old.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, status TEXT, overrides TEXT, oom INTEGER)")
    old.execute("INSERT INTO runs VALUES ('old', 'succeeded', 'not json', NULL)")
    old.commit()
    old.close()
    store = RunStore(db)
    got = store.get("old")
    assert got is not None and (got.status, got.overrides, got.gpus, got.oom) == (
        "succeeded",
        {},
        [],
        False,
    )
    assert got.malformed_metrics == 0 and got.summary == {} and got.resumed_from == {}
    _run(tmp_path / "runs", "new")
    sync_run(tmp_path / "runs" / "new", store)
    columns = {row[1] for row in sqlite3.connect(db).execute("PRAGMA table_info(runs)")}
    assert {"malformed_metrics", "energy_j", store_mod.KEY_COLUMN} <= columns
    assert {r.id for r in store.list_runs()} == {"old", "new"}


def test_the_key_of_a_state_follows_what_a_row_must_agree_on() -> None:
    a = RunState(
        id="r", status="failed", started_at=1.0, ended_at=2.0, exit_code=3, signal="SIGKILL"
    )
    assert store_mod.state_key(a) == '["failed", 1.0, 2.0, 3, "SIGKILL"]'
    assert store_mod.state_key(None) == ""
    assert store_mod.state_key(dataclasses.replace(a, reason="other")) == store_mod.state_key(a)


def test_a_note_of_digits_stays_text(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs.db")
    sync_run(_run(tmp_path / "runs", "r"), store)
    annotate(store, "r", note="42")
    assert _got(store, "r").note == "42"


def test_a_finished_run_s_state_changed_on_disk_is_read_again(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    store = RunStore(tmp_path / "runs.db")
    directory = _run(root, "r", status="stopped")
    sync_run(directory, store)
    assert _got(store, "r").status == "stopped"
    # a later writer (a reconcile) changed it; its row lags
    rundir.write_state(
        directory, RunState(id="r", status="lost", started_at=1000.0, ended_at=1001.0)
    )
    assert _got(store, "r").status == "lost"
    assert store.catch_up() == 1
    assert _got(store, "r").status == "lost"


def test_lagging_directories_after_an_agreeing_one_are_all_read(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    said: list[str] = []
    store = RunStore(tmp_path / "runs.db", warn=said.append)
    for name in ("a", "b", "c"):
        sync_run(_run(root, name, status="running"), store)
    for name in ("b", "c"):
        rundir.write_state(root / name, RunState(id=name, status="failed", started_at=1000.0))
    assert {r.id: r.status for r in store.list_runs()} == {
        "a": "running",
        "b": "failed",
        "c": "failed",
    }
    assert said == []  # a sound index: nothing to say


def test_a_missing_index_is_said_to_be_missing_while_the_directories_answer(
    tmp_path: Path,
) -> None:
    said: list[str] = []
    _run(tmp_path / "runs", "a")
    store = RunStore(tmp_path / "runs.db", warn=said.append)
    assert [r.id for r in store.list_runs()] == ["a"]
    assert said == [
        f"{store.db} is missing; rebuilt the run history from 1 run directories "
        "(the next run writes it again)"
    ]


def test_runs_sort_by_start_newest_first_those_without_one_last(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs.db")
    for name, started in (("zero", 0.0), ("half", 0.5), ("none", None)):
        store.upsert(RunSummary(id=name, status="succeeded", started_at=started))
    assert [r.id for r in store.list_runs()] == ["half", "zero", "none"]


def test_text_an_older_version_stored_as_it_came_is_made_safe(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs.db")
    store.upsert(RunSummary(id="r", status="succeeded"))
    conn = sqlite3.connect(store.db)
    conn.execute(
        "UPDATE runs SET title = ?, tags = ? WHERE id = 'r'", ("a\x1b[2Jb", '["t\\u001b"]')
    )
    conn.commit()
    conn.close()
    got = store.get("r")
    assert got is not None and "\x1b" not in (got.title or "") and (got.title or "").startswith("a")
    assert "\x1b" not in "".join(got.tags)


def test_numbers_sqlite_cannot_hold_are_stored_as_none(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs.db")
    for run_id, value in (
        ("inf", float("inf")),
        ("nan", float("nan")),
    ):
        store.upsert(RunSummary(id=run_id, energy_j=value))
        assert _got(store, run_id).energy_j is None
    for run_id, code, kept in (
        ("lowest", -(1 << 63), True),
        ("below", -(1 << 63) - 1, False),
        ("highest", (1 << 63) - 1, True),
        ("above", 1 << 63, False),
        ("minus-one", -1, True),
    ):
        store.upsert(RunSummary(id=run_id, exit_code=code))
        assert _got(store, run_id).exit_code == (code if kept else None), run_id


def test_the_index_s_lock_and_a_kept_aside_file_are_named_and_private(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    store = RunStore(tmp_path / "runs.db", warn=lambda _m: None)
    sync_run(_run(root, "a"), store)
    lock = tmp_path / "runs.db.lock"
    assert lock.exists() and lock.stat().st_mode & 0o777 == 0o600
    store.db.write_bytes(b"not a database" * 100)
    sync_run(_run(root, "b"), RunStore(store.db, warn=lambda _m: None))
    (aside,) = tmp_path.glob("runs.db.bad-*")
    assert re.fullmatch(r"runs\.db\.bad-\d{8}-\d{6}", aside.name), aside.name


def test_a_run_directory_without_a_state_or_a_run_file(tmp_path: Path) -> None:
    bare = tmp_path / "runs" / "only-state"
    bare.mkdir(parents=True)
    rundir.write_state(
        bare, RunState(id="only-state", status="failed", started_at=5.0, ended_at=9.0)
    )
    got = record_from_dir(bare)
    assert (got.id, got.status, got.duration_s) == ("only-state", "failed", 4.0)
    unstated = tmp_path / "runs" / "no-state"
    unstated.mkdir()
    rundir.write_json(
        unstated / rundir.RUN_JSON, {"id": "no-state", "created_at": time.time() - 100}
    )
    (unstated / rundir.STATE_JSON).write_text("{not json")
    took = record_from_dir(unstated)
    assert took.duration_s is not None and 99.0 <= took.duration_s < 3600.0  # still going
    gone = tmp_path / "runs" / "gone"
    with pytest.raises(FileNotFoundError) as err:
        record_from_dir(gone)
    assert str(err.value) == f"run directory {gone} is gone"
    # a state file that cannot be read does not stop the listing
    store = RunStore(tmp_path / "runs.db")
    assert [r.id for r in store.list_runs()] == ["no-state"]  # listed: it has a run.json
    assert [r.id for r in store.list_runs()] == ["no-state"]


def test_what_the_gpus_did_goes_into_the_row(tmp_path: Path) -> None:
    tele = TelemetrySummary(
        samples=3,
        duration_s=10.0,
        energy_j=500.0,
        avg_power_w=50.0,
        peak_power_w=80.0,
        peak_temp_c=70.0,
        peak_vram_mib=900.0,
        throttled_s=2.0,
        tensor_active_pct=40.0,
    )
    record = RunSummary(id="r", peak_vram_mib=1200.0, work=100.0)
    got = apply_telemetry(record, tele, tmp_path)
    assert (got.energy_j, got.avg_power_w, got.peak_power_w, got.peak_temp_c) == (
        500.0,
        50.0,
        80.0,
        70.0,
    )
    assert (got.tensor_active_pct, got.throttled_s, got.peak_vram_mib) == (40.0, 2.0, 1200.0)
    assert got.energy_per_unit_j == 5.0 and got.energy_shared is False
    (tmp_path / rundir.SHARED_GPUS).write_text("")
    assert apply_telemetry(RunSummary(id="r"), tele, tmp_path).energy_shared is True
    split = TelemetrySummary(energy_j=500.0, split=True)
    assert apply_telemetry(RunSummary(id="r"), split, tmp_path).energy_shared is False
    none = apply_telemetry(RunSummary(id="r", work=100.0), TelemetrySummary(), tmp_path)
    assert none.energy_per_unit_j is None and none.energy_shared is False
    assert none.peak_vram_mib is None


def test_columns_an_older_index_gains_keep_their_types(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    old = sqlite3.connect(db)
    old.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, status TEXT)")
    old.commit()
    old.close()
    store = RunStore(db)
    store.upsert(RunSummary(id="r", title="7", note="8", exit_code=3, steps=4))
    got = store.get("r")
    assert got is not None and (got.title, got.note, got.exit_code, got.steps) == ("7", "8", 3, 4)


def test_listing_again_reads_only_the_states_that_changed_or_are_still_going(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "runs"
    store = RunStore(tmp_path / "runs.db", root=root)
    for n, name in enumerate(("a", "b")):
        sync_run(_run(root, name, started=1000.0 + n), store)
    sync_run(_run(root, "c", status="running", started=1003.0), store)
    real = rundir.read_state
    reads: list[str] = []

    def counting(directory: Path) -> RunState | None:
        reads.append(directory.name)
        return real(directory)

    monkeypatch.setattr(rundir, "read_state", counting)
    assert [r.id for r in store.list_runs()] == ["c", "b", "a"]
    reads.clear()
    assert [r.id for r in store.list_runs()] == ["c", "b", "a"]
    assert sorted(set(reads)) == ["c"]  # a run still going may have ended in exit-status
    reads.clear()
    rundir.write_state(root / "a", RunState(id="a", status="failed", started_at=1000.0))
    assert {r.id: r.status for r in store.list_runs()}["a"] == "failed"
    assert "a" in reads and "b" not in reads


def test_the_history_lives_in_the_data_dir_and_a_store_may_name_its_runs(
    tmp_path: Path, gpustation_dirs: dict[str, Path]
) -> None:
    assert store_mod.db_path() == gpustation_dirs["data"] / "runs.db"
    elsewhere = tmp_path / "elsewhere"
    store = RunStore(tmp_path / "index" / "runs.db", root=elsewhere)
    assert store.runs_root == elsewhere
    _run(elsewhere, "x")
    assert [r.id for r in store.list_runs()] == ["x"]


def test_an_index_set_aside_takes_its_journal_files_with_it(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    said: list[str] = []
    store = RunStore(tmp_path / "runs.db", warn=said.append)
    _run(root, "a")
    store.db.write_bytes(b"not a database" * 100)
    for extra in ("-wal", "-shm", "-journal"):
        Path(f"{store.db}{extra}").write_bytes(b"left by the bad file" * 10)
    sync_run(_run(root, "b", started=2000.0), store)
    assert any("kept it as runs.db.bad-" in s for s in said), said
    for extra in ("-wal", "-shm", "-journal"):
        leftover = Path(f"{store.db}{extra}")
        assert not leftover.exists() or b"left by the bad file" not in leftover.read_bytes()
    assert {r.id for r in store.list_runs()} == {"a", "b"}


def test_a_rebuilt_index_keeps_each_row_s_state_key_and_skips_what_it_cannot_read(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runs"
    store = RunStore(tmp_path / "runs.db")
    _run(root, "a-good")
    broken = _run(root, "b-broken")
    (broken / rundir.RUN_JSON).write_text(json.dumps({"id": "b", "gpus": 5, "preset": 3}))
    _run(root, "c-good", started=3000.0)
    sync_run(_run(root, "0-new", started=4000.0), store)  # the first writer rebuilds
    rows = dict(sqlite3.connect(store.db).execute(f"SELECT id, {store_mod.KEY_COLUMN} FROM runs"))
    assert sorted(rows) == ["0-new", "a-good", "c-good"]
    for name in ("0-new", "a-good", "c-good"):
        assert rows[name] == store_mod.state_key(rundir.read_state(root / name))


def test_a_run_directory_that_cannot_be_read_holds_back_no_reader_or_writer(
    tmp_path: Path,
) -> None:
    root = tmp_path / "runs"
    store = RunStore(tmp_path / "runs.db")
    sync_run(_run(root, "a"), store)
    broken = _run(root, "b-broken")
    (broken / rundir.RUN_JSON).write_text(json.dumps({"id": "b", "gpus": 5, "preset": 3}))
    _run(root, "c-lagging", started=2000.0)  # written while the index was locked, say
    assert [r.id for r in store.list_runs()] == ["c-lagging", "a"]  # readers skip it too
    assert store.catch_up() == 2
    ids = [r[0] for r in sqlite3.connect(store.db).execute("SELECT id FROM runs ORDER BY id")]
    assert ids == ["a", "c-lagging"]
    # caught up with its state's key: a later change of the state is seen again
    rundir.write_state(root / "c-lagging", RunState(id="c-lagging", status="failed"))
    assert {r.id: r.status for r in store.list_runs()}["c-lagging"] == "failed"


def test_a_row_is_written_from_the_state_it_is_given(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    store = RunStore(tmp_path / "runs.db")
    directory = _run(root, "a", status="running")
    ended = RunState(id="a", status="failed", started_at=1000.0, ended_at=1010.0, exit_code=3)
    record = sync_run(directory, store, state=ended)  # written before state.json is
    assert (record.status, record.exit_code) == ("failed", 3)
    row = sqlite3.connect(store.db).execute("SELECT status, exit_code FROM runs").fetchone()
    assert row == ("failed", 3)


def test_a_run_without_a_state_lasts_from_its_start_and_never_less_than_nothing(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "runs" / "future"
    directory.mkdir(parents=True)
    rundir.write_json(directory / rundir.RUN_JSON, {"id": "future", "created_at": time.time() + 60})
    assert record_from_dir(directory).duration_s == 0.0
    past = tmp_path / "runs" / "past"
    past.mkdir()
    rundir.write_json(past / rundir.RUN_JSON, {"id": "past", "created_at": time.time() - 100})
    assert record_from_dir(past).duration_s == pytest.approx(100.0, abs=5.0)


def test_a_multi_node_run_counts_the_gpus_of_every_node(tmp_path: Path) -> None:
    directory = _run(tmp_path / "runs", "multi")
    rundir.write_json(directory / "nodes.json", {"nodes": [{"host": "box1"}, {"host": "box2"}]})
    for host, energy in (("box1", 1000.0), ("box2", 3000.0)):
        node = directory / "nodes" / host
        node.mkdir(parents=True)
        lines = [
            {"t": 0, "gpus": [{"index": 0, "power_w": 100.0, "energy_j": 0.0}]},
            {"t": 10, "gpus": [{"index": 0, "power_w": 100.0, "energy_j": energy}]},
        ]
        (node / "telemetry.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert record_from_dir(directory).energy_j == pytest.approx(4000.0)


def test_what_the_gpus_did_is_written_into_the_row() -> None:
    tele = TelemetrySummary(
        energy_j=500.0,
        peak_memory_temp_c=88.0,
        peak_vram_mib=20000.0,
        estimated=True,
    )
    real = apply_telemetry(RunSummary(id="r", peak_vram_mib=100.0), tele, Path("/x"))
    assert (real.peak_memory_temp_c, real.peak_vram_mib) == (88.0, 20000.0)
    assert real.energy_estimated is True
    sim = apply_telemetry(RunSummary(id="s", simulated=True, peak_vram_mib=100.0), tele, Path("/x"))
    assert sim.peak_vram_mib == 100.0  # a simulated card's memory is not the run's
    unknown = apply_telemetry(RunSummary(id="u"), TelemetrySummary(estimated=True), Path("/x"))
    assert unknown.energy_j is None and unknown.energy_estimated is False


def test_a_new_history_is_private_from_its_first_byte(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        store = RunStore(tmp_path / "runs.db")
        sync_run(_run(tmp_path / "runs", "a"), store)
    finally:
        os.umask(old)
    assert store.db.stat().st_mode & 0o777 == 0o600


def test_a_state_file_holding_a_number_json_cannot_hold_is_still_listed(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    store = RunStore(tmp_path / "runs.db")
    directory = _run(root, "a")
    # Python's json reads NaN and Infinity; the key of such a state is still JSON
    (directory / rundir.STATE_JSON).write_text(
        '{"id": "a", "status": "failed", "started_at": NaN, "ended_at": Infinity}'
    )
    assert [(r.id, r.status) for r in store.list_runs()] == [("a", "failed")]
    state = rundir.read_state(directory)
    assert store_mod.state_key(state) == '["failed", null, null, null, null]'
    sync_run(directory, store)
    assert [(r.id, r.status) for r in store.list_runs()] == [("a", "failed")]
