"""Why a run slowed down, from the evidence before and during the drop. Pure logic.

:func:`name_cause` tries each rule in turn and takes the first whose
evidence holds, in this order: a phase the runner reported (checkpoint,
eval, save ...); a throttle reason present in the drop and absent before it
(power cap, thermal, hardware slowdown: named after the rules below when the SM
clock fell by much less than the throughput, as another process pushing the card to
its power limit makes it); another gpustation run on the GPU;
another process with a real share of the SMs; a PCIe link below its
maximum; SM clocks held below their maximum with no reason given; memory
temperature near its maximum; swapping; the input pipeline starving the GPU
(utilisation fell while the run's loader processes are each near a whole
core); the host's CPU saturated. A rule that needs the time before the drop
to compare with says nothing without it. When no rule holds the cause is
``unknown``, with the figures that were looked at: never a guess presented as
a finding. Each cause carries the figures that show it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpustation.runs.slowdown import gpu_rules, run_rules
from gpustation.runs.slowdown.clues import (
    Cause,
    Clues,
    GpuClues,
    gpu_clues,
    mean_of,
    num,
    rounded,
    where_on,
)
from gpustation.telemetry import format as fmt
from gpustation.telemetry.model import LIMITING_REASONS

#: the rules, in the order they are tried
RULES: tuple[Callable[[Clues, list[GpuClues]], Cause | None], ...] = (
    run_rules.phase,
    gpu_rules.throttle,
    gpu_rules.other_run,
    gpu_rules.process,
    gpu_rules.pcie,
    gpu_rules.clocks,
    gpu_rules.memory_temperature,
    run_rules.swap,
    run_rules.input_pipeline,
    run_rules.host_cpu,
)


def _unknown(clues: Clues, gpus: list[GpuClues]) -> Cause:
    """No rule holds: say so, with the figures that were looked at."""
    parts = []
    evidence: dict[str, Any] = {}
    for gpu in gpus:
        where = where_on(gpu, len(gpus) > 1)
        reasons = sorted({r for g in gpu.during for r in g.throttle if r in LIMITING_REASONS})
        parts.append(
            f"{where}{gpu.clock_text()}, utilisation {num(gpu.mean('utilization_pct'), ' %')}, "
            f"throttle {fmt.throttle(reasons)}"
        )
        evidence[f"gpu{gpu.index}"] = {
            "clock_sm_mhz": rounded(gpu.mean("clock_sm_mhz"), 0),
            "utilization_pct": rounded(gpu.mean("utilization_pct")),
            "utilization_pct_before": rounded(gpu.mean("utilization_pct", during=False)),
            "throttle": reasons,
        }
    cpu = mean_of(m.host.cpu_pct for m in clues.during)
    was = mean_of(m.host.cpu_pct for m in clues.before)
    parts.append(f"host CPU {num(cpu, ' %')} (was {num(was, ' %')})")
    evidence["cpu_pct"], evidence["cpu_pct_before"] = rounded(cpu), rounded(was)
    for key in ("run_on_cpu_pct", "swap_in_mib_s", "swap_out_mib_s"):
        evidence[key] = rounded(mean_of(getattr(m.host, key) for m in clues.during))
    # each of the run's processes' CPU (% of a core), for whoever looks into it
    evidence["run_cpu_pct"] = {
        str(pid): rounded(pct) for pid, pct in run_rules.process_cpu(clues.during).items()
    }
    detail = "no reading explains it (" + "; ".join(parts) + ")"
    return Cause("unknown", "unknown", detail, evidence)


def name_cause(clues: Clues) -> Cause:
    """The first rule whose evidence holds (one that explains only part of the drop
    when no later one holds), else ``unknown``."""
    gpus = gpu_clues(clues)
    partial: Cause | None = None
    for rule in RULES:
        found = rule(clues, gpus)
        if found is not None and not found.partial:
            return found
        partial = partial or found
    return partial or _unknown(clues, gpus)
