"""The history's rules, stated in-process: which runs prune may delete, what delete
refuses, notes and tags, and how the store finds a run from what the user typed."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import psutil
import pytest

from gpustation.errors import UsageError
from gpustation.runs import rundir
from gpustation.runs.rundir import RunState
from gpustation.runs.store import index as store_mod
from gpustation.runs.store import tidy as history
from gpustation.runs.store.index import RunStore, sync_run
from gpustation.runs.summary import RunSummary

NOW = 1_000_000.0
DAY = 86400.0


def _run(
    store: RunStore,
    name: str,
    status: str = "succeeded",
    started: float | None = NOW - 10 * DAY,
    ended: float | None = NOW - 10 * DAY + 60,
    live: bool = False,
) -> Path:
    """A run directory under the store's runs, with its row."""
    directory = store.runs_root / name
    directory.mkdir(parents=True)
    rundir.write_json(
        directory / rundir.RUN_JSON,
        {"id": name, "created_at": started or NOW, "preset": {"name": "p"}, "gpus": [0]},
    )
    me = psutil.Process()
    rundir.write_state(
        directory,
        RunState(
            id=name,
            status=status,
            started_at=started,
            ended_at=ended,
            supervisor_pid=me.pid if live else None,
            supervisor_create_time=me.create_time() if live else None,
        ),
    )
    sync_run(directory, store)
    return directory


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    return RunStore(tmp_path / "runs.db")


def _ids(records: list[RunSummary]) -> list[str]:
    return sorted(r.id for r in records)


def test_prune_takes_the_ended_runs_that_ended_before_the_cutoff(store: RunStore) -> None:
    _run(store, "old-ok")
    _run(store, "old-failed", status="failed")
    _run(store, "recent", ended=NOW - 3600)
    # No end recorded: its start decides.
    _run(store, "no-end-old", status="lost", ended=None)
    _run(store, "no-end-recent", status="lost", started=NOW - 60, ended=None)
    _run(store, "no-time", status="stopped", started=None, ended=None)
    _run(store, "going", status="running", started=NOW - 20 * DAY, ended=None, live=True)
    # the newest run is still going: passed over, the older ones still looked at
    _run(store, "going-new", status="running", started=NOW - 1, ended=None, live=True)
    found = history.prune_candidates(store, 7 * DAY, now=NOW)
    assert _ids(found) == ["no-end-old", "old-failed", "old-ok"]
    assert _ids(history.prune_candidates(store, 7 * DAY, "failed", now=NOW)) == ["old-failed"]
    # Exactly at the cutoff is not older than it.
    _run(store, "at-cutoff", ended=NOW - 2 * DAY)
    assert "at-cutoff" not in _ids(history.prune_candidates(store, 2 * DAY, now=NOW))
    assert "at-cutoff" in _ids(history.prune_candidates(store, 2 * DAY - 1, now=NOW))


def test_prune_s_clock_is_now_when_none_is_given(store: RunStore) -> None:
    _run(store, "old")
    _run(store, "future", started=4e9, ended=4e9 + 1)
    assert _ids(history.prune_candidates(store, 3600)) == ["old"]


def test_prune_refuses_a_status_a_pruned_run_cannot_have(store: RunStore) -> None:
    _run(store, "old")
    with pytest.raises(UsageError) as err:
        history.prune_candidates(store, DAY, "running", now=NOW)
    assert str(err.value) == (
        "--status 'running': not a run status; one of succeeded, failed, stopped, lost"
    )
    history.check_status(None, "--status")  # no status given: nothing to check
    history.check_status("running", "--status")  # a run status, for a list
    with pytest.raises(UsageError) as err:
        history.check_status("done", "--status")
    assert str(err.value) == (
        "--status 'done': not a run status; "
        "one of queued, starting, running, succeeded, failed, stopped, lost"
    )


def test_a_run_whose_row_lags_is_still_going_by_its_directory(store: RunStore) -> None:
    directory = _run(store, "going", status="running", ended=None, live=True)
    record = store.get("going")
    assert record is not None and history.still_going(record)
    record.status = "succeeded"  # a row written before the run started again
    assert history.still_going(record)
    record.run_dir = None
    assert not history.still_going(record)
    record.run_dir = str(directory.parent / "nowhere")
    assert not history.still_going(record)


def test_delete_refuses_before_deleting_any_when_one_is_still_going(store: RunStore) -> None:
    done = _run(store, "done")
    _run(store, "going", status="running", ended=None, live=True)
    with pytest.raises(UsageError) as err:
        history.delete_runs(store, ["done", "going"])
    assert str(err.value) == "run going has not ended; stop it first (`runs stop`)"
    assert done.is_dir() and store.get("done") is not None
    with pytest.raises(UsageError, match="no run 'nope'"):
        history.delete_runs(store, ["done", "nope"])
    assert done.is_dir()
    assert history.delete_runs(store, ["done"]) == ["done"]
    assert not done.exists() and store.get("done") is None


def test_a_row_whose_directory_lies_elsewhere_and_is_gone_is_listed_and_deleted(
    store: RunStore, tmp_path: Path
) -> None:
    directory = _run(store, "moved")
    record = store.get("moved")
    assert record is not None
    record.run_dir = str(tmp_path / "other-disk" / "moved")  # not under this store's runs
    store.upsert(record)
    directory.rename(tmp_path / "moved-away")
    # Not "vanished by hand": its directory was never under these runs.
    assert [r.id for r in store.list_runs()] == ["moved"]
    assert history.delete_runs(store, ["moved"]) == ["moved"]
    assert store.list_runs() == [] and (tmp_path / "moved-away").is_dir()


def test_delete_touches_neither_a_link_nor_a_file_in_a_run_s_place(
    store: RunStore, tmp_path: Path
) -> None:
    linked = _run(store, "linked")
    target = tmp_path / "elsewhere"
    linked.rename(target)
    linked.symlink_to(target)
    with pytest.raises(UsageError) as err:
        history.delete_runs(store, ["linked"])
    assert str(err.value).startswith(
        f"run linked: its directory {linked} is a symbolic link (to {target})"
    )
    assert "nothing was deleted" in str(err.value)
    assert target.is_dir() and linked.is_symlink()
    history._check_deletable("x", None)  # a row without a directory: nothing to check
    flat = tmp_path / "flat"
    flat.write_text("x")
    with pytest.raises(UsageError) as err:
        history._check_deletable("flat", str(flat))
    assert str(err.value) == f"run flat: {flat} is not a directory; nothing was deleted"


def test_delete_that_cannot_remove_a_directory_says_how_many_went_before(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(store, "a")
    _run(store, "b")

    def refuse(path: str) -> None:
        if path.endswith("b"):
            raise PermissionError(13, "Permission denied")
        os.rename(path, path + ".removed")

    monkeypatch.setattr(shutil, "rmtree", refuse)
    with pytest.raises(UsageError) as err:
        history.delete_runs(store, ["a", "b"])
    assert str(err.value).endswith("(Permission denied); runs deleted before it: 1")
    assert str(err.value).startswith("run b: cannot delete ")
    assert store.get("b") is not None


def test_tags_and_notes_are_kept_in_the_run_directory(store: RunStore) -> None:
    directory = _run(store, "r")
    history.annotate(store, "r", note="first", add=["b", "a"])
    history.annotate(store, "r", add=["a", "c"], remove=["b"])
    saved = json.loads((directory / rundir.ANNOTATIONS_JSON).read_text())
    assert saved == {"tags": ["a", "c"], "note": "first"}
    summary = history.annotate(store, "r", note="")
    assert json.loads((directory / rundir.ANNOTATIONS_JSON).read_text())["note"] is None
    assert summary.tags == ["a", "c"] and not summary.note
    kept = history.annotate(store, "r")  # no note given: the note stays
    assert kept.tags == ["a", "c"]
    history.annotate(store, "r", note="x" * 4096)
    with pytest.raises(UsageError) as err:
        history.annotate(store, "r", note="x" * 4097)
    assert str(err.value) == "a note is at most 4,096 characters"


@pytest.mark.parametrize("tag", ["", "a b", "x" * 65, "é"])
def test_a_tag_outside_the_tag_alphabet_is_refused(store: RunStore, tag: str) -> None:
    _run(store, "r")
    with pytest.raises(UsageError) as err:
        history.annotate(store, "r", remove=[tag])
    assert str(err.value) == (
        f"tag {tag!r}: letters, digits and . _ : - + /, at most 64 characters"
    )


def test_a_tag_of_64_characters_from_the_alphabet_is_taken(store: RunStore) -> None:
    _run(store, "r")
    tag = "aZ09._:-+/" + "x" * 54
    assert history.annotate(store, "r", add=[tag]).tags == [tag]


def test_annotating_a_run_without_a_directory_says_so(store: RunStore) -> None:
    with pytest.raises(UsageError) as err:
        history.annotate(store, "nope", note="x")
    assert str(err.value) == "run nope: no run directory"


def test_a_run_is_found_by_its_id_last_or_a_unique_part(store: RunStore) -> None:
    _run(store, "20260101-aa-x", started=NOW - 3 * DAY)
    _run(store, "20260102-bb-x", started=NOW - 2 * DAY)
    _run(store, "20260103-aa", started=NOW - DAY)
    _run(store, "20260103-aa-longer", started=NOW - 4 * DAY)
    assert store.resolve_id("last") == "20260103-aa"  # the newest start
    assert store.resolve_id("20260103-aa") == "20260103-aa"  # an id that is also a prefix
    assert store.resolve_id("bb") == "20260102-bb-x"  # a part, when no id starts with it
    assert store.resolve_id("20260101") == "20260101-aa-x"
    with pytest.raises(UsageError) as err:
        store.resolve_id("-x")
    assert str(err.value) == (
        "'-x' matches 2 runs (20260102-bb-x, 20260101-aa-x...); give more of the id"
    )
    for n in range(5):
        _run(store, f"20250101-many-{n}", started=NOW - (10 + n) * DAY)
    with pytest.raises(UsageError) as err:
        store.resolve_id("many")
    assert str(err.value) == (
        "'many' matches 5 runs (20250101-many-0, 20250101-many-1, 20250101-many-2, "
        "20250101-many-3...); give more of the id"
    )
    with pytest.raises(UsageError) as err:
        store.resolve_id("zz")
    assert str(err.value) == "no run 'zz'; see `gpustation runs list`"
    with pytest.raises(UsageError, match="no run 'last'"):
        RunStore(store.db.parent / "empty" / "runs.db").resolve_id("last")


def test_the_list_is_newest_first_and_cut_to_its_limit(store: RunStore) -> None:
    _run(store, "b", started=NOW - 2 * DAY)
    _run(store, "a", started=NOW - 2 * DAY)
    _run(store, "c", started=NOW - DAY, status="failed")
    assert [r.id for r in store.list_runs()] == ["c", "b", "a"]
    assert [r.id for r in store.list_runs(limit=2)] == ["c", "b"]
    assert [r.id for r in store.list_runs(status="succeeded")] == ["b", "a"]
    assert [r.id for r in store.list_runs(limit=0)] == ["c", "b", "a"]


def test_a_warning_is_said_once_a_process(capsys: pytest.CaptureFixture[str]) -> None:
    message = f"the index was rebuilt ({uuid.uuid4()})"  # new to this process
    store_mod._warn(message)
    store_mod._warn(message)
    assert capsys.readouterr().err == f"gpustation: {message}\n"
