"""The exporter's per-container series: a GPU's processes summed per container.

Per container, systemd unit or Slurm job (``telemetry/containers.py``), never
per PID: a PID label would make a new series for every process ever started.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import GaugeMetricFamily, Metric

from gpustation.telemetry.model import GpuSample, ProcessInfo
from gpustation.telemetry.promnames import (
    CONTAINER_MEMORY,
    CONTAINER_POWER,
    CONTAINER_PROCESSES,
)

#: the ``container`` label of processes in no container, systemd unit or Slurm job
NO_CONTAINER = "-"


def container_metrics(
    live: list[GpuSample], labels_of: Callable[[GpuSample], list[str]]
) -> list[Metric]:
    """Each GPU's processes summed per container: the GPU's labels
    (``labels_of`` gives their values) and ``container``."""
    power, memory, count = (
        GaugeMetricFamily(series.name, series.help, labels=series.labels)
        for series in (CONTAINER_POWER, CONTAINER_MEMORY, CONTAINER_PROCESSES)
    )
    for gpu in live:
        groups: dict[str, list[ProcessInfo]] = {}
        for proc in gpu.processes:
            groups.setdefault(proc.container or NO_CONTAINER, []).append(proc)
        for name, procs in sorted(groups.items()):
            values = (*labels_of(gpu), name)
            count.add_metric(values, float(len(procs)))
            watts = [p.power_w for p in procs]
            if all(w is not None for w in watts):
                power.add_metric(values, sum(w or 0.0 for w in watts))
            mib = [p.gpu_memory_mib for p in procs]
            if all(m is not None for m in mib):
                memory.add_metric(values, sum(m or 0.0 for m in mib))
    return [fam for fam in (power, memory, count) if fam.samples]
