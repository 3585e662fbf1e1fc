"""The process that watches over one run: ``python -m gpustation.runs.launch.supervisor DIR``.

Started detached by :func:`gpustation.runs.launch.start.launch`. It starts the
child in its own process group with stdout and stderr going to
``output.log``, samples the run's GPUs once a second into
``telemetry.jsonl``, waits for the child and records how it ended in
``state.json`` and the run store. Being the child's parent, it always learns
the exit status, whoever else has gone away. SIGTERM, SIGINT or SIGHUP to the
supervisor stop the child (graceful, then firm) before it exits, so killing
the supervisor never orphans a run.

Containment: on Linux the supervisor is a child subreaper
(``prctl(PR_SET_CHILD_SUBREAPER)``), so a process of the run whose parent
dies (a worker that double-forks into a session of its own) is re-parented
to it rather than to init. Every descendant it sees (its children,
recursively, polled while the run goes) is listed in ``state.json``, and when
the run ends the supervisor signals the child's group and every descendant
still there (SIGINT, SIGTERM, then SIGKILL) and reaps them: no process of a
run outlives it. ``runs stop`` signals the same list.

A full disk: the child's exit status is never lost to a failed write. At
start the supervisor writes ``exit-status``, a file of a fixed size
(:data:`~gpustation.runs.rundir.EXIT_STATUS_BYTES` of blanks, synced); at the
end it overwrites it in place with the run's end, which needs no new blocks,
before anything else. Every write after that (``state.json``, the history row,
telemetry, its own log) may fail with ENOSPC without killing it: it keeps the
end in memory and tries ``state.json`` and the row again every second for
:data:`END_RETRY_S`, or until SIGTERM, SIGINT or SIGHUP tell it to go (the
next writer then records the end from ``exit-status``). Meanwhile
:func:`~gpustation.runs.rundir.read_state` reads the end from
``exit-status``, so readers see the run ended.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpustation import private, timefmt
from gpustation.files import NotRegularFile, read_bytes, say_skipped
from gpustation.runs import rundir
from gpustation.runs.gputrace import SAMPLE_INTERVAL_S, TraceSampler, write_sample
from gpustation.runs.launch.argv import child_env
from gpustation.runs.launch.stop import DEFAULT_GRACE_S, signal_name, terminate_group
from gpustation.runs.multinode.nodes import failure_reason
from gpustation.runs.rundir import RunState
from gpustation.runs.slowdown.watch import SlowdownWatch
from gpustation.runs.store.reconcile import mark_ended, record_end, stopped_reason
from gpustation.runs.tail import parse_metric_line
from gpustation.telemetry.model import Snapshot
from gpustation.textsafe import NEWLINE

#: how long the end of a run is retried when it cannot be written (a full disk)
END_RETRY_S = 600.0
#: between two tries
END_RETRY_EVERY_S = 1.0
#: prctl(2) option: orphaned descendants are re-parented to this process
PR_SET_CHILD_SUBREAPER = 36
_CUDA_OOM = re.compile(
    rb"CUDA out of memory|OutOfMemoryError|"
    rb"CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation|RESOURCE_EXHAUSTED: Out of memory"
)


def _log(message: str) -> None:
    stamp = timefmt.full()
    try:
        print(f"{stamp} supervisor[{os.getpid()}]: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # supervisor.log is on the data disk, which may be full


def become_subreaper() -> bool:
    """Make orphaned descendants children of this process (Linux); True when it did."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        # platform: Linux only (prctl)
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _own_descendants(child_pid: int) -> list[Any]:
    """This process's live descendants but the child (re-parented orphans included).

    Zombies among its children are reaped here, all but the child's: its
    exit status is for ``Popen.wait``.
    """
    # start-up time: psutil, only when processes are inspected
    import psutil

    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    alive = []
    for proc in procs:
        if proc.pid == child_pid:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                _reap(proc.pid)
                continue
        except psutil.Error:
            continue
        alive.append(proc)
    return alive


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not ours (a grandchild): its own parent reaps it


def _sweep_descendants(child_pid: int, grace_s: float = 1.0) -> None:
    """SIGTERM, grace, SIGKILL to every descendant still there (re-parented ones too)."""
    # start-up time: psutil, only when processes are inspected
    import psutil

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        left = _own_descendants(child_pid)
        if not left:
            return
        _log(f"sending {sig.name} to {len(left)} process(es) left by the run")
        for proc in left:
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _own_descendants(child_pid):
            time.sleep(0.05)


def cgroup_oom_kills() -> int | None:
    """The ``oom_kill`` count of this process's cgroup (v2), when readable."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("0::"):
                    rel = line.strip()[3:].lstrip("/")
                    events = Path("/sys/fs/cgroup") / rel / "memory.events"
                    for item in events.read_text().splitlines():
                        key, _, value = item.partition(" ")
                        if key == "oom_kill":
                            return int(value)
    except (OSError, ValueError):
        return None
    return None


def _metrics_report_oom(path: Path, max_bytes: int = 64 * 1024) -> str | None:
    """The message of an ``{"error": "out_of_memory"}`` event, as gpustation's runners write."""

    try:
        lines = read_bytes(path, "metrics file", max_bytes, tail=True, follow=False).splitlines()
    except NotRegularFile as err:
        say_skipped(err)
        return None
    except OSError:
        return None
    for line in reversed(lines):
        event = parse_metric_line(line)
        if event is not None and event.get("error") == "out_of_memory":
            # the reader shows a newline in the message as NEWLINE: its first line
            parts = [p.strip() for p in str(event.get("message") or "").split(NEWLINE)]
            return next((p for p in parts if p), "out of memory")
    return None


def _log_mentions_cuda_oom(path: Path, max_bytes: int = 256 * 1024) -> bool:
    try:
        data = read_bytes(path, "run file", max_bytes, tail=True, follow=False)
    except NotRegularFile as err:
        say_skipped(err)
        return False
    except OSError:
        return False
    return _CUDA_OOM.search(data) is not None


class _Telemetry:
    """Samples the run's GPUs; any failure turns it off rather than the run."""

    def __init__(self, directory: Path, gpus: list[int], backend_info: dict[str, Any]) -> None:
        self.path = directory / rundir.TELEMETRY_FILE
        self.trace: TraceSampler | None = None
        t0 = time.monotonic()
        if not gpus or backend_info.get("kind") == "none":
            return
        try:
            simulate = backend_info.get("simulate") if backend_info.get("simulated") else None
            self.trace = TraceSampler(
                gpus, t0, simulate, backend_info.get("sim_card"), run_id=directory.name
            )
            # SM and tensor activity while the run is live (cards with GPM)
            self.trace.backend.read_gpm = True
        except Exception as err:
            _log(f"GPU telemetry is off: {err}")
            self.trace = None

    def sample(self, final: bool = False, pids: set[int] | None = None) -> None:
        if self.trace is None:
            return
        try:
            write_sample(self.path, self.trace.line(pids, final))
            if self.trace.account_error is not None:
                _log(self.trace.account_error)
                self.trace.account_error = None
        except Exception as err:
            _log(f"GPU telemetry stopped: {err}")
            self.close()

    @property
    def snapshot(self) -> Snapshot | None:
        """The run's GPUs as last sampled (None: telemetry is off)."""
        return self.trace.last if self.trace is not None else None

    def close(self) -> None:
        if self.trace is not None:
            self.trace.close()
            self.trace = None


def live_descendants(pid: int, known: list[list[Any]]) -> list[list[Any]]:
    """``known`` brought up to date: the descendants of ``pid`` alive now,
    ``[pid, create_time, start]``.

    Only the living are kept (DataLoader workers come and go every epoch), but
    a descendant whose parent died stays listed while it lives: it is exactly
    the process a stop could not find any other way.
    """
    # start-up time: psutil, only when processes are inspected
    import psutil

    try:
        found = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        found = []
    # Re-parented to this process (a subreaper) when their parent died.
    found += _own_descendants(pid)
    kept = [entry for entry in known if rundir.descendant_matches(entry)]
    seen = {int(entry[0]) for entry in kept}
    for proc in found:
        if proc.pid in seen:
            continue
        try:
            start = rundir.start_of(proc.pid)
            if start is None:
                continue  # gone since it was listed
            kept.append([proc.pid, proc.create_time(), start])
            seen.add(proc.pid)
        except psutil.Error:
            continue
    return kept


def _note_descendants(pid: int, state: RunState) -> bool:
    """Keep the state's list of the child's live descendants; True when it changed."""
    kept = live_descendants(pid, state.descendants)
    changed = kept != state.descendants
    state.descendants = kept
    return changed


def _run_pids(child_pid: int, state: RunState) -> set[int]:
    """The run's processes: the child and its descendants seen so far."""
    return {child_pid, *(int(entry[0]) for entry in state.descendants)}


def _finish(directory: Path, state: RunState) -> None:
    # start-up time: the run store (sqlite3)
    from gpustation.runs.store.index import RunStore

    # A short wait for a locked index: the row is caught up with later.
    record_end(directory, state, RunStore(write_wait_s=2.0))


def _write_state(directory: Path, state: RunState) -> None:
    try:
        rundir.write_state(directory, state)
    except OSError as err:
        _log(f"could not write {rundir.STATE_JSON}: {err}")


def _record_final(
    directory: Path, state: RunState, signalled: Callable[[], bool] = lambda: False
) -> bool:
    """Record the run's end whatever the disk says; True once all of it is written.

    ``exit-status`` first (overwritten in place: no new blocks), then the
    row and ``state.json``, tried again every second for a while, or until
    ``signalled`` says a signal asked the supervisor to go.
    """
    # start-up time: the run store (sqlite3)
    from gpustation.runs.store.index import RunStore

    try:
        rundir.write_exit_status(directory, state)
    except OSError as err:
        _log(f"could not write {rundir.EXIT_STATUS}: {err}")
    store = RunStore(write_wait_s=2.0)
    row_ok, state_ok = record_end(directory, state, store)
    deadline = time.monotonic() + END_RETRY_S
    while not (row_ok and state_ok) and time.monotonic() < deadline:
        if signalled():
            _log("asked to go: the next writer records the end from exit-status")
            break
        time.sleep(END_RETRY_EVERY_S)
        if not state_ok:
            try:
                rundir.write_state(directory, state)
                state_ok = True
                _log(f"wrote {rundir.STATE_JSON} after all")
            except OSError:
                pass
        if not row_ok:
            try:
                # start-up time: the run store (sqlite3)
                from gpustation.runs.store.index import sync_run

                sync_run(directory, store, state=state)
                row_ok = True
            except Exception:
                pass
    if not (row_ok and state_ok):
        _log("gave up writing the end of the run; exit-status holds it")
    return row_ok and state_ok


def _note_stop_signal(directory: Path, name: str) -> None:
    try:
        rundir.note_stop_signal(directory, name)
    except OSError as err:
        _log(f"could not note {name} in the stop marker: {err}")


def supervise(directory: Path) -> int:
    run = rundir.read_run(directory, exact=True)
    if run is None:
        _log(f"no readable {rundir.RUN_JSON} in {directory}")
        return 2
    state = rundir.read_state(directory) or RunState(id=run["id"])
    state.supervisor_pid = os.getpid()
    state.supervisor_create_time = rundir.create_time_of(os.getpid())
    state.supervisor_start = rundir.start_of(os.getpid())
    rundir.write_state(directory, state)
    try:
        rundir.prepare_exit_status(directory)
    except OSError as err:
        _log(f"could not prepare {rundir.EXIT_STATUS}: {err}")
    if not become_subreaper():
        _log("not a child subreaper: a process that leaves the run's session is found by polling")

    stop_signal: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        stop_signal.append(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    output = directory / rundir.OUTPUT_LOG
    if rundir.stop_requested(directory):
        state.status, state.reason = "stopped", "stopped before it started"
        state.started_at = state.ended_at = time.time()
        _record_final(directory, state, lambda: bool(stop_signal))
        return 0

    env = child_env(dict(os.environ), run.get("env") or {})
    oom_before = cgroup_oom_kills()
    # Unbuffered append: the child's bytes reach the file as they come.
    log = open(output, "ab", buffering=0, opener=private.opener)  # noqa: SIM115
    try:
        child = subprocess.Popen(
            run["argv"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
            cwd=run.get("cwd") or None,
        )
    except OSError as err:
        message = f"cannot start {run['argv'][0]!r}: {err.strerror or err}"
        try:
            log.write(f"gpustation: {message}\n".encode())
        except OSError:
            pass
        log.close()
        state.status, state.reason = "failed", message
        state.started_at = state.ended_at = time.time()
        state.error_tail = [f"gpustation: {message}"]
        _record_final(directory, state, lambda: bool(stop_signal))
        return 0
    log.close()
    state.child_pid = child.pid
    state.pgid = child.pid  # start_new_session: the child leads its own group
    state.child_create_time = rundir.create_time_of(child.pid)
    state.child_start = rundir.start_of(child.pid)
    state.started_at = time.time()
    state.status = "running"
    _finish(directory, state)
    _log(f"started {run['argv']} as pid {child.pid}")

    telemetry = _Telemetry(directory, list(run.get("gpus") or []), run.get("backend") or {})
    watch = SlowdownWatch.start(directory, run, state, _log)  # None: slowdowns not watched
    grace_s = float(run.get("stop_grace_s", DEFAULT_GRACE_S))
    next_sample = time.monotonic()
    stopping = False
    while True:
        if stop_signal and not stopping:
            stopping = True
            _log(f"got {stop_signal[0]}: stopping the run")
            try:
                rundir.request_stop(directory, f"supervisor {stop_signal[0]}")
            except OSError as err:
                _log(f"could not leave the stop marker: {err}")
            telemetry.sample()
            terminate_group(
                state.pgid,
                child.pid,
                state.child_create_time,
                grace_s,
                log=_log,
                leader_start=state.child_start,
                on_signal=lambda name: _note_stop_signal(directory, name),
                known=state.descendants,
            )
        now = time.monotonic()
        if now >= next_sample:
            telemetry.sample(pids=_run_pids(child.pid, state))
            if watch is not None:
                watch.tick(telemetry.snapshot, _run_pids(child.pid, state))
            next_sample = now + SAMPLE_INTERVAL_S
        if _note_descendants(child.pid, state):
            _write_state(directory, state)
        try:
            child.wait(timeout=max(0.01, min(0.5, next_sample - time.monotonic())))
            break
        except subprocess.TimeoutExpired:
            continue
    telemetry.sample(final=True, pids=_run_pids(child.pid, state))  # the counters at the end
    telemetry.close()
    if watch is not None:
        watch.close()  # a slowdown under way ends with the run, before the run's end is recorded
    # Anything the child left behind (in its group, or workers in sessions of
    # their own, re-parented here) goes with it: no orphan outlives its run.
    _note_descendants(child.pid, state)
    terminate_group(state.pgid, None, None, grace_s=1.0, log=_log, known=state.descendants)
    _sweep_descendants(child.pid)

    code = child.returncode
    state.ended_at = time.time()
    if code < 0:
        state.signal = signal_name(-code)
        state.exit_code = None
    else:
        state.exit_code = code
        state.signal = None
    stop = rundir.read_stop(directory)
    if stop is None and stop_signal:
        # The marker could not be written (a full disk): the signal is remembered.
        stop = {"by": f"supervisor {stop_signal[0]}"}
    if stop is not None:
        state.status = "stopped"
        state.reason = stopped_reason(stop)
    elif code == 0:
        state.status = "succeeded"
    else:
        state.status = "failed"
        reported = _metrics_report_oom(directory / rundir.METRICS_FILE)
        if reported is not None:
            state.oom = True
            state.reason = f"out of memory: {reported}"
        elif _log_mentions_cuda_oom(output):
            state.oom = True
            state.reason = "CUDA out of memory (the GPU ran out of memory)"
        elif state.signal == "SIGKILL":
            oom_after = cgroup_oom_kills()
            if oom_before is not None and oom_after is not None and oom_after > oom_before:
                state.oom = True
                state.reason = "killed by the kernel OOM killer (host memory ran out)"
            else:
                state.reason = (
                    "killed by SIGKILL from outside gpustation (the kernel OOM killer "
                    "does this when host memory runs out; see `dmesg`)"
                )
        elif state.signal:
            state.reason = f"killed by {state.signal}"
        else:
            state.reason = f"exited with code {code}"

        node_failed = failure_reason(directory)  # a multi-node run names its node
        if node_failed is not None:
            state.reason = f"{node_failed}: {state.reason}" if state.oom else node_failed
        state.error_tail = rundir.tail_lines(output, 20)
    _log(f"run ended: {state.status} ({state.reason or 'exit 0'})")
    # A signal from now on (the run has ended) means: stop retrying and go.
    signals_at_end = len(stop_signal)
    _record_final(directory, state, lambda: len(stop_signal) > signals_at_end)
    try:
        # guarded: a failure here never changes the run's outcome
        from gpustation.runs.launch.notify_end import notify_end

        notify_end(directory, state)
    except Exception as err:  # being told must never change the run's outcome
        _log(f"notification not sent: {err}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m gpustation.runs.launch.supervisor RUN_DIR", file=sys.stderr)
        return 2
    directory = Path(argv[0])
    try:
        return supervise(directory)
    except Exception as err:
        # A bug here must not leave a run unwatched: stop it and say why.

        _log("supervisor error:\n" + traceback.format_exc())
        state = rundir.read_state(directory)
        if state is not None and state.active:
            terminate_group(
                state.pgid,
                state.child_pid,
                state.child_create_time,
                grace_s=2.0,
                log=_log,
                leader_start=state.child_start,
                known=state.descendants,
            )
            mark_ended(directory, state, "failed", f"the run's supervisor failed: {err!r}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
