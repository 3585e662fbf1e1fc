"""Keeping the history tidy: delete runs, prune old ones, notes and tags.

These are writers (the user asked for them): a run's note and tags live in
its directory (``annotations.json``), like everything else of the run, and the
index row is brought up to date after. A run that is still going is never
deleted; stop it first.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from gpustation.errors import UsageError
from gpustation.runs import rundir
from gpustation.runs.rundir import STATUSES
from gpustation.runs.store.index import RunStore, sync_run
from gpustation.runs.store.reconcile import check_run
from gpustation.runs.summary import RunSummary
from gpustation.textsafe import valid_unicode
from gpustation.timespec import parse_span as parse_span  # where the prune dialog reads it

_TAG_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-+/")


def _directory(store: RunStore, run_id: str) -> Path:
    record = store.get(run_id)
    if record is None or not record.run_dir:
        raise UsageError(f"run {run_id}: no run directory")
    return Path(record.run_dir)


def annotate(
    store: RunStore,
    run_id: str,
    note: str | None = None,
    add: Sequence[str] = (),
    remove: Sequence[str] = (),
) -> RunSummary:
    """Set a run's note (``""`` clears it) and add or remove tags."""
    for tag in (*add, *remove):
        if not tag or len(tag) > 64 or not set(tag) <= _TAG_CHARS:
            raise UsageError(f"tag {tag!r}: letters, digits and . _ : - + /, at most 64 characters")
    if note is not None:
        note = valid_unicode(note)  # a shell hands non-UTF-8 bytes on as surrogates
    if note is not None and len(note) > 4096:
        raise UsageError("a note is at most 4,096 characters")
    directory = _directory(store, run_id)
    path = directory / rundir.ANNOTATIONS_JSON
    data = rundir.read_json(path) or {}
    tags = [t for t in rundir.string_list(data.get("tags")) if t not in remove]
    tags += [t for t in add if t not in tags]
    data["tags"] = tags
    if note is not None:
        data["note"] = note or None
    rundir.write_json(path, data)
    return sync_run(directory, store)


def still_going(record: RunSummary) -> bool:
    """Whether a run has not ended, by its row or by its directory (a row can lag)."""
    if record.active:
        return True
    if not record.run_dir:
        return False
    state = check_run(Path(record.run_dir))
    return state is not None and state.active


def check_status(status: str | None, what: str, statuses: Sequence[str] = STATUSES) -> None:
    """A UsageError naming the valid statuses when ``status`` is none of ``statuses``."""
    if status is not None and status not in statuses:
        raise UsageError(f"{what} {status!r}: not a run status; one of {', '.join(statuses)}")


def delete_runs(store: RunStore, run_ids: Sequence[str]) -> list[str]:
    """Delete runs (their directories and rows); refuse, before deleting any, a run
    that is still going."""
    records = []
    for run_id in run_ids:
        record = store.get(run_id)
        if record is None:
            raise UsageError(f"no run {run_id!r}")
        if still_going(record):
            raise UsageError(f"run {run_id} has not ended; stop it first (`runs stop`)")
        _check_deletable(run_id, record.run_dir)
        records.append(record)
    deleted: list[str] = []
    for record in records:
        if record.run_dir and Path(record.run_dir).exists():
            try:
                shutil.rmtree(record.run_dir)
            except OSError as err:
                raise UsageError(
                    f"run {record.id}: cannot delete {record.run_dir} "
                    f"({err.strerror or err}); runs deleted before it: {len(deleted)}"
                ) from None
        store.delete(record.id)
        deleted.append(record.id)
    return deleted


def _check_deletable(run_id: str, run_dir: str | None) -> None:
    """Only a real directory is deleted: what a link points to is someone else's."""
    if not run_dir:
        return
    path = Path(run_dir)
    if path.is_symlink():
        raise UsageError(
            f"run {run_id}: its directory {path} is a symbolic link (to {os.readlink(path)}); "
            f"nothing was deleted. Remove the link (rm {path}), and the target if you mean "
            f"to, then `gpustation runs delete {run_id}` forgets the run"
        )
    if path.exists() and not path.is_dir():
        raise UsageError(f"run {run_id}: {path} is not a directory; nothing was deleted")


def prune_candidates(
    store: RunStore, older_than_s: float, status: str | None = None, now: float | None = None
) -> list[RunSummary]:
    """Ended runs that ended (or started) more than ``older_than_s`` ago.

    ``status`` is one of the statuses of an ended run (a run still going is
    never pruned), else a UsageError naming them.
    """
    check_status(status, "--status", rundir.FINAL_STATUSES)
    cutoff = (now or time.time()) - older_than_s
    out = []
    for r in store.list_runs():
        if still_going(r):
            continue
        when = r.ended_at or r.started_at
        if when is None or when >= cutoff:
            continue
        if status is not None and r.status != status:
            continue
        out.append(r)
    return out
