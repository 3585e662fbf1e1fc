"""Starting a run: a run directory and a detached supervisor.

:func:`launch` turns a preset into a run directory (``runs/<id>/`` in the data
dir), writes ``run.json``, the first ``state.json`` and the run's history row,
and starts ``python -P -m gpustation.runs.launch.supervisor <run dir>`` fully
detached (under sudo, as the invoking user: see :mod:`gpustation.privs`).
The supervisor starts the child in its own process group, records its GPUs'
telemetry and writes how it ended, so a run outlives whoever launched it and
its exit status is never lost.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpustation import paths, private, privs, timefmt
from gpustation.errors import GpustationError, NoDriverError, UsageError
from gpustation.pyargv import python_argv
from gpustation.redact import redact_env
from gpustation.runs import rundir
from gpustation.runs.argvalue import ArgValue
from gpustation.runs.cost import price_or_none
from gpustation.runs.forecast.model import GpuRoom
from gpustation.runs.forecast.plan import read_rooms
from gpustation.runs.launch.argv import (
    build_argv,
    build_env,
    private_env,
    recorded_env,
    resolve_gpus,
)
from gpustation.runs.launch.stop import DEFAULT_GRACE_S
from gpustation.runs.presets import RunPreset, apply_values
from gpustation.runs.rundir import RunState
from gpustation.runs.slowdown.settings import load_settings
from gpustation.runs.store.reconcile import list_active_runs, mark_ended, record_lost_runs
from gpustation.runs.summary import RunSummary
from gpustation.telemetry.backend import simulate_from_env
from gpustation.telemetry.registry import open_backend


def new_run_id(name: str, now: float | None = None) -> str:
    """A sortable id: ``20261129-153012-resnet50-bf16-3f2a`` (UTC time)."""
    stamp = timefmt.file_stamp(now)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")[:40] or "run"
    return f"{stamp}-{slug}-{secrets.token_hex(2)}"


def working_directory() -> str:
    """The directory a run starts in (this one); a UsageError when it was deleted."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        raise UsageError(
            "the current directory no longer exists (deleted or moved away); "
            "cd to a directory that exists and start the run again"
        ) from None


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

    def summary(self) -> RunSummary:
        """The run as it starts, in the one shape of a run."""
        summary = RunSummary(
            id=self.id,
            preset=self.preset,
            title=self.title,
            gpus=list(self.gpus),
            argv=list(self.argv),
            run_dir=str(self.run_dir),
            started_at=self.created_at,
        )
        return summary if self.state is None else summary.apply_state(self.state)

    @property
    def output_log(self) -> Path:
        return self.run_dir / rundir.OUTPUT_LOG


def _open_device_count(
    simulate: int | None, sim_card: str | None
) -> tuple[int | None, dict[str, Any], list[GpuRoom]]:
    """The GPU count, the backend as run.json records it, and each GPU's room now
    (memory and power limit, for the run's forecast)."""
    try:
        backend = open_backend(simulate=simulate, sim_card=sim_card)
    except NoDriverError as err:
        return None, {"kind": "none", "simulated": False, "note": str(err)}, []
    try:
        count = backend.device_count()
        rooms = read_rooms(backend, range(count))
    finally:
        backend.close()
    if backend.simulated:
        if simulate is None:
            simulate = simulate_from_env()
        return (
            count,
            {
                "kind": "sim",
                "simulated": True,
                "simulate": count if simulate in (None, -1) else simulate,
                "sim_card": sim_card or os.environ.get("GPUSTATION_SIM_CARD") or None,
                **({"kept": backend.kept} if backend.kept else {}),
            },
            rooms,
        )
    return count, {"kind": "nvml", "simulated": False}, rooms


def _sharing(chosen: list[int], backend_info: dict[str, Any]) -> list[tuple[Any, list[int]]]:
    """Runs still going on any of ``chosen`` (GPUs of the same kind: real or simulated)."""
    if not chosen:
        return []
    simulated = bool(backend_info.get("simulated"))
    found = []
    for other in list_active_runs():
        if bool((other.run.get("backend") or {}).get("simulated")) != simulated:
            continue
        common = sorted(set(chosen) & set(other.run.get("gpus") or []))
        if common:
            found.append((other, common))
    return found


def launch(
    preset: RunPreset,
    overrides: Mapping[str, ArgValue] | None = None,
    gpus: Sequence[int] | None = None,
    *,
    simulate: int | None = None,
    sim_card: str | None = None,
    device_count: int | None = -1,
    backend_info: dict[str, Any] | None = None,
    stop_grace_s: float = DEFAULT_GRACE_S,
    cwd: str | os.PathLike[str] | None = None,
    wait_started_s: float = 10.0,
    wrap: Sequence[str] = (),
    resumed_from: dict[str, Any] | None = None,
) -> RunHandle:
    """Start a run of ``preset`` and return once its supervisor has started it.

    ``overrides`` are values for the preset's ``[args]`` (:func:`apply_values`);
    ``gpus`` the GPUs chosen on the command line (None: the preset's choice).
    The GPU count comes from the backend (``simulate`` as for every command)
    unless ``device_count``/``backend_info`` are given. ``resumed_from`` (the run
    and checkpoint step a resumed run continues) is recorded in ``run.json``.
    """
    preset, parsed, warnings = apply_values(preset, overrides or {})
    # Before the run directory exists: a run that cannot start leaves none behind.
    workdir = str(Path(cwd)) if cwd is not None else working_directory()
    # The launcher is a writer: runs found lost since the last launch are
    # recorded now (readers only show them lost; see reconcile.py).
    record_lost_runs()
    rooms: list[GpuRoom] | None = None
    if backend_info is None or device_count == -1:
        device_count, backend_info, rooms = _open_device_count(simulate, sim_card)
        kept = backend_info.pop("kept", None)  # said when the run starts, not recorded
        if kept:
            warnings.append(str(kept))
    chosen = resolve_gpus(preset, gpus, device_count)
    if device_count is None and (gpus or preset.gpus):
        warnings.append("no NVIDIA driver: the run starts without GPUs")
    created = time.time()
    run_id, directory = new_run_directory(preset.name, created)
    return _start(
        RunRequest(preset, parsed, warnings, workdir, backend_info, stop_grace_s, wrap, rooms),
        chosen,
        run_id,
        directory,
        created,
        wait_started_s,
        resumed_from,
    )


@dataclass
class RunRequest:
    """A run asked for, before its GPUs are chosen: what a queued run keeps until it starts."""

    preset: RunPreset
    overrides: dict[str, Any]
    warnings: list[str]
    cwd: str
    backend: dict[str, Any]
    stop_grace_s: float = DEFAULT_GRACE_S
    wrap: Sequence[str] = ()
    #: the GPUs' memory and power limit when it was checked (None: not read; a queued
    #: run's are read again when it starts)
    rooms: list[GpuRoom] | None = None


def prepare(
    preset: RunPreset,
    overrides: Mapping[str, ArgValue] | None = None,
    *,
    simulate: int | None = None,
    sim_card: str | None = None,
    stop_grace_s: float = DEFAULT_GRACE_S,
    cwd: str | os.PathLike[str] | None = None,
    wrap: Sequence[str] = (),
) -> tuple[RunRequest, int | None]:
    """A run checked as :func:`launch` checks it, not started; and the GPU count."""
    preset, parsed, warnings = apply_values(preset, overrides or {})
    workdir = str(Path(cwd)) if cwd is not None else working_directory()
    device_count, backend_info, rooms = _open_device_count(simulate, sim_card)
    request = RunRequest(preset, parsed, warnings, workdir, backend_info, stop_grace_s, wrap, rooms)
    return request, device_count


def start_prepared(
    request: RunRequest,
    chosen: list[int],
    run_id: str,
    directory: Path,
    created: float,
    wait_started_s: float = 10.0,
    queued: dict[str, Any] | None = None,
) -> RunHandle:
    """Start a run prepared earlier (a queued one) on ``chosen`` in its own directory;
    ``queued`` (when it was submitted, how long it waited) goes into ``run.json``."""
    record_lost_runs()
    return _start(request, chosen, run_id, directory, created, wait_started_s, None, queued)


def _start(
    request: RunRequest,
    chosen: list[int],
    run_id: str,
    directory: Path,
    created: float,
    wait_started_s: float,
    resumed_from: dict[str, Any] | None,
    queued: dict[str, Any] | None = None,
) -> RunHandle:
    preset, parsed, warnings = request.preset, request.overrides, list(request.warnings)
    warnings += load_settings()[1]  # a bad [slowdown] value, named as the run starts
    backend_info, workdir, wrap = request.backend, request.cwd, request.wrap
    stop_grace_s = request.stop_grace_s
    for other, common in _sharing(chosen, backend_info):
        warnings.append(
            f"GPU {','.join(map(str, common))} is in use by run {other.id} too: the two runs "
            "share it, and each one's GPU energy is the GPU's (marked shared) unless the "
            "card tells the runs' processes apart"
        )
        for mine, theirs in ((directory, other.id), (other.run_dir, run_id)):
            try:
                rundir.note_shared_gpus(mine, theirs, common)
            except OSError:
                pass
    if wrap:
        (directory / "profile").mkdir(exist_ok=True)
    # ``wrap``: a program the run goes through (Nsight Systems); {run_dir} is this run's
    argv = [*(w.replace("{run_dir}", str(directory)) for w in wrap), *build_argv(preset, chosen)]
    env = build_env(
        preset, chosen, run_id, directory, has_driver=backend_info.get("kind") != "none"
    )
    wanted = preset.env.get("CUDA_VISIBLE_DEVICES")
    if wanted is not None and env.get("CUDA_VISIBLE_DEVICES") != wanted:
        where = "--env" if preset.origin == "command" else f"preset {preset.name!r} env"
        warnings.append(
            f"{where} CUDA_VISIBLE_DEVICES={wanted} is replaced by the run's GPUs "
            f"({env.get('CUDA_VISIBLE_DEVICES') or 'none'}); choose them with --gpus instead"
        )
    run = {
        "id": run_id,
        "created_at": created,
        # the run's own variables by name only: run.json is no place for a secret
        "preset": {**preset.to_dict(), "env": redact_env(preset.env)},
        "overrides": parsed,
        "argv": argv,
        "gpus": chosen,
        "env": recorded_env(preset, env),
        "cwd": workdir,
        "backend": backend_info,
        "stop_grace_s": stop_grace_s,
        "python": sys.executable,
        "user": privs.run_user(),
        "warnings": warnings,
    }
    if resumed_from:
        run["resumed_from"] = dict(resumed_from)
    else:
        run["forecast"] = _forecast(preset, chosen, request.rooms, backend_info)
    if queued:
        run["queue"] = dict(queued)
    sup_env = {**os.environ, **private_env(preset, env)}
    if backend_info.get("simulated"):
        sup_env["GPUSTATION_SIMULATE"] = str(backend_info.get("simulate", -1))
        if backend_info.get("sim_card"):
            sup_env["GPUSTATION_SIM_CARD"] = str(backend_info["sim_card"])
    else:
        sup_env.pop("GPUSTATION_SIMULATE", None)
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
    return start_run(handle, run, sup_env, wait_started_s)


def _forecast(
    preset: RunPreset,
    chosen: list[int],
    rooms: list[GpuRoom] | None,
    backend_info: dict[str, Any],
) -> dict[str, Any] | None:
    """The run's forecast as run.json keeps it (``runs show`` sets it beside what
    happened); None when it cannot be made: a forecast never stops a launch."""
    # start-up time: the run store (sqlite3), read for the preset's history
    from gpustation.runs.forecast.make import forecast_for

    simulated = bool(backend_info.get("simulated"))
    try:
        if rooms is None and chosen:
            rooms = _rooms_now(chosen, backend_info)
        price = price_or_none(lambda _problem: None)  # said by the views that show costs
        fc = forecast_for(preset, chosen, rooms or [], simulated=simulated, price=price)
    except Exception:
        return None
    return fc.to_dict()


def _rooms_now(chosen: list[int], backend_info: dict[str, Any]) -> list[GpuRoom]:
    """The chosen GPUs' room read now (a queued run's, as it starts)."""
    if backend_info.get("kind") == "none":
        return []
    simulate = int(backend_info.get("simulate", -1)) if backend_info.get("simulated") else None
    with open_backend(simulate=simulate, sim_card=backend_info.get("sim_card")) as backend:
        return read_rooms(backend, chosen)


def new_run_directory(name: str, created: float) -> tuple[str, Path]:
    """A fresh id and its (new, empty) run directory under the data dir."""
    runs_root = paths.runs_dir()
    private.make_dir(runs_root)
    private.tighten(runs_root)  # the runs an older version left open go private with it
    while True:
        run_id = new_run_id(name, created)
        directory = runs_root / run_id
        try:
            directory.mkdir(mode=private.DIR_MODE)
            return run_id, directory
        except FileExistsError:
            continue


def _not_started(directory: Path, run_id: str, err: OSError) -> GpustationError:
    """The run recorded failed, and the error saying why its supervisor could not start."""

    user = privs.invoking_user()
    who = f" as {user.name} (uid {user.uid})" if user is not None else ""
    message = f"cannot start the run's supervisor{who}: {sys.executable}: {err.strerror or err}"
    if user is not None and isinstance(err, PermissionError):
        # under sudo the run is the user's: so must the interpreter be
        message += (
            f"; {user.name} must be able to run this Python: install gpustation where "
            "they can (their own virtual environment, or a system-wide one)"
        )
    mark_ended(directory, RunState(id=run_id, status="starting"), "failed", message)
    return GpustationError(message)


def supervisor_argv(directory: Path) -> list[str]:
    """``python -P -m gpustation.runs.launch.supervisor DIR``."""
    return python_argv("-m", "gpustation.runs.launch.supervisor", str(directory))


def start_run(
    handle: RunHandle, run: dict[str, Any], sup_env: dict[str, str], wait_started_s: float
) -> RunHandle:
    """Write ``run.json``, the first state and the history row; start the supervisor.

    Returns ``handle`` once the supervisor has started the child (or the run
    has already ended), its ``warnings`` extended with anything worth saying.
    """
    directory, run_id, warnings = handle.run_dir, handle.id, handle.warnings
    rundir.write_json(directory / rundir.RUN_JSON, run)
    rundir.write_state(directory, RunState(id=run_id, status="starting"))
    # start-up time: the run store (sqlite3)
    from gpustation.runs.store.index import RunStore, sync_run

    try:
        # A short wait: a run must start even while another process holds the
        # index; its row is written by the supervisor, or the next writer.
        store = RunStore(write_wait_s=2.0)
        sync_run(directory, store)
        store.catch_up()
    except Exception as err:
        warnings.append(
            f"the run history ({store.db}) cannot be written now ({err}); "
            "the run is recorded once it can be"
        )

    try:
        with open(directory / rundir.SUPERVISOR_LOG, "ab", opener=private.opener) as log:
            # The supervisor, and the run under it, are the invoking user's under sudo.
            proc = subprocess.Popen(
                supervisor_argv(directory),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                env=sup_env,
                cwd=str(directory),
                **privs.child_kwargs(),
            )
    except OSError as err:
        raise _not_started(directory, run_id, err) from None
    # Reap the supervisor when it ends, so a long-lived UI keeps no zombies.
    threading.Thread(target=proc.wait, name=f"reap-{run_id}", daemon=True).start()

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
