"""The queue's scheduler: ``python -m gpustation.runs.queue.scheduler``, one per user.

It holds ``<data dir>/queue/scheduler.lock`` (an flock: it dies with the process,
so a killed scheduler never blocks the next), reads the GPUs every
:data:`POLL_S`, and starts each queued run, in the queue's order, once the GPUs
it asks for are free (:mod:`gpustation.runs.queue.free`). A run waiting for a
count of GPUs holds back the runs behind it, so a big job is not starved by
small ones; a run waiting for given GPUs lets the runs behind it take others.
It leaves when the queue is empty. :func:`ensure_running` starts it, detached
from the terminal, from any gpustation command that finds the queue not empty
and no scheduler holding the lock: a reboot or a SIGKILL loses no queued run.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import IO, Any

import psutil

from gpustation import private, privs, timefmt
from gpustation.errors import GpustationError
from gpustation.pyargv import python_argv
from gpustation.runs import rundir
from gpustation.runs.launch.start import start_prepared
from gpustation.runs.queue import entries as queue
from gpustation.runs.queue.choose import choose
from gpustation.runs.queue.folder import (
    LOCK,
    LOG,
    REQUEST_JSON,
    claim,
    has_queued,
    put_back,
    queue_dir,
    starting_ids,
    take_for_start,
)
from gpustation.runs.queue.folder import started as started_run
from gpustation.runs.queue.free import GpuWatch, QueueSettings, load_settings
from gpustation.runs.rundir import RunState
from gpustation.runs.store.reconcile import ActiveRun, list_active_runs
from gpustation.telemetry.registry import open_backend

#: how often the GPUs are read: a freed GPU is taken within about this
POLL_S = 0.5


def _open_lock() -> IO[str]:
    private.make_dir(queue_dir())
    return open(queue_dir() / LOCK, "a+", opener=private.opener)


@contextmanager
def held_lock() -> Iterator[IO[str] | None]:
    """The scheduler's lock if no one holds it (else None)."""
    with _open_lock() as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield None
            return
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield handle


def running() -> bool:
    """Whether a scheduler holds the lock now."""
    try:
        with _open_lock() as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
            return False
    except OSError:
        return False


def ensure_running() -> bool:
    """Start a scheduler when runs wait and none holds the lock; True when one was started."""
    if not has_queued() or running():
        return False
    env = dict(os.environ)
    env.pop("GPUSTATION_SIMULATE", None)  # each queued run says which GPUs it is for
    env.pop("GPUSTATION_SIM_CARD", None)
    with open(queue_dir() / LOG, "ab", opener=private.opener) as log:
        proc = subprocess.Popen(
            python_argv("-m", "gpustation.runs.queue.scheduler"),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the terminal closing
            close_fds=True,
            env=env,
            cwd=str(queue_dir()),
            **privs.child_kwargs(),
        )

    threading.Thread(target=proc.wait, name="reap-scheduler", daemon=True).start()
    return True


def _backend_key(info: dict[str, Any]) -> tuple[Any, ...]:
    if info.get("simulated"):
        return ("sim", info.get("simulate", -1), info.get("sim_card"))
    return ("nvml",)


class Machine:
    """One kind of GPUs the queued runs ask for (the real ones, or a simulated machine)."""

    def __init__(self, key: tuple[Any, ...], settings: QueueSettings) -> None:
        self.key = key
        self.simulated = key[0] == "sim"
        if self.simulated:
            simulate = int(key[1]) if isinstance(key[1], int) else -1
            self.backend = open_backend(simulate=simulate, sim_card=key[2])
        else:  # the scheduler starts without GPUSTATION_SIMULATE: the real GPUs
            self.backend = open_backend()
        self.count = self.backend.device_count()
        self.watch = GpuWatch(settings)
        self.topology = None
        try:
            self.topology = self.backend.topology(list(range(self.count)))
        except GpustationError:
            pass

    def look(self, active: list[ActiveRun]) -> None:
        held: dict[int, str] = {}
        pids: set[int] = set()
        for run in active:
            if bool((run.run.get("backend") or {}).get("simulated")) != self.simulated:
                continue
            for gpu in run.run.get("gpus") or []:
                if isinstance(gpu, int):
                    held.setdefault(gpu, run.id)
            pids |= _run_pids(run.state)
        samples = self.backend.read_gpus(list(range(self.count)), slow=False)
        self.watch.add(samples, held, pids)

    def close(self) -> None:
        self.backend.close()


def _run_pids(state: RunState) -> set[int]:
    """The processes of a run: its child, the descendants it recorded, their children now."""

    pids = {int(p) for p, *_ in state.descendants if p}
    if state.child_pid:
        pids.add(state.child_pid)
        with suppress(psutil.Error):
            pids |= {c.pid for c in psutil.Process(state.child_pid).children(recursive=True)}
    return pids


def plan(
    entry: queue.Entry, machine: Machine, taken: dict[int, str]
) -> tuple[list[int] | None, str]:
    """The GPUs ``entry`` starts on now (None: it waits) and what it waits for, in words.

    ``taken``: the GPUs this pass gave to runs ahead in the queue, or that runs
    ahead wait for, each with the words saying so.
    """
    watch = machine.watch

    def busy(gpu: int) -> str | None:
        return f"GPU {gpu}: {taken[gpu]}" if gpu in taken else watch.busy(gpu)

    if entry.gpus is not None:
        missing = [g for g in entry.gpus if not 0 <= g < machine.count]
        if missing:
            return None, f"GPU {','.join(map(str, missing))} does not exist here"
        reasons = [r for r in map(busy, entry.gpus) if r]
        return (None, "; ".join(reasons)) if reasons else (list(entry.gpus), "")
    count = entry.gpus_count if entry.gpus_count is not None else 1
    if count == 0:
        return [], ""
    if count > machine.count:
        return None, f"needs {count} GPUs, this machine has {machine.count}"
    free = [g for g in range(machine.count) if busy(g) is None]
    chosen = choose(count, free, watch.used, machine.topology)
    if chosen is not None:
        return chosen, ""
    reasons = [r for r in map(busy, range(machine.count)) if r]
    return None, f"{len(free)} of {count} GPUs free; " + "; ".join(reasons)


def one_pass(machines: dict[tuple[Any, ...], Machine], settings: QueueSettings) -> int:
    """Look at the GPUs once and start what can start; returns how many runs started."""
    waiting = queue.entries()
    if not waiting or queue.paused():
        return 0
    active = list_active_runs()
    requests = {}
    for entry in waiting:
        request = queue.take_request(entry)
        if request is None:
            _fail(entry, "its queued request (queued-run.json) is missing or damaged")
            continue
        requests[entry.id] = request
        key = _backend_key(request.backend)
        if key not in machines:
            try:
                machines[key] = Machine(key, settings)
            except GpustationError as err:
                queue.set_waiting(entry, f"its GPUs cannot be read: {err}")
                continue
    for machine in machines.values():
        machine.look(active)
    started = 0
    taken: dict[tuple[Any, ...], dict[int, str]] = {key: {} for key in machines}
    blocked: set[tuple[Any, ...]] = set()
    for entry in waiting:
        request = requests.get(entry.id)
        if request is None:
            continue
        key = _backend_key(request.backend)
        found = machines.get(key)
        if found is None or key in blocked:
            continue
        chosen, why = plan(entry, found, taken[key])
        if chosen is None:
            queue.set_waiting(entry, why)
            if entry.gpus is None:
                blocked.add(key)  # a run waiting for any N holds back those behind it
            else:  # and one waiting for given GPUs is first in line for them
                for gpu in entry.gpus:
                    taken[key].setdefault(gpu, f"queued run {entry.id} is first in line")
            continue
        if not take_for_start(entry.id):
            continue  # cancelled meanwhile
        for gpu in chosen:
            taken[key][gpu] = f"queued run {entry.id} starts on it"
        now = time.time()
        queued = {
            "submitted_at": entry.submitted_at,
            "priority": entry.priority,
            "waited_s": round(now - entry.submitted_at, 3),
        }
        try:
            start_prepared(request, chosen, entry.id, entry.run_dir, now, 5.0, queued)
            started_run(entry.id)
            (entry.run_dir / REQUEST_JSON).unlink(missing_ok=True)
            started += 1
            print(f"started {entry.id} on GPU {','.join(map(str, chosen))}", flush=True)
        except GpustationError as err:
            _fail(entry, f"could not start: {err}")
    return started


def recover() -> list[str]:
    """Put back the runs a killed scheduler took to start and did not start: a run whose
    supervisor never came is queued again, in its place; one that started has left."""
    back: list[str] = []
    taken = starting_ids()
    if not taken:
        return back
    supervising = _supervised_dirs()
    for run_id in taken:
        directory = rundir.run_dir(run_id)
        state = rundir.read_state(directory)
        never_started = state is not None and (
            state.status == rundir.QUEUED
            or (state.status == "starting" and str(directory) not in supervising)
        )
        if never_started and (directory / REQUEST_JSON).exists():
            rundir.write_state(directory, RunState(id=run_id, status=rundir.QUEUED))
            put_back(run_id)
            back.append(run_id)
        else:
            started_run(run_id)
    return back


def _supervised_dirs() -> set[str]:
    """The run directories a supervisor process runs for now (its last argument)."""

    found = set()
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if "gpustation.runs.launch.supervisor" in cmdline:
            found.add(cmdline[-1])
    return found


def _fail(entry: queue.Entry, reason: str) -> None:
    claim(entry.id)
    started_run(entry.id)
    state = RunState(id=entry.id, status="failed", ended_at=time.time(), reason=reason)
    rundir.write_state(entry.run_dir, state)
    print(f"{entry.id}: {reason}", flush=True)


def serve(poll_s: float = POLL_S) -> int:
    """Hold the lock and run the queue until it is empty."""
    settings = load_settings()
    machines: dict[tuple[Any, ...], Machine] = {}
    try:
        while True:
            with held_lock() as lock:
                if lock is None:
                    return 0  # another scheduler has it
                for run_id in recover():
                    print(f"{run_id}: taken to start by a scheduler that died; queued again")
                while has_queued():
                    one_pass(machines, settings)
                    time.sleep(poll_s)
            # Let go, then look once more: a run queued as the lock was let go
            # started no scheduler (this one held it), so this one goes on.
            if not has_queued():
                return 0
    finally:
        for machine in machines.values():
            machine.close()


def main(argv: list[str] | None = None) -> int:
    del argv
    print(f"scheduler {os.getpid()} started {timefmt.full()}", flush=True)
    return serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
