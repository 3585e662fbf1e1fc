"""Starting, stopping and finding runs.

:func:`launch` turns a preset into a run directory (``runs/<id>/`` in the data
dir) and starts ``python -m gpustation.runs.supervisor <run dir>`` fully
detached. The supervisor starts the child in its own process group, records
its GPUs' telemetry and writes how it ended, so a run outlives whoever
launched it and its exit status is never lost.

:func:`stop_run` stops a run gracefully, then firmly: SIGINT to the child's
process group, a wait, SIGTERM, a wait, SIGKILL; then it checks that no
process of the group is left. :func:`list_active_runs` finds the runs still
going (to re-attach after a restart), checking that each recorded PID is
still the process it was, and marks runs whose supervisor vanished ``lost``.

No function here keeps anything in memory between calls: a run is its
directory, so a UI may drop every handle and find its runs again.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpustation import paths
from gpustation.errors import GpustationError, NoDriverError, UsageError
from gpustation.runs import rundir
from gpustation.runs.metrics import METRICS_ENV, RUN_DIR_ENV
from gpustation.runs.presets import RUNNER_PACKAGE, ArgValue, RunPreset, apply_overrides
from gpustation.runs.rundir import RunState

RUN_ID_ENV = "GPUSTATION_RUN_ID"
DEFAULT_GRACE_S = 10.0

# Multi-node settings passed through to torchrun, by preset key.
_TORCHRUN_PASSTHROUGH = (
    ("nnodes", "--nnodes"),
    ("node_rank", "--node_rank"),
    ("rdzv_backend", "--rdzv_backend"),
    ("rdzv_endpoint", "--rdzv_endpoint"),
    ("rdzv_id", "--rdzv_id"),
    ("master_addr", "--master_addr"),
    ("master_port", "--master_port"),
)
# ... and to accelerate launch, which names them differently.
_ACCELERATE_PASSTHROUGH = (
    ("nnodes", "--num_machines"),
    ("node_rank", "--machine_rank"),
    ("master_addr", "--main_process_ip"),
    ("master_port", "--main_process_port"),
    ("rdzv_backend", "--rdzv_backend"),
)


def format_args(args: dict[str, ArgValue]) -> list[str]:
    """``{"batch_size": 64, "compile": False}`` -> ``--batch-size 64 --no-compile``.

    Lists give one flag followed by every value (argparse ``nargs="+"``).
    """
    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, list):
            argv.append(flag)
            argv.extend(_scalar(v) for v in value)
        else:
            argv.append(flag)
            argv.append(_scalar(value))
    return argv


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def nproc_for(preset: RunPreset, gpus: Sequence[int]) -> int:
    """Processes per node: the preset's, else one per chosen GPU (at least one)."""
    if preset.nproc_per_node:
        return preset.nproc_per_node
    return max(1, len(gpus))


def build_argv(preset: RunPreset, gpus: Sequence[int], python: str | None = None) -> list[str]:
    """The child's argv (no shell ever sees it)."""
    python = python or sys.executable
    args = format_args(preset.args)
    if preset.command is not None:
        target = [*preset.command, *args]
        module = False
    else:
        target = [f"{RUNNER_PACKAGE}.{preset.runner}", *args]
        module = True
    if preset.launcher == "python":
        return [python, "-m", *target] if module else target
    nproc = str(nproc_for(preset, gpus))
    if preset.launcher == "torchrun":
        argv = [python, "-m", "torch.distributed.run", "--nproc_per_node", nproc]
        multi_node = preset.nnodes not in (None, 1) or any(
            getattr(preset, key) is not None for key, _ in _TORCHRUN_PASSTHROUGH[2:]
        )
        if not multi_node:
            # A free port per run, so two local runs never fight over 29500.
            argv.append("--standalone")
        for key, flag in _TORCHRUN_PASSTHROUGH:
            value = getattr(preset, key)
            if value is not None:
                argv += [flag, str(value)]
    elif preset.launcher == "accelerate":
        argv = [python, "-m", "accelerate.commands.launch", "--num_processes", nproc]
        total = int(nproc) * (preset.nnodes or 1)
        if total > 1:
            argv.append("--multi_gpu")
        # Said explicitly so accelerate neither asks nor warns about them.
        argv += ["--mixed_precision", "no", "--dynamo_backend", "no"]
        for key, flag in _ACCELERATE_PASSTHROUGH:
            value = getattr(preset, key)
            if value is not None:
                argv += [flag, str(value)]
        if preset.rdzv_endpoint and preset.master_addr is None:
            host, _, port = preset.rdzv_endpoint.rpartition(":")
            argv += ["--main_process_ip", host or preset.rdzv_endpoint]
            if port.isdigit() and preset.master_port is None:
                argv += ["--main_process_port", port]
    else:  # validated when the preset was loaded
        raise UsageError(f"preset {preset.name!r}: unknown launcher {preset.launcher!r}")
    return [*argv, "-m", *target] if module else [*argv, *target]


def resolve_gpus(
    preset: RunPreset, cli_gpus: Sequence[int] | None, device_count: int | None
) -> list[int]:
    """Which GPUs the run gets: ``--gpus`` wins, then the preset, else all.

    ``device_count`` is None when there is no driver to ask (a CPU run).
    """

    def check(wanted: Sequence[int], what: str) -> list[int]:
        if device_count is not None:
            missing = [i for i in wanted if i >= device_count]
            if missing:
                raise UsageError(
                    f"{what}: no GPU {', '.join(map(str, missing))} on this machine "
                    f"({device_count} GPU{'s' if device_count != 1 else ''})"
                )
        return list(wanted)

    if cli_gpus is not None:
        return check(cli_gpus, "--gpus")
    if isinstance(preset.gpus, list):
        return check(preset.gpus, f"preset {preset.name!r} gpus")
    if isinstance(preset.gpus, int):
        if device_count is None:
            return []
        if preset.gpus > device_count:
            raise UsageError(
                f"preset {preset.name!r} wants {preset.gpus} GPUs; this machine has "
                f"{device_count}. Choose some with --gpus."
            )
        return list(range(preset.gpus))
    return list(range(device_count or 0))


def build_env(
    preset: RunPreset,
    gpus: Sequence[int],
    run_id: str,
    directory: Path,
    has_driver: bool,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """The variables gpustation sets for the child (on top of its own environment).

    NCCL and other settings of the parent environment pass through untouched.
    """
    base = dict(os.environ) if base is None else base
    env = dict(preset.env)
    env.update(
        {
            METRICS_ENV: str(directory / rundir.METRICS_FILE),
            RUN_DIR_ENV: str(directory),
            RUN_ID_ENV: run_id,
            "PYTHONUNBUFFERED": "1",
        }
    )
    if has_driver:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpus)
        # NVML numbers GPUs by PCI bus; CUDA's default order may differ.
        if "CUDA_DEVICE_ORDER" not in base and "CUDA_DEVICE_ORDER" not in preset.env:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def new_run_id(name: str, now: float | None = None) -> str:
    """A sortable id: ``20261129-153012-resnet50-bf16-3f2a`` (UTC time)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")[:40] or "run"
    return f"{stamp}-{slug}-{secrets.token_hex(2)}"


@dataclass
class RunHandle:
    """A launched run. Plain data: everything else is read from ``run_dir``."""

    id: str
    run_dir: Path
    preset: str
    title: str
    gpus: list[int]
    argv: list[str]
    created_at: float
    warnings: list[str] = field(default_factory=list)
    state: RunState | None = None

    @property
    def output_log(self) -> Path:
        return self.run_dir / rundir.OUTPUT_LOG

    @property
    def metrics_file(self) -> Path:
        return self.run_dir / rundir.METRICS_FILE


def _open_device_count(
    simulate: int | None, sim_card: str | None
) -> tuple[int | None, dict[str, Any]]:
    from gpustation.telemetry.backend import open_backend

    try:
        backend = open_backend(simulate=simulate, sim_card=sim_card)
    except NoDriverError as err:
        return None, {"kind": "none", "simulated": False, "note": str(err)}
    try:
        count = backend.device_count()
    finally:
        backend.close()
    if backend.simulated:
        if simulate is None:
            raw = os.environ.get("GPUSTATION_SIMULATE", "")
            simulate = int(raw) if raw.lstrip("-").isdigit() else -1
        return count, {
            "kind": "sim",
            "simulated": True,
            "simulate": count if simulate in (None, -1) else simulate,
            "sim_card": sim_card or os.environ.get("GPUSTATION_SIM_CARD") or None,
        }
    return count, {"kind": "nvml", "simulated": False}


def launch(
    preset: RunPreset,
    overrides: Sequence[str] = (),
    gpus: Sequence[int] | None = None,
    *,
    simulate: int | None = None,
    sim_card: str | None = None,
    device_count: int | None = -1,
    backend_info: dict[str, Any] | None = None,
    stop_grace_s: float = DEFAULT_GRACE_S,
    cwd: str | os.PathLike[str] | None = None,
    wait_started_s: float = 10.0,
) -> RunHandle:
    """Start a run of ``preset`` and return once its supervisor has started it.

    ``overrides`` are ``key=value`` strings for the preset's ``[args]``;
    ``gpus`` the GPUs chosen on the command line (None: the preset's choice).
    The GPU count comes from the backend (``simulate`` as for every command)
    unless ``device_count``/``backend_info`` are given.
    """
    preset, parsed, warnings = apply_overrides(preset, list(overrides))
    if backend_info is None or device_count == -1:
        device_count, backend_info = _open_device_count(simulate, sim_card)
    chosen = resolve_gpus(preset, gpus, device_count)
    if device_count is None and (gpus or preset.gpus):
        warnings.append("no NVIDIA driver: the run starts without GPUs")
    created = time.time()
    runs_root = paths.runs_dir()
    runs_root.mkdir(parents=True, exist_ok=True)
    while True:
        run_id = new_run_id(preset.name, created)
        directory = runs_root / run_id
        try:
            directory.mkdir()
            break
        except FileExistsError:
            continue
    argv = build_argv(preset, chosen)
    env = build_env(
        preset, chosen, run_id, directory, has_driver=backend_info.get("kind") != "none"
    )
    run = {
        "id": run_id,
        "created_at": created,
        "preset": preset.to_dict(),
        "overrides": parsed,
        "argv": argv,
        "gpus": chosen,
        "env": env,
        "cwd": str(Path(cwd) if cwd is not None else Path.cwd()),
        "backend": backend_info,
        "stop_grace_s": stop_grace_s,
        "python": sys.executable,
        "warnings": warnings,
    }
    rundir.write_json(directory / rundir.RUN_JSON, run)
    rundir.write_state(directory, RunState(id=run_id, status="starting"))
    from gpustation.runs.store import sync_run

    sync_run(directory)

    sup_env = dict(os.environ)
    if backend_info.get("simulated"):
        sup_env["GPUSTATION_SIMULATE"] = str(backend_info.get("simulate", -1))
        if backend_info.get("sim_card"):
            sup_env["GPUSTATION_SIM_CARD"] = str(backend_info["sim_card"])
    else:
        sup_env.pop("GPUSTATION_SIMULATE", None)
    with open(directory / rundir.SUPERVISOR_LOG, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpustation.runs.supervisor", str(directory)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=sup_env,
            cwd=str(directory),
        )
    # Reap the supervisor when it ends, so a long-lived UI keeps no zombies.
    threading.Thread(target=proc.wait, name=f"reap-{run_id}", daemon=True).start()

    handle = RunHandle(
        id=run_id,
        run_dir=directory,
        preset=preset.name,
        title=preset.display_title,
        gpus=chosen,
        argv=argv,
        created_at=created,
        warnings=warnings,
    )
    deadline = time.monotonic() + wait_started_s
    while time.monotonic() < deadline:
        state = rundir.read_state(directory)
        if state is not None and (state.child_pid or not state.active):
            handle.state = state
            break
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    if handle.state is None:
        handle.state = rundir.read_state(directory)
        if proc.poll() is not None and (handle.state is None or handle.state.active):
            raise GpustationError(
                f"the run supervisor ended at once (exit {proc.returncode}); "
                f"see {directory / rundir.SUPERVISOR_LOG}"
            )
    return handle


# ---- stopping ----------------------------------------------------------------


def _signal_name(sig: int) -> str:
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
    known: Sequence[Sequence[float]] = (),
) -> str | None:
    """SIGINT, wait, SIGTERM, wait, SIGKILL to a process group until none is left.

    Returns the name of the last signal sent (None when nothing was running).
    Processes that left the group (``setsid``; torchrun's workers do) are
    signalled too: the leader's descendants now, and ``known``, the
    ``(pid, create_time)`` pairs of descendants seen earlier (the supervisor
    records them, so they are found even once their parent has died).
    ``force_now`` cuts the waits short (a second Ctrl-C).
    """
    import psutil

    group_ok = bool(pgid)
    leader = None
    if pgid and leader_pid:
        try:
            leader = psutil.Process(leader_pid)
            if (
                leader_create_time is not None
                and abs(leader.create_time() - leader_create_time) > 0.05
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
    for pid, create_time in known:
        if int(pid) not in strays and rundir.process_matches(int(pid), float(create_time)):
            try:
                strays[int(pid)] = psutil.Process(int(pid))
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
        last = _signal_name(sig)
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
    if not state.active:
        return state
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
        )
    final = wait_for_end(directory, timeout=wait_s)
    if final is not None and final.active:
        # The supervisor is gone or hung: record the end ourselves.
        final = _mark_ended(directory, final, "stopped", "stopped; its supervisor did not respond")
    return final


def stop_runs(
    runs: Sequence[str | Path], grace_s: float | None = None, by: str = "user"
) -> dict[str, RunState | None]:
    """Stop several runs at once (quitting the dashboard, say); each as :func:`stop_run`.

    They are stopped in parallel, so the wait is one run's grace, not the sum.
    """
    from concurrent.futures import ThreadPoolExecutor

    if not runs:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(runs))) as pool:
        futures = {
            run_directory(run).name: pool.submit(stop_run, run, grace_s, by=by) for run in runs
        }
        return {name: future.result() for name, future in futures.items()}


# ---- finding runs again ----------------------------------------------------------


@dataclass
class ActiveRun:
    """A run still going, found from its directory."""

    id: str
    run_dir: Path
    state: RunState
    run: dict[str, Any]
    #: False when the supervisor is gone but the child still runs
    supervised: bool = True


def _mark_ended(directory: Path, state: RunState, status: str, reason: str) -> RunState:
    state.status = status
    state.reason = reason
    if state.ended_at is None:
        try:
            state.ended_at = (directory / rundir.OUTPUT_LOG).stat().st_mtime
        except OSError:
            state.ended_at = time.time()
    state.error_tail = rundir.tail_lines(directory / rundir.OUTPUT_LOG, 20)
    record_end(directory, state)
    return state


def record_end(directory: Path, state: RunState) -> None:
    """Save a run's state: the history row first, then ``state.json``.

    In that order, whoever sees the state file change (a waiting command, a
    UI) finds the history already up to date.
    """
    try:
        from gpustation.runs.store import sync_run

        sync_run(directory, state=state)
    except Exception as err:  # the history is secondary to the state file
        print(f"gpustation: could not record run {state.id} in the history: {err}", file=sys.stderr)
    rundir.write_state(directory, state)


def check_run(directory: Path, starting_grace_s: float = 30.0) -> RunState | None:
    """A run's state, corrected when the processes it names are gone.

    A run whose supervisor and child both vanished without recording an end
    (a reboot, ``kill -9``) is marked ``lost`` with what is known.
    """
    state = rundir.read_state(directory)
    if state is None or not state.active:
        return state
    if rundir.process_matches(state.supervisor_pid, state.supervisor_create_time):
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
    if rundir.process_matches(state.child_pid, state.child_create_time):
        return state  # unsupervised but alive
    return _mark_ended(
        directory,
        state,
        "lost",
        "the run's supervisor ended without recording how the run ended "
        "(killed, or the machine restarted)",
    )


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
        supervised = rundir.process_matches(state.supervisor_pid, state.supervisor_create_time)
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
