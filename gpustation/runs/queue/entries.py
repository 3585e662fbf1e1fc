"""The GPU queue's runs: submitted, listed, moved, cancelled, paused; kept in the run store.

A queued run is a run directory like any other, with the status ``queued``, its
id given at submission. Beside ``run.json`` (what any reader shows) it holds
``queue.json`` (what it waits for: ``gpus`` or ``gpus_count``, its ``priority``
and ``order``, and the scheduler's words for what it waits on) and
``queued-run.json`` (the checked preset with its environment, private to the
user: the run's secrets never reach ``run.json``; deleted when it starts).

``<data dir>/queue/`` holds an empty file named by each queued run's id, so
that any command can tell with one directory read whether the queue is
empty, and the scheduler and ``queue cancel`` claim a run by removing it
(whoever removes it has it: a run is never both started and cancelled).
``paused`` there pauses the queue.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpustation import private, privs
from gpustation.errors import UsageError
from gpustation.redact import redact_env
from gpustation.runs import rundir
from gpustation.runs.launch.start import RunRequest, new_run_directory
from gpustation.runs.presets import RunPreset
from gpustation.runs.queue.folder import (
    PAUSED,
    REQUEST_JSON,
    cancelled,
    has_queued,
    queue_dir,
    queued_ids,
)
from gpustation.runs.rundir import QUEUED, RunState
from gpustation.runs.store.index import RunStore, sync_run

QUEUE_JSON = "queue.json"
#: the range of --priority: higher starts first
PRIORITY_RANGE = (-100, 100)


@dataclass
class Entry:
    """One queued run, as ``queue`` lists it."""

    id: str
    run_dir: Path
    preset: str
    title: str
    priority: int
    order: float
    submitted_at: float
    gpus: list[int] | None
    gpus_count: int | None
    #: what it waits for, in words (written by the scheduler; None before its first look)
    waiting: str | None = None

    def wants(self) -> str:
        if self.gpus is not None:
            return "GPU " + ",".join(map(str, self.gpus))
        return f"any {self.gpus_count} GPU" + ("s" if (self.gpus_count or 1) > 1 else "")

    def to_json(self, position: int) -> dict[str, Any]:
        return {
            "position": position,
            "id": self.id,
            "preset": self.preset,
            "priority": self.priority,
            "submitted_at": self.submitted_at,
            "gpus": self.gpus,
            "gpus_count": self.gpus_count,
            "waiting": self.waiting,
            "run_dir": str(self.run_dir),
        }


def check_priority(priority: int) -> int:
    lo, hi = PRIORITY_RANGE
    if not lo <= priority <= hi:
        raise UsageError(f"--priority: from {lo} to {hi} (higher starts first), got {priority}")
    return priority


def submit(
    request: RunRequest,
    *,
    gpus: Sequence[int] | None,
    gpus_count: int | None,
    priority: int = 0,
) -> Entry:
    """Queue a checked run; returns at once with its id."""
    if (gpus is None) == (gpus_count is None):
        raise ValueError("a queued run waits for given GPUs or for a count of GPUs")
    check_priority(priority)
    created = time.time()
    run_id, directory = new_run_directory(request.preset.name, created)
    queue = {
        "priority": priority,
        "order": created,
        "submitted_at": created,
        "gpus": list(gpus) if gpus is not None else None,
        "gpus_count": gpus_count,
        "waiting": None,
    }
    preset = request.preset
    rundir.write_json(
        directory / REQUEST_JSON,
        {
            "preset": preset.to_dict(),
            "overrides": request.overrides,
            "warnings": request.warnings,
            "cwd": request.cwd,
            "backend": request.backend,
            "stop_grace_s": request.stop_grace_s,
            "wrap": list(request.wrap),
        },
    )
    # What every reader shows of it (the environment by name only, as for any run).

    rundir.write_json(
        directory / rundir.RUN_JSON,
        {
            "id": run_id,
            "created_at": created,
            "preset": {**preset.to_dict(), "env": redact_env(preset.env)},
            "overrides": request.overrides,
            "argv": [],
            "gpus": list(gpus or []),
            "cwd": request.cwd,
            "backend": request.backend,
            "user": privs.run_user(),
            "warnings": request.warnings,
            "queue": queue,
        },
    )
    rundir.write_json(directory / QUEUE_JSON, queue)
    rundir.write_state(directory, RunState(id=run_id, status=QUEUED))
    _index(directory)
    # The marker last: the scheduler never sees a run whose files are not all written.
    private.make_dir(queue_dir())
    private.write_text(queue_dir() / run_id, "")
    return _entry(directory, queue, preset.name, preset.display_title)


def _index(directory: Path) -> None:
    try:
        sync_run(directory, RunStore(write_wait_s=2.0))
    except Exception:
        pass  # the index is rebuilt from the directory by the next writer


def _entry(directory: Path, queue: dict[str, Any], preset: str, title: str) -> Entry:
    gpus = queue.get("gpus")
    count = queue.get("gpus_count")
    waiting = queue.get("waiting")
    return Entry(
        id=directory.name,
        run_dir=directory,
        preset=preset,
        title=title,
        priority=int(queue.get("priority") or 0),
        order=float(queue.get("order") or 0.0),
        submitted_at=float(queue.get("submitted_at") or 0.0),
        gpus=[int(g) for g in gpus] if isinstance(gpus, list) else None,
        gpus_count=int(count) if isinstance(count, int) and not isinstance(count, bool) else None,
        waiting=waiting if isinstance(waiting, str) else None,
    )


def read_entry(run_id: str) -> Entry | None:
    """A queued run's entry (None: not in the queue, or its files are damaged)."""
    directory = rundir.run_dir(run_id)
    queue = rundir.read_json(directory / QUEUE_JSON)
    run = rundir.read_run(directory) or {}
    if queue is None or not (queue_dir() / run_id).exists():
        return None
    preset = run.get("preset") or {}
    name = str(preset.get("name") or run_id)
    title = str(preset.get("title") or name)
    try:
        return _entry(directory, queue, name, title)
    except (TypeError, ValueError):
        return None


def entries() -> list[Entry]:
    """The queue in the order it starts: higher priority first, then by place."""
    found: list[Entry] = []
    for name in sorted(queued_ids()):
        entry = read_entry(name)
        if entry is not None:
            found.append(entry)
    return sorted(found, key=lambda e: (-e.priority, e.order, e.id))


def find(run_id: str) -> Entry:
    """The queued run ``run_id`` names (a unique prefix will do), or a UsageError."""
    queued = entries()
    matches = [e for e in queued if e.id == run_id] or [
        e for e in queued if e.id.startswith(run_id)
    ]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(f"no queued run {run_id!r}; `gpustation queue` lists the queue")
    raise UsageError(f"{run_id!r} names {len(matches)} queued runs; give more of the id")


def cancel(run_id: str) -> Entry:
    """Cancel a queued run: it ends ``stopped`` without having started."""
    entry = find(run_id)
    if cancelled(entry.run_dir) is None:
        raise UsageError(f"run {entry.id} has just left the queue (started or cancelled)")
    _index(entry.run_dir)
    return entry


def set_waiting(entry: Entry, waiting: str | None) -> None:
    """Record what a queued run waits for (only when it changed)."""
    if waiting == entry.waiting:
        return
    queue = rundir.read_json(entry.run_dir / QUEUE_JSON)
    if queue is None:
        return
    queue["waiting"] = waiting
    rundir.write_json(entry.run_dir / QUEUE_JSON, queue)
    entry.waiting = waiting


def _place(entry: Entry, priority: int, order: float) -> None:
    queue = rundir.read_json(entry.run_dir / QUEUE_JSON)
    if queue is None:
        raise UsageError(f"run {entry.id}: its queue.json cannot be read")
    queue["priority"], queue["order"] = priority, order
    rundir.write_json(entry.run_dir / QUEUE_JSON, queue)


def move(run_id: str, *, first: bool = False, after: str | None = None) -> list[Entry]:
    """Move a queued run to the front, or just behind another; returns the new order.

    At the front it takes the highest priority in the queue; behind another,
    that run's priority, so the order shown is the order runs start in.
    """
    if first == (after is not None):
        raise UsageError("queue move: give --first or --after ID")
    entry = find(run_id)
    queued = entries()
    if first:
        top = max(e.priority for e in queued)
        orders = [e.order for e in queued if e.priority == top and e.id != entry.id]
        _place(entry, top, min(orders, default=entry.order) - 1.0)
    else:
        assert after is not None
        anchor = find(after)
        if anchor.id == entry.id:
            raise UsageError("queue move: a run cannot go behind itself")
        same = [e for e in queued if e.priority == anchor.priority and e.id != entry.id]
        later = [e.order for e in same if e.order > anchor.order]
        order = (anchor.order + min(later)) / 2 if later else anchor.order + 1.0
        _place(entry, anchor.priority, order)
    return entries()


def paused() -> bool:
    return (queue_dir() / PAUSED).exists()


def pause() -> None:
    private.make_dir(queue_dir())
    private.write_text(queue_dir() / PAUSED, f"{time.time()}\n")


def resume() -> None:
    (queue_dir() / PAUSED).unlink(missing_ok=True)


def take_request(entry: Entry) -> RunRequest | None:
    """The run a queued entry asked for (None: its request is gone or damaged)."""
    data = rundir.read_json(entry.run_dir / REQUEST_JSON)
    if data is None:
        return None
    try:
        return RunRequest(
            preset=RunPreset.from_dict(data["preset"]),
            overrides=dict(data.get("overrides") or {}),
            warnings=[str(w) for w in data.get("warnings") or []],
            cwd=str(data["cwd"]),
            backend=dict(data.get("backend") or {}),
            stop_grace_s=float(data.get("stop_grace_s") or 10.0),
            wrap=[str(w) for w in data.get("wrap") or []],
        )
    except (KeyError, TypeError, ValueError):
        return None


__all__ = ["Entry", "has_queued", "queue_dir"]
