"""A preset's argv and environment: flags, launcher wrappers, GPU choice.

:func:`build_argv` turns a resolved preset into the child's argv (python,
torchrun or accelerate, never a shell); :func:`resolve_gpus` picks its GPUs;
:func:`build_env` the variables gpustation sets for it. Pure functions: no
process is started and no file is written here.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpustation.errors import UsageError
from gpustation.pyargv import python_argv, safe_path_env
from gpustation.redact import REDACTED, redact_env
from gpustation.runs import rundir
from gpustation.runs.argvalue import RUNNER_PACKAGE, ArgValue
from gpustation.runs.metrics import METRICS_ENV, RUN_DIR_ENV, RUN_ID_ENV
from gpustation.runs.presets import RunPreset

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
    # Every Python gpustation starts itself leaves the working directory off sys.path.
    if preset.command is not None:
        target = [*preset.command, *args]
        module = False
    else:
        target = [f"{RUNNER_PACKAGE}.{preset.runner}", *args]
        module = True
    if preset.launcher == "python":
        return python_argv("-m", *target, python=python) if module else target
    nproc = str(nproc_for(preset, gpus))
    if preset.launcher == "torchrun":
        argv = python_argv("-m", "torch.distributed.run", "--nproc_per_node", nproc, python=python)
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
        argv = python_argv(
            "-m", "accelerate.commands.launch", "--num_processes", nproc, python=python
        )
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
    if preset.command is None:
        # gpustation's runner, and the workers torchrun or accelerate start for it
        safe_path_env(env)
    if has_driver:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpus)
        # NVML numbers GPUs by PCI bus; CUDA's default order may differ.
        if "CUDA_DEVICE_ORDER" not in base and "CUDA_DEVICE_ORDER" not in preset.env:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


#: the values of a run's own variables (its preset's ``[env]``, ``--env``), handed
#: to its supervisor in its environment, which only the user can read, so that
#: ``run.json`` keeps their names and never their values
PRIVATE_ENV = "GPUSTATION_RUN_PRIVATE_ENV"


def recorded_env(preset: RunPreset, env: dict[str, str]) -> dict[str, str]:
    """``env`` as ``run.json`` keeps it: the preset's variables' values redacted."""
    own = [k for k, v in env.items() if preset.env.get(k) != v]
    return redact_env(env, keep=own)


def private_env(preset: RunPreset, env: dict[str, str]) -> dict[str, str]:
    """The variable that carries the values :func:`recorded_env` leaves out."""
    return {PRIVATE_ENV: json.dumps({k: v for k, v in env.items() if preset.env.get(k) == v})}


def child_env(base: dict[str, str], recorded: dict[str, str]) -> dict[str, str]:
    """The child's environment: ``base`` (the supervisor's, which holds
    :data:`PRIVATE_ENV`) with ``run.json``'s variables and the private values;
    a redacted variable whose value did not come is left out, never ``***``."""
    env = dict(base)
    try:
        values = json.loads(env.pop(PRIVATE_ENV, "") or "{}")
    except ValueError:
        values = {}
    if not isinstance(values, dict):
        values = {}
    for key, value in recorded.items():
        if key in values and isinstance(values[key], str):
            env[key] = values[key]
        elif value != REDACTED:
            env[key] = value
    return env
