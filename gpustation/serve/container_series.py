"""The exporter's per-container series: a GPU's processes summed per container.

Per container, systemd unit or Slurm job (``telemetry/containers.py``), never
per PID: a PID label would make a new series for every process ever started.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import GaugeMetricFamily, Metric

from gpustation.telemetry.model import GpuSample, ProcessInfo

#: the ``container`` label of processes in no container, systemd unit or Slurm job
NO_CONTAINER = "-"


def container_metrics(
    live: list[GpuSample], gpu_labels: tuple[str, ...], labels_of: Callable[[GpuSample], list[str]]
) -> list[Metric]:
    """Each GPU's processes summed per container: the GPU's labels
    (``labels_of`` gives their values) and ``container``."""
    labels = (*gpu_labels, "container")
    power = GaugeMetricFamily(
        "gpustation_container_power_watts",
        "Estimated power of a container's processes on the GPU, from their SM shares (W).",
        labels=labels,
    )
    memory = GaugeMetricFamily(
        "gpustation_container_memory_used_mib",
        "VRAM held by a container's processes on the GPU (MiB).",
        labels=labels,
    )
    count = GaugeMetricFamily(
        "gpustation_container_processes", "A container's processes on the GPU.", labels=labels
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
