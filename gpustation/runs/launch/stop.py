"""Stopping runs: graceful, then firm, until no process of the run is left.

:func:`stop_run` asks the supervisor (a ``stop_requested`` marker), then sends
SIGINT to the child's process group, waits, SIGTERM, waits, SIGKILL, and
checks that no process of the group (or a descendant that left it) is left;
then it waits for the supervisor to record the end. A run whose supervisor is
gone gets its end recorded here (``runs stop`` is a writer).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpustation.errors import UsageError
from gpustation.runs import rundir
from gpustation.runs.queue.folder import cancelled
from gpustation.runs.rundir import RunState
from gpustation.runs.store.reconcile import check_run, mark_ended, record_end

DEFAULT_GRACE_S = 10.0


def signal_name(sig: int) -> str:
    """``SIGTERM`` for 15; the number itself for one Python has no name for."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def terminate_group(
    pgid: int | None,
    leader_pid: int | None,
    leader_create_time: float | None,
    grace_s: float = DEFAULT_GRACE_S,
    log: Callable[[str], None] | None = None,
    force_now: Callable[[], bool] | None = None,
    on_signal: Callable[[str], None] | None = None,
    known: Sequence[Sequence[Any]] = (),
    leader_start: str | None = None,
) -> str | None:
    """SIGINT, wait, SIGTERM, wait, SIGKILL to a process group until none is left.

    Returns the name of the last signal sent (None when nothing was running).
    Processes that left the group (``setsid``; torchrun's workers do) are
    signalled too: the leader's descendants now, and ``known``, the
    ``[pid, create_time, start]`` entries of descendants seen earlier (the
    supervisor records them, so they are found even once their parent has died).
    The leader is told from a process reusing its pid by ``leader_start`` (its
    start token), else by ``leader_create_time``.
    ``force_now`` cuts the waits short (a second Ctrl-C).
    """
    # start-up time: psutil, only when processes are inspected
    import psutil

    group_ok = bool(pgid)
    leader = None
    if pgid and leader_pid:
        try:
            leader = psutil.Process(leader_pid)
            if (leader_start is not None or leader_create_time is not None) and not (
                rundir.process_matches(leader_pid, leader_create_time, leader_start)
            ):
                # The PID was reused: the group we started no longer exists.
                leader, group_ok = None, False
        except psutil.NoSuchProcess:
            leader = None
    strays: dict[int, psutil.Process] = {}
    if leader is not None:
        try:
            for proc in leader.children(recursive=True):
                strays[proc.pid] = proc
        except (psutil.Error, ProcessLookupError):
            pass
    for entry in known:
        pid = int(entry[0])
        if pid not in strays and rundir.descendant_matches(entry):
            try:
                strays[pid] = psutil.Process(pid)
            except psutil.Error:
                continue
    for pid in list(strays):
        try:
            if group_ok and os.getpgid(pid) == pgid:
                del strays[pid]  # reached through the group
        except ProcessLookupError:
            del strays[pid]
    if not group_ok and not strays:
        return None

    def alive() -> list[int]:
        pids = rundir.group_members(pgid) if group_ok else []
        for proc in strays.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    pids.append(proc.pid)
            except psutil.Error:
                continue
        return pids

    last: str | None = None
    for sig, wait_s in (
        (signal.SIGINT, grace_s),
        (signal.SIGTERM, grace_s),
        (signal.SIGKILL, max(grace_s, 5.0)),
    ):
        if not alive():
            return last
        if force_now is not None and force_now() and sig != signal.SIGKILL:
            continue
        last = signal_name(sig)
        if log:
            log(f"sending {last} to process group {pgid}")
        if on_signal:
            on_signal(last)
        try:
            if group_ok and pgid:
                os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for proc in strays.values():
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and alive():
            if force_now is not None and force_now() and sig != signal.SIGKILL:
                break
            time.sleep(0.05)
    left = alive()
    if left and log:
        log(f"processes {left} survived SIGKILL (uninterruptible sleep?)")
    return last


def wait_for_end(
    directory: Path, timeout: float | None = None, poll_s: float = 0.1
) -> RunState | None:
    """Wait until the run's state is final (or ``timeout`` passes); return it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        state = check_run(directory)
        if state is not None and not state.active:
            return state
        if deadline is not None and time.monotonic() >= deadline:
            return state
        time.sleep(poll_s)


def run_directory(run: str | Path) -> Path:
    """A run's directory from its id (or the directory itself)."""
    path = Path(run)
    if path.is_absolute() or (path.parent != Path(".") and path.exists()):
        return path
    return rundir.run_dir(str(run))


def stop_run(
    run: str | Path,
    grace_s: float | None = None,
    wait_s: float = 15.0,
    by: str = "user",
    force_now: Callable[[], bool] | None = None,
) -> RunState | None:
    """Stop a run: graceful then firm, and wait until its end is recorded.

    The run's status becomes ``stopped`` (not ``failed``), whatever the
    child's exit code. Returns the final state (None when unknown).
    """
    directory = run_directory(run)
    state = rundir.read_state(directory)
    if state is None:
        raise UsageError(f"no run directory {directory}")
    if state.status == rundir.QUEUED:
        return cancelled(directory) or rundir.read_state(directory)
    if not state.active:
        return state
    checked = check_run(directory)
    if checked is not None and not checked.active:  # lost (or stopped) unrecorded
        record_end(directory, checked)
        return checked
    if grace_s is None:
        grace_s = float((rundir.read_run(directory) or {}).get("stop_grace_s", DEFAULT_GRACE_S))
    rundir.request_stop(directory, by)
    # A supervisor that has not started the child yet sees the marker and
    # does not start it; one that has will have written the child's PID.
    deadline = time.monotonic() + 5.0
    while state is not None and state.active and not state.child_pid:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
        state = rundir.read_state(directory)
    if state is not None and state.active and state.pgid:
        terminate_group(
            state.pgid,
            state.child_pid,
            state.child_create_time,
            grace_s,
            force_now=force_now,
            on_signal=lambda name: rundir.note_stop_signal(directory, name),
            known=state.descendants,
            leader_start=state.child_start,
        )
    final = wait_for_end(directory, timeout=wait_s)
    on_disk = rundir.read_state(directory)
    if final is not None and on_disk is not None and on_disk.active:
        # No supervisor recorded the end (gone or hung): this command does.
        if final.active:
            final = mark_ended(
                directory, final, "stopped", "stopped; its supervisor did not respond"
            )
        else:  # found lost while we waited
            record_end(directory, final)
    return final


def stop_runs(
    runs: Sequence[str | Path], grace_s: float | None = None, by: str = "user"
) -> dict[str, RunState | None]:
    """Stop several runs at once (quitting the dashboard, say); each as :func:`stop_run`.

    They are stopped in parallel, so the wait is one run's grace, not the sum.
    """

    if not runs:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(runs))) as pool:
        futures = {
            run_directory(run).name: pool.submit(stop_run, run, grace_s, by=by) for run in runs
        }
        return {name: future.result() for name, future in futures.items()}
