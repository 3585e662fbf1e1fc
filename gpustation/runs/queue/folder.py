"""Where the queue lives, whether anything waits in it (one directory read, cheap enough
for every gpustation command to ask: see ``cli.main``), and taking a run out of it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpustation import paths
from gpustation.runs import rundir
from gpustation.runs.rundir import RunState

#: a queued run's checked preset and environment, private, until it starts
REQUEST_JSON = "queued-run.json"
CANCELLED = "cancelled in the queue"
PAUSED = "paused"
LOCK = "scheduler.lock"
LOG = "scheduler.log"
#: files of the queue folder that are not queued runs
NOT_RUNS = frozenset({PAUSED, LOCK, LOG})


def queue_dir() -> Path:
    """``<data dir>/queue``: beside the run directories, kept as long as they are."""
    return paths.data_dir() / "queue"


def queued_ids() -> list[str]:
    """The ids of the runs waiting in the queue, in no order."""
    try:
        with os.scandir(queue_dir()) as found:
            return [e.name for e in found if e.name not in NOT_RUNS and not e.name.startswith(".")]
    except OSError:
        return []


def has_queued() -> bool:
    """Runs wait in the queue, or were taken to start by a scheduler that may have died."""
    try:
        with os.scandir(queue_dir()) as found:
            return any(e.name not in NOT_RUNS for e in found)
    except OSError:
        return False


def claim(run_id: str) -> bool:
    """Take ``run_id`` out of the queue: True for the one caller that did (the scheduler
    starting it, or a cancel), so a run is never both started and cancelled."""
    try:
        os.unlink(queue_dir() / run_id)
        return True
    except FileNotFoundError:
        return False


STARTING = ".starting-"


def take_for_start(run_id: str) -> bool:
    """The scheduler takes ``run_id`` to start it: its marker becomes ``.starting-ID``
    until the run's supervisor has it, so a scheduler killed in between leaves the run
    to be put back (:func:`starting_ids`) rather than lost. True for the one who took it."""
    try:
        os.rename(queue_dir() / run_id, queue_dir() / f"{STARTING}{run_id}")
        return True
    except FileNotFoundError:
        return False


def started(run_id: str) -> None:
    """The run's supervisor has it: it has left the queue for good."""
    (queue_dir() / f"{STARTING}{run_id}").unlink(missing_ok=True)


def starting_ids() -> list[str]:
    """Runs a scheduler took to start and did not see started (it was killed)."""
    try:
        names = os.listdir(queue_dir())
    except OSError:
        return []
    return [n.removeprefix(STARTING) for n in names if n.startswith(STARTING)]


def put_back(run_id: str) -> None:
    """A run taken to start that never started goes back to its place in the queue."""
    os.replace(queue_dir() / f"{STARTING}{run_id}", queue_dir() / run_id)


def cancelled(directory: Path) -> RunState | None:
    """End a queued run ``stopped`` before it started (None: it had left the queue)."""
    if not claim(directory.name):
        return None
    state = RunState(id=directory.name, status="stopped", ended_at=time.time(), reason=CANCELLED)
    rundir.write_state(directory, state)
    (directory / REQUEST_JSON).unlink(missing_ok=True)
    return state
