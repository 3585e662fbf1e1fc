"""Finding runs again from their directories, and recording how they ended.

:func:`check_run` reads a run's state and corrects it when the processes it
names are gone; :func:`list_active_runs` finds the runs still going (to
re-attach after a restart), checking that each recorded PID is still the
process it was. :func:`record_end` saves a run's end: the history row first,
then ``state.json``.

Readers never write. A run whose supervisor died without recording its end
is *found* lost by whoever reads it (:func:`check_run` returns a ``lost``
state in memory, and the runs screen, ``runs list`` and ``runs follow`` show
it so) but the files and ``runs.db`` still say it is running. The end is
persisted by the writers only: :func:`record_lost_runs`, which the launcher
calls before it starts the next run, and ``runs stop`` on that run
(:func:`gpustation.runs.launch.stop.stop_run`). Until one of them runs, every reader
comes to the same answer from the same files, so nothing is lost by waiting;
and a dashboard or a ``runs list`` can be pointed at another user's run
directory, or a read-only copy, without changing it.

No function here keeps anything in memory between calls: a run is its
directory, so a UI may drop every handle and find its runs again.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpustation import paths
from gpustation.runs import rundir
from gpustation.runs.rundir import RunState


@dataclass
class ActiveRun:
    """A run still going, found from its directory."""

    id: str
    run_dir: Path
    state: RunState
    run: dict[str, Any]
    #: False when the supervisor is gone but the child still runs
    supervised: bool = True


LOST_REASON = (
    "the run's supervisor ended without recording how the run ended "
    "(killed, or the machine restarted)"
)


STOPPED_UNRECORDED = "; its supervisor ended before recording it"


def stopped_reason(stop: dict[str, Any]) -> str:
    """``stopped by user (SIGTERM)``: who asked for a stop, and the last signal it sent."""
    signals = stop.get("signals") or []
    last = f" ({signals[-1]})" if signals and isinstance(signals, list) else ""
    return f"stopped by {stop.get('by', 'request')}{last}"


def ended(directory: Path, state: RunState, status: str, reason: str) -> RunState:
    """``state`` as ended with ``status`` (in memory: nothing is written)."""
    state.status = status
    state.reason = reason
    if state.ended_at is None:
        try:
            state.ended_at = (directory / rundir.OUTPUT_LOG).stat().st_mtime
        except OSError:
            state.ended_at = time.time()
    state.error_tail = rundir.tail_lines(directory / rundir.OUTPUT_LOG, 20)
    return state


def mark_ended(directory: Path, state: RunState, status: str, reason: str) -> RunState:
    """Record that a run ended with ``status`` (for writers: supervisor, launcher, stop)."""
    record_end(directory, ended(directory, state, status, reason))
    return state


def record_end(directory: Path, state: RunState, store: Any = None) -> tuple[bool, bool]:
    """Save a run's state: the history row first, then ``state.json``.

    In that order, whoever sees the state file change (a waiting command, a
    UI) finds the history already up to date. Neither failure raises (a full
    disk, a locked index): returns whether the row and the state were written,
    so a writer that must not lose them (the supervisor) can try again.
    """
    row_ok = state_ok = True
    try:
        # start-up time: the run store (sqlite3)
        from gpustation.runs.store.index import sync_run

        sync_run(directory, store, state=state)
    except Exception as err:  # the history is secondary to the state file
        row_ok = False
        _say(f"could not record run {state.id} in the history: {err}")
    try:
        rundir.write_state(directory, state)
    except OSError as err:
        state_ok = False
        _say(f"could not write the state of run {state.id}: {err}")
    return row_ok, state_ok


def _say(message: str) -> None:
    try:
        print(f"gpustation: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # stderr may be a file on the same full disk


def check_run(directory: Path, starting_grace_s: float = 30.0) -> RunState | None:
    """A run's state, corrected when the processes it names are gone (reads only).

    A run whose supervisor and child both vanished without recording an end
    (a reboot, ``kill -9``) comes back ``lost`` with what is known; the
    files still say it is active until :func:`record_lost_runs` (or a stop)
    records it.
    """
    state = rundir.read_state(directory)
    if state is None or not state.active:
        return state
    if rundir.process_matches(
        state.supervisor_pid, state.supervisor_create_time, state.supervisor_start
    ):
        return state
    if state.supervisor_pid is None:
        # Launched a moment ago; the supervisor has not written its PID yet.
        try:
            age = time.time() - (directory / rundir.STATE_JSON).stat().st_mtime
        except OSError:
            age = 0.0
        if age < starting_grace_s:
            return state
    # The supervisor may have finished between our two reads.
    again = rundir.read_state(directory)
    if again is not None and not again.active:
        return again
    if rundir.process_matches(state.child_pid, state.child_create_time, state.child_start):
        return state  # unsupervised but alive
    stop = rundir.read_stop(directory)
    if stop is not None:
        # Someone asked for the stop (it is in the run directory): the run was
        # stopped, even though its supervisor did not live to record it.
        return ended(directory, state, "stopped", stopped_reason(stop) + STOPPED_UNRECORDED)
    return ended(directory, state, "lost", LOST_REASON)


def record_lost_runs() -> list[RunState]:
    """Record the end of every run found ended unrecorded (a writer's job: the launcher calls it).

    Such a run is ``lost``, or ``stopped`` when its directory holds a stop request.
    """
    root = paths.runs_dir()
    if not root.is_dir():
        return []
    recorded: list[RunState] = []
    for state_file in sorted(root.glob(f"*/{rundir.STATE_JSON}")):
        directory = state_file.parent
        first = rundir.read_state(directory)
        if first is None:
            continue
        if not first.active:
            on_disk = rundir.read_json(state_file) or {}
            if on_disk.get("status") in rundir.ACTIVE_STATUSES and not rundir.process_matches(
                first.supervisor_pid, first.supervisor_create_time, first.supervisor_start
            ):
                # Its end is only in exit-status (the disk was full until its
                # supervisor gave up): state.json and the row get it now.
                record_end(directory, first)
                recorded.append(first)
            continue
        state = check_run(directory)
        if state is not None and not state.active:
            # Found lost (or stopped, when a stop had been asked for).
            record_end(directory, state)
            recorded.append(state)
    return recorded


def list_active_runs() -> list[ActiveRun]:
    """Runs still going, oldest first, from the run directories on disk."""
    root = paths.runs_dir()
    if not root.is_dir():
        return []
    found: list[ActiveRun] = []
    for state_file in sorted(root.glob(f"*/{rundir.STATE_JSON}")):
        directory = state_file.parent
        first = rundir.read_state(directory)
        if first is None or not first.active:
            continue
        state = check_run(directory)
        if state is None or not state.active:
            continue
        supervised = rundir.process_matches(
            state.supervisor_pid, state.supervisor_create_time, state.supervisor_start
        )
        found.append(
            ActiveRun(
                id=state.id,
                run_dir=directory,
                state=state,
                run=rundir.read_run(directory) or {},
                supervised=supervised or state.supervisor_pid is None,
            )
        )
    return found
