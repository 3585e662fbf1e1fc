"""The GPU health rules, in one place: what counts as hot, held back or slow.

The snapshot table, the dashboard's cards, the runs screen, the fleet view and
the alert rules all judge a GPU by these functions, so they never disagree
(one screen calling a link slow while another does not). Renderers map the
verdicts to their own colours; the thresholds live here.
"""

from __future__ import annotations

from gpustation.telemetry.model import LIMITING_REASONS, GpuSample

#: within this many degrees of the slowdown temperature: critical (also an alert)
CRITICAL_MARGIN_C = 5.0
#: within this many: hot
HOT_MARGIN_C = 15.0
#: within this many: warm; further away: cool
WARM_MARGIN_C = 30.0
#: VRAM use above this share of the total is "almost full"
VRAM_FULL_PCT = 95.0
#: a PCIe link below its maximum only matters when the GPU is busy (idle cards
#: drop to a lower generation on purpose, to save power)
PCIE_BUSY_UTIL_PCT = 20.0
#: VRAM no listed process holds is worth a line from this much, or from this
#: share of the card's total where that is more. NVML's v2 memory info leaves
#: the driver's reservation out of "used", but the v1 fallback counts it (a few
#: hundred MiB, more on bigger cards), and consumer drivers keep some memory of
#: their own outside every process's share: an idle card must not warn.
UNOWNED_NOTE_MIB = 1024.0
UNOWNED_NOTE_SHARE = 0.01

#: the memory (HBM) bands, by the distance to the memory's own maximum: its
#: ceiling is near its working range, so the bands are narrower
MEMORY_CRITICAL_MARGIN_C = 5.0
MEMORY_HOT_MARGIN_C = 10.0
MEMORY_WARM_MARGIN_C = 25.0

CRITICAL = "critical"
HOT = "hot"
WARM = "warm"
COOL = "cool"


def temperature_band(gpu: GpuSample) -> str | None:
    """``critical``, ``hot``, ``warm`` or ``cool`` by the distance to the card's
    slowdown temperature; None when either is unknown."""
    margin = gpu.slowdown_margin_c
    if margin is None:
        return None
    if margin <= CRITICAL_MARGIN_C:
        return CRITICAL
    if margin <= HOT_MARGIN_C:
        return HOT
    if margin <= WARM_MARGIN_C:
        return WARM
    return COOL


def memory_temperature_band(gpu: GpuSample) -> str | None:
    """The memory temperature's band by its distance to the memory maximum;
    None where the card reports no memory temperature (GDDR) or no maximum."""
    margin = gpu.memory_temperature_margin_c
    if margin is None:
        return None
    if margin <= MEMORY_CRITICAL_MARGIN_C:
        return CRITICAL
    if margin <= MEMORY_HOT_MARGIN_C:
        return HOT
    if margin <= MEMORY_WARM_MARGIN_C:
        return WARM
    return COOL


def memory_near_max(gpu: GpuSample) -> bool:
    return memory_temperature_band(gpu) == CRITICAL


def near_slowdown(gpu: GpuSample) -> bool:
    return temperature_band(gpu) == CRITICAL


def limiting_reasons(gpu: GpuSample) -> list[str]:
    """The throttle reasons that hold the card back (idle and the like are benign)."""
    return [r for r in gpu.throttle_reasons or () if r in LIMITING_REASONS]


def is_limited(gpu: GpuSample) -> bool:
    return bool(limiting_reasons(gpu))


def slow_link_under_load(gpu: GpuSample) -> bool:
    """The PCIe link runs below its maximum while the GPU is busy."""
    util = gpu.utilization_gpu_pct
    return gpu.pcie.below_max and util is not None and util > PCIE_BUSY_UTIL_PCT


def vram_full(gpu: GpuSample) -> bool:
    pct = gpu.memory_pct
    return pct is not None and pct > VRAM_FULL_PCT


def unowned_worth_noting(gpu: GpuSample) -> bool:
    """Enough VRAM is held by no listed process to name it (a leak, another
    container's context, a process stuck while exiting)."""
    unowned = gpu.unowned_memory_mib
    if unowned is None:
        return False
    share = UNOWNED_NOTE_SHARE * (gpu.memory_total_mib or 0.0)
    return unowned >= max(UNOWNED_NOTE_MIB, share)


def short_name(name: str | None) -> str:
    """``NVIDIA GeForce RTX 4090 (simulated)`` -> ``RTX 4090 (sim)``."""
    if not name:
        return "unknown GPU"
    for word in ("NVIDIA ", "GeForce ", "Tesla "):
        name = name.replace(word, "")
    return name.replace("(simulated)", "(sim)")
