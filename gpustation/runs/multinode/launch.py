"""Multi-node runs: one preset on several hosts through torchrun's c10d rendezvous.

``gpustation run PRESET --hosts box1,box2`` starts, on every host over ssh,
``torchrun --nnodes=2 --nproc-per-node=N --rdzv-backend=c10d
--rdzv-endpoint=<box1>:<port> --rdzv-id=<run id> -m gpustation.runners.<runner>``.
The first host holds the rendezvous store (``--rdzv-conf is_host=1``; the
others ``is_host=0``), at the address ssh resolves for it (``ssh -G``), so an
ssh config alias works as a host. It is one run of the local history: one run
directory, one supervisor, one ``runs stop``.

Design: the supervisor's child is the coordinator (``coordinator.py``), which
keeps one ssh connection per node open for the whole run. On the node runs
``<remote python> -m gpustation.runs.multinode.node_agent`` (``node_agent.py``), which
starts torchrun and sends back, on that one connection, everything the run
directory needs: the node's log lines, the metrics rank 0 writes (wherever
rank 0 lands), the node's GPU telemetry and torchrun's exit status. The
connection's stdin carries the stop. Why this way: it needs nothing on the
nodes but the same gpustation and a Python with torch (no shared filesystem,
no remote run directory to copy back, no second connection to find pids), the
metrics and logs reach the local run directory as they are written (the runs
screen, ``runs show`` and the follower read them unchanged), and a node whose
connection drops stops itself, so no node outlives its run.

The run directory gains ``nodes/<host>/output.log`` (the node's own log),
``nodes/<host>/telemetry.jsonl`` (its GPUs) and ``nodes.json`` (each node's
status, exit, remote pid and process group); ``output.log`` holds every
node's lines prefixed ``[host]``, and ``metrics.jsonl`` rank 0's metrics.
A node that fails ends the run as failed, naming the node (``node box2
exited 1``); the other nodes are stopped. So does a node whose agent has
not started torchrun within ``--node-start-timeout`` (60 s) of its ssh
starting: a host that accepts ssh and never answers ends the run, not
hangs it. A node's energy comes from its own GPUs read on the node; a node
whose GPUs cannot be read has its energy marked unknown, and so does the
run's total.

The working directory on each node: ``--node-dir DIR`` (a node without it
fails before torchrun starts, naming the directory), else the directory
``gpustation run`` was started in when the node has it (a shared or mirrored
filesystem: relative paths in the preset's arguments mean the same files),
else the remote user's home, said in the node's log. torchrun and the
workers run there; ``nodes.json`` records each node's.

The remote Python: ``--remote-python``, else ``GPUSTATION_REMOTE_PYTHON``,
else ``[fleet] remote_python`` in config.toml, else ``python3``. It is a
command line run by the remote user's shell (``/opt/venv/bin/python``,
``env PYTHONPATH=/src /usr/bin/python3``) and must import gpustation and torch.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpustation import privs
from gpustation.errors import UsageError
from gpustation.fleet.ssh import HostSpec, parse_host, ssh_options
from gpustation.pyargv import bootstrap_args, python_argv, safe_path_env
from gpustation.redact import redact_env
from gpustation.runs.argvalue import RUNNER_PACKAGE, ArgValue
from gpustation.runs.launch.argv import format_args, private_env, recorded_env
from gpustation.runs.launch.start import RunHandle, new_run_directory, start_run, working_directory
from gpustation.runs.launch.stop import DEFAULT_GRACE_S
from gpustation.runs.metrics import RUN_ID_ENV
from gpustation.runs.multinode.nodes import DEFAULT_START_TIMEOUT_S, node_dir
from gpustation.runs.presets import RunPreset, apply_values
from gpustation.runs.store.reconcile import record_lost_runs

DEFAULT_RDZV_PORT = 29400
DEFAULT_REMOTE_PYTHON = "python3"
REMOTE_PYTHON_ENV = "GPUSTATION_REMOTE_PYTHON"
AGENT_MODULE = "gpustation.runs.multinode.node_agent"
MAX_NPROC = 1024


def parse_hosts(text: str | None) -> list[HostSpec]:
    """``box1,alice@box2:2222`` -> host specs; UsageError naming what is wrong."""
    words = [w.strip() for w in (text or "").split(",")]
    if not any(words):
        raise UsageError(
            "--hosts: no host given; expected a comma-separated list such as box1,box2 "
            "([USER@]HOST[:PORT] or ssh config aliases)"
        )
    if "" in words:
        raise UsageError(f"--hosts {text!r}: an empty host between commas")
    specs = []
    for word in words:
        try:
            specs.append(parse_host(word))
        except UsageError as err:
            raise UsageError(err.worded("--hosts")) from None
    seen: set[str] = set()
    for spec in specs:
        if spec.text in seen:
            raise UsageError(
                f"--hosts: {spec.text!r} is given twice; two nodes on one host need two "
                "names (ssh config aliases)"
            )
        seen.add(spec.text)
    return specs


def resolve_remote_python(option: str | None, configured: str | None = None) -> str:
    """The node side's Python command line (see the module); UsageError when not one."""
    value = option
    if value is None:
        value = os.environ.get(REMOTE_PYTHON_ENV) or configured or DEFAULT_REMOTE_PYTHON
    try:
        words = shlex.split(value)
    except ValueError as err:
        raise UsageError(f"--remote-python {value!r}: not a command line ({err})") from None
    if not words:
        raise UsageError(
            "--remote-python: empty; give the nodes' Python, e.g. /opt/venv/bin/python"
        )
    return value


def endpoint_host(spec: HostSpec, ssh_config: str | None = None) -> str:
    """The address the other nodes reach ``spec`` at: what ssh resolves it to (``ssh -G``)."""
    ssh_config = ssh_config or os.environ.get("GPUSTATION_SSH_CONFIG") or None
    argv = ["ssh", *(["-F", ssh_config] if ssh_config else []), "-G", "--", spec.destination]
    try:
        out: subprocess.CompletedProcess[str] = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
            **privs.child_kwargs(),  # the user's ssh config, not root's
        )
    except (OSError, subprocess.TimeoutExpired):
        return spec.host
    for line in out.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key.lower() == "hostname" and value.strip():
            return value.strip()
    return spec.host


def _endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def node_argv(
    preset: RunPreset, nnodes: int, nproc: int, endpoint: str, rdzv_id: str, is_host: bool
) -> list[str]:
    """torchrun's arguments on one node (after ``python -m torch.distributed.run``)."""
    argv = [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
        f"--rdzv-conf=is_host={1 if is_host else 0}",
        "--max-restarts=0",
    ]
    args = format_args(preset.args)
    if preset.command is not None:
        return [*argv, "--no-python", *preset.command, *args]
    return [*argv, "-m", f"{RUNNER_PACKAGE}.{preset.runner}", *args]


def agent_command(remote_python: str) -> str:
    """The node agent's command line, run by the remote user's shell: the user's
    Python, then fixed words; its home directory is not on its path (the node's
    Python may predate -P: the bootstrap works on every version)."""
    return f"{remote_python} " + shlex.join(bootstrap_args(["-m", AGENT_MODULE]))


def node_gpus(preset: RunPreset, gpus: Sequence[int] | None) -> list[int] | None:
    """The GPUs each node gives the run (None: all of the node's)."""
    if gpus is not None:
        return list(gpus)
    if isinstance(preset.gpus, list):
        return list(preset.gpus)
    if isinstance(preset.gpus, int) and preset.gpus > 0:
        return list(range(preset.gpus))
    return None


def node_env(preset: RunPreset, run_id: str, gpus: list[int] | None) -> dict[str, str]:
    """The variables set for torchrun on every node (the node adds the metrics file)."""
    env = dict(preset.env)
    env[RUN_ID_ENV] = run_id
    env["PYTHONUNBUFFERED"] = "1"
    if preset.command is None:
        safe_path_env(env)  # torchrun's workers import gpustation's runner
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return env


@dataclass(frozen=True)
class NodeOptions:
    """What ``gpustation run --hosts`` was told, beyond the preset."""

    hosts: list[HostSpec]
    nproc_per_node: int | None = None
    gpus: list[int] | None = None
    rdzv_port: int = DEFAULT_RDZV_PORT
    remote_python: str = DEFAULT_REMOTE_PYTHON
    ssh_config: str | None = None
    stop_grace_s: float = DEFAULT_GRACE_S
    #: the nodes' working directory (None: this one where a node has it, else home)
    node_dir: str | None = None
    #: a node whose agent has not started torchrun this long after ssh fails the run
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S


def launch_multinode(
    preset: RunPreset,
    overrides: Mapping[str, ArgValue],
    options: NodeOptions,
    wait_started_s: float = 10.0,
) -> RunHandle:
    """Start ``preset`` on every host of ``options``; return once the coordinator runs."""
    if not options.hosts:
        raise UsageError("--hosts: no host given")
    if preset.runner is None and preset.command is None:
        raise UsageError(f"preset {preset.name!r} has neither a runner nor a command")
    if options.nproc_per_node is not None and not 1 <= options.nproc_per_node <= MAX_NPROC:
        raise UsageError(
            f"--nproc-per-node: between 1 and {MAX_NPROC} processes, got {options.nproc_per_node}"
        )
    if not 1 <= options.rdzv_port <= 65535:
        raise UsageError(f"--rdzv-port: a port 1-65535, got {options.rdzv_port}")
    preset, parsed, warnings = apply_values(preset, overrides)
    ignored = [
        k for k in ("nnodes", "node_rank", "rdzv_endpoint", "master_addr") if getattr(preset, k)
    ]
    if ignored:
        warnings.append(
            f"preset {preset.name!r} sets {', '.join(ignored)}; --hosts decides them for this run"
        )
    # --nproc-per-node without --gpus: every GPU of the node, not the preset's few.
    gpus = node_gpus(preset, options.gpus) if options.nproc_per_node is None else options.gpus
    nproc = options.nproc_per_node or preset.nproc_per_node or (len(gpus) if gpus else 1)
    here = options.node_dir or working_directory()
    record_lost_runs()
    created = time.time()
    run_id, directory = new_run_directory(preset.name, created)
    first = endpoint_host(options.hosts[0], options.ssh_config)
    endpoint = _endpoint(first, options.rdzv_port)
    env = node_env(preset, run_id, gpus)
    nodes = []
    for i, spec in enumerate(options.hosts):
        ssh = [
            *ssh_options(spec, options.ssh_config),
            "--",
            spec.destination,
            agent_command(options.remote_python),
        ]
        nodes.append(
            {
                "host": spec.text,
                "ssh": ssh,
                "spec": {
                    "argv": node_argv(preset, len(options.hosts), nproc, endpoint, run_id, i == 0),
                    # the preset's values reach the coordinator privately (child_env)
                    "env": recorded_env(preset, env),
                    "grace_s": options.stop_grace_s,
                    "cwd": here,
                    "cwd_required": options.node_dir is not None,
                },
            }
        )
    argv = python_argv("-m", "gpustation.runs.multinode.coordinator", str(directory))
    run: dict[str, Any] = {
        "id": run_id,
        "created_at": created,
        "preset": {**preset.to_dict(), "env": redact_env(preset.env)},
        "overrides": parsed,
        "argv": argv,
        "gpus": [],
        # the preset's variables by name: the coordinator is given their values
        "env": {**redact_env(preset.env), RUN_ID_ENV: run_id, "PYTHONUNBUFFERED": "1"},
        "cwd": str(directory),
        "backend": {"kind": "nodes", "simulated": False},
        "stop_grace_s": options.stop_grace_s,
        "python": sys.executable,
        "user": privs.run_user(),
        "warnings": warnings,
        "multinode": {
            "hosts": [spec.text for spec in options.hosts],
            "nproc_per_node": nproc,
            "gpus_per_node": gpus,
            "rdzv_endpoint": endpoint,
            "rdzv_id": run_id,
            "remote_python": options.remote_python,
            "node_dir": options.node_dir,
            "start_timeout_s": options.start_timeout_s,
            "nodes": nodes,
        },
    }
    for spec in options.hosts:
        node_dir(directory, spec.text).mkdir(parents=True, exist_ok=True)
    handle = RunHandle(
        id=run_id,
        run_dir=directory,
        preset=preset.name,
        title=preset.display_title,
        gpus=[],
        argv=argv,
        created_at=created,
        warnings=warnings,
    )
    sup_env = {**os.environ, **private_env(preset, preset.env)}
    sup_env.pop("GPUSTATION_SIMULATE", None)
    return start_run(handle, run, sup_env, wait_started_s)
