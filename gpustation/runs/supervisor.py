"""The process that watches over one run: ``python -m gpustation.runs.supervisor DIR``.

Started detached by :func:`gpustation.runs.launch.launch`. It starts the
child in its own process group with stdout and stderr going to
``output.log``, samples the run's GPUs once a second into
``telemetry.jsonl``, waits for the child and records how it ended in
``state.json`` and the run store. Being the child's parent, it always learns
the exit status, whoever else has gone away. SIGTERM, SIGINT or SIGHUP to the
supervisor stop the child (graceful, then firm) before it exits, so killing
the supervisor never orphans a run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpustation.runs import rundir
from gpustation.runs.gputrace import compact_sample, write_sample
from gpustation.runs.reconcile import record_end
from gpustation.runs.rundir import RunState
from gpustation.runs.stop import DEFAULT_GRACE_S, terminate_group

SAMPLE_INTERVAL_S = 1.0
SLOW_INTERVAL_S = 5.0
_CUDA_OOM = re.compile(
    rb"CUDA out of memory|OutOfMemoryError|"
    rb"CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation|RESOURCE_EXHAUSTED: Out of memory"
)


def _log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} supervisor[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


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
    from gpustation.runs.tail import parse_metric_line

    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - max_bytes))
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        event = parse_metric_line(line)
        if event is not None and event.get("error") == "out_of_memory":
            message = str(event.get("message") or "").strip()
            return message.splitlines()[0] if message else "out of memory"
    return None


def _log_mentions_cuda_oom(path: Path, max_bytes: int = 256 * 1024) -> bool:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - max_bytes))
            return _CUDA_OOM.search(fh.read()) is not None
    except OSError:
        return False


class _Telemetry:
    """Samples the run's GPUs; any failure turns it off rather than the run."""

    def __init__(self, directory: Path, gpus: list[int], backend_info: dict[str, Any]) -> None:
        self.path = directory / rundir.TELEMETRY_FILE
        self.sampler: Any = None
        self.t0 = time.monotonic()
        if not gpus or backend_info.get("kind") == "none":
            return
        try:
            from gpustation.telemetry.backend import open_backend
            from gpustation.telemetry.sampler import Sampler

            simulate = backend_info.get("simulate") if backend_info.get("simulated") else None
            backend = open_backend(simulate=simulate, sim_card=backend_info.get("sim_card"))
            self.sampler = Sampler(
                backend,
                gpus=gpus,
                # Energy is a slow field (as is PCIe throughput, slow to read on
                # NVML): read every few seconds; the counter is cumulative.
                slow_interval_s=SLOW_INTERVAL_S,
                with_host=False,
                with_topology=False,
            )
        except Exception as err:
            _log(f"GPU telemetry is off: {err}")
            self.sampler = None

    def sample(self, final: bool = False) -> None:
        if self.sampler is None:
            return
        try:
            snap = self.sampler.sample(slow=True if final else None)
            write_sample(self.path, compact_sample(snap, time.monotonic() - self.t0))
        except Exception as err:
            _log(f"GPU telemetry stopped: {err}")
            self.close()

    def close(self) -> None:
        if self.sampler is not None:
            try:
                self.sampler.backend.close()
            except Exception:
                pass
            self.sampler = None


def _note_descendants(pid: int, state: RunState) -> bool:
    """Keep the state's list of the child's live descendants; True when it changed.

    Only the living are kept (DataLoader workers come and go every epoch), but
    a descendant whose parent died stays listed while it lives: it is exactly
    the process a stop could not find any other way.
    """
    import psutil

    try:
        found = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        found = []
    kept = [
        entry
        for entry in state.descendants
        if rundir.process_matches(int(entry[0]), float(entry[1]))
    ]
    changed = len(kept) != len(state.descendants)
    seen = {int(entry[0]) for entry in kept}
    for proc in found:
        if proc.pid in seen:
            continue
        try:
            kept.append([proc.pid, proc.create_time()])
            changed = True
        except psutil.Error:
            continue
    state.descendants = kept
    return changed


def _finish(directory: Path, state: RunState) -> None:
    record_end(directory, state)


def supervise(directory: Path) -> int:
    run = rundir.read_run(directory)
    if run is None:
        _log(f"no readable {rundir.RUN_JSON} in {directory}")
        return 2
    state = rundir.read_state(directory) or RunState(id=run["id"])
    state.supervisor_pid = os.getpid()
    state.supervisor_create_time = rundir.create_time_of(os.getpid())
    rundir.write_state(directory, state)

    stop_signal: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        stop_signal.append(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    output = directory / rundir.OUTPUT_LOG
    if rundir.stop_requested(directory):
        state.status, state.reason = "stopped", "stopped before it started"
        state.started_at = state.ended_at = time.time()
        _finish(directory, state)
        return 0

    env = dict(os.environ)
    env.update(run.get("env") or {})
    oom_before = cgroup_oom_kills()
    # Unbuffered append: the child's bytes reach the file as they come.
    log = open(output, "ab", buffering=0)  # noqa: SIM115
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
        log.write(f"gpustation: {message}\n".encode())
        log.close()
        state.status, state.reason = "failed", message
        state.started_at = state.ended_at = time.time()
        state.error_tail = [f"gpustation: {message}"]
        _finish(directory, state)
        return 0
    log.close()
    state.child_pid = child.pid
    state.pgid = child.pid  # start_new_session: the child leads its own group
    state.child_create_time = rundir.create_time_of(child.pid)
    state.started_at = time.time()
    state.status = "running"
    _finish(directory, state)
    _log(f"started {run['argv']} as pid {child.pid}")

    telemetry = _Telemetry(directory, list(run.get("gpus") or []), run.get("backend") or {})
    grace_s = float(run.get("stop_grace_s", DEFAULT_GRACE_S))
    next_sample = time.monotonic()
    stopping = False
    while True:
        if stop_signal and not stopping:
            stopping = True
            _log(f"got {stop_signal[0]}: stopping the run")
            rundir.request_stop(directory, f"supervisor {stop_signal[0]}")
            telemetry.sample()
            terminate_group(
                state.pgid,
                child.pid,
                state.child_create_time,
                grace_s,
                log=_log,
                on_signal=lambda name: rundir.note_stop_signal(directory, name),
                known=state.descendants,
            )
        now = time.monotonic()
        if now >= next_sample:
            telemetry.sample()
            next_sample = now + SAMPLE_INTERVAL_S
        if _note_descendants(child.pid, state):
            rundir.write_state(directory, state)
        try:
            child.wait(timeout=max(0.01, min(0.5, next_sample - time.monotonic())))
            break
        except subprocess.TimeoutExpired:
            continue
    telemetry.sample(final=True)  # the energy counters at the end
    telemetry.close()
    # Anything the child left behind (in its group, or workers in sessions of
    # their own) goes with it: no orphan outlives its run.
    terminate_group(state.pgid, None, None, grace_s=1.0, log=_log, known=state.descendants)

    code = child.returncode
    state.ended_at = time.time()
    if code < 0:
        state.signal = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        state.exit_code = None
    else:
        state.exit_code = code
        state.signal = None
    stop = rundir.read_stop(directory)
    if stop is not None:
        state.status = "stopped"
        signals = stop.get("signals") or []
        state.reason = f"stopped by {stop.get('by', 'request')}" + (
            f" ({signals[-1]})" if signals else ""
        )
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
        state.error_tail = rundir.tail_lines(output, 20)
    _finish(directory, state)
    _log(f"run ended: {state.status} ({state.reason or 'exit 0'})")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m gpustation.runs.supervisor RUN_DIR", file=sys.stderr)
        return 2
    directory = Path(argv[0])
    try:
        return supervise(directory)
    except Exception as err:
        # A bug here must not leave a run unwatched: stop it and say why.
        import traceback

        _log("supervisor error:\n" + traceback.format_exc())
        state = rundir.read_state(directory)
        if state is not None and state.active:
            from gpustation.runs.reconcile import mark_ended

            terminate_group(
                state.pgid,
                state.child_pid,
                state.child_create_time,
                grace_s=2.0,
                log=_log,
                known=state.descendants,
            )
            mark_ended(directory, state, "failed", f"the run's supervisor failed: {err!r}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
