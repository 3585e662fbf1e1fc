"""The files a multi-node run adds to its run directory, and reading them.

``nodes.json`` (written by the coordinator as the nodes start and end; a
node still ``starting`` after the start deadline is marked failed):
``hosts``, ``reason`` (why the run failed, naming the node that failed
first: ``node box2 exited 1``) and ``nodes``, one object per node with
``host``, ``status`` (starting, running, succeeded, failed, stopped),
``exit_code``, ``signal``, ``error``, ``remote_pid`` and ``remote_pgid``
(torchrun's on the node), ``hostname`` (what the node calls itself),
``telemetry_off`` (why its GPUs could not be read), ``kept`` (a directory
the run left files in on the node) and ``cwd`` (the directory torchrun ran in
there). ``nodes/<host>/output.log`` is the node's
own log, ``nodes/<host>/telemetry.jsonl`` its GPUs (``gputrace.py``'s lines).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpustation.runs import rundir
from gpustation.runs.gputrace import TelemetrySummary, summarize_telemetry

NODES_DIR = "nodes"
NODES_JSON = "nodes.json"
NODE_TELEMETRY = "telemetry.jsonl"
#: how long a node's agent may take to start torchrun after its ssh is started
DEFAULT_START_TIMEOUT_S = 60.0


def node_dir(directory: Path, host: str) -> Path:
    return directory / NODES_DIR / host


def read_nodes(directory: Path) -> dict[str, Any] | None:
    """``nodes.json``: each node's status (None: not a multi-node run, or not started)."""
    return rundir.read_json(directory / NODES_JSON)


def failure_reason(directory: Path) -> str | None:
    """Why the run failed, naming the node that failed first (``node box2 exited 1``)."""
    nodes = read_nodes(directory)
    reason = nodes.get("reason") if nodes else None
    return reason if isinstance(reason, str) and reason else None


@dataclass
class NodeEnergy:
    host: str
    status: str
    telemetry: TelemetrySummary
    #: why the node's energy is unknown (None when it is known)
    unknown: str | None
    #: the node's entry in ``nodes.json`` (its exit, signal, remote pid ...)
    entry: dict[str, Any]


def nodes_energy(directory: Path) -> list[NodeEnergy]:
    """Each node's GPU energy from ``nodes/<host>/telemetry.jsonl``; [] for other runs."""
    nodes = read_nodes(directory)
    if not nodes:
        return []
    found = []
    for node in nodes.get("nodes") or []:
        if not isinstance(node, dict) or not isinstance(node.get("host"), str):
            continue
        host = node["host"]
        tele = summarize_telemetry(node_dir(directory, host) / NODE_TELEMETRY)
        unknown = None
        if tele.energy_j is None:
            unknown = str(node.get("telemetry_off") or "the node sent no GPU readings")
        found.append(NodeEnergy(host, str(node.get("status") or "?"), tele, unknown, node))
    return found


def total_energy(energies: list[NodeEnergy]) -> float | None:
    """The run's GPU energy: every node's, or None when one node's is unknown."""
    if not energies or any(e.telemetry.energy_j is None for e in energies):
        return None
    return sum(float(e.telemetry.energy_j or 0.0) for e in energies)


def combined_telemetry(energies: list[NodeEnergy]) -> TelemetrySummary:
    """The run's GPUs over every node: energy and mean power summed (None when one
    node's is unknown), peaks the highest of any node, throttled time summed."""
    combined = TelemetrySummary()
    summaries = [e.telemetry for e in energies]
    combined.samples = sum(s.samples for s in summaries)
    combined.duration_s = max((s.duration_s for s in summaries), default=0.0)
    combined.energy_j = total_energy(energies)
    if summaries and all(s.avg_power_w is not None for s in summaries):
        combined.avg_power_w = sum(float(s.avg_power_w or 0.0) for s in summaries)
    for name in ("peak_power_w", "peak_temp_c", "peak_memory_temp_c", "peak_vram_mib"):
        values = [getattr(s, name) for s in summaries if getattr(s, name) is not None]
        setattr(combined, name, max(values) if values else None)
    throttled = [s.throttled_s for s in summaries if s.throttled_s is not None]
    combined.throttled_s = sum(throttled) if throttled else None
    combined.split = any(s.split for s in summaries)
    combined.estimated = any(s.estimated for s in summaries)
    return combined
