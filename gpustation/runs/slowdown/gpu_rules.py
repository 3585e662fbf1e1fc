"""The rules a slowdown's cause is found by in what the run's GPUs show.

A throttle reason present in the drop and absent before it, another
gpustation run on the GPU, another process with a real share of its SMs, a
PCIe link below its maximum, SM clocks held below their maximum with no
reason given, memory near its maximum temperature. Each returns a
:class:`~gpustation.runs.slowdown.clues.Cause` with the figures that show it,
or None when its evidence does not hold (or cannot be compared: no time
before the drop). Pure logic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from gpustation.runs.slowdown.clues import (
    KIND_LABELS,
    Cause,
    Clues,
    GpuClues,
    has_reason,
    num,
    rounded,
    share_of,
    where_on,
)
from gpustation.runs.slowdown.evidence import GpuEvidence
from gpustation.telemetry import format as fmt
from gpustation.telemetry.model import LIMITING_REASONS, POWER_REASONS, THERMAL_REASONS

#: a reason explains the drop when present in at least this share of its seconds ...
REASON_DURING = 0.5
#: ... and in at most this share of the seconds before it ...
REASON_BEFORE = 0.25
#: ... and the SM clock fell by at least this part of the throughput lost: a cap that
#: took 10 % off the clocks does not explain a run at half speed (another process
#: pushing the card to its power limit does), so a later rule is looked for first
CLOCK_SHARE_OF_LOSS = 0.5
#: the least share of the SMs (%) another process must take to explain a drop
PROCESS_MIN_SM_PCT = 10.0
#: SM clocks are held back below this share of their maximum ...
CLOCK_BELOW = 0.9
#: ... having fallen by at least this share of it
CLOCK_FALL = 0.1
#: a GPU busier than this (%) runs at its clocks unless held back (an idle one lowers them)
BUSY_UTIL_PCT = 30.0
#: memory within this many degrees of its maximum is near it
MEMORY_MARGIN_C = 5.0


def throttle(clues: Clues, gpus: list[GpuClues]) -> Cause | None:
    """A limiting throttle reason in most of the drop's seconds and few of those before."""
    found: tuple[float, str, GpuClues] | None = None
    for gpu in gpus:
        if not gpu.before:
            continue
        for reason in sorted(LIMITING_REASONS):
            during, before = (
                share_of(gpu.during, has_reason(reason)),
                share_of(gpu.before, has_reason(reason)),
            )
            held = during >= REASON_DURING and before <= REASON_BEFORE
            if held and (found is None or during > found[0]):
                found = (during, reason, gpu)
    if found is None:
        return None
    share, reason, gpu = found
    where = where_on(gpu, len(gpus) > 1)
    clock, was = gpu.mean("clock_sm_mhz"), gpu.mean("clock_sm_mhz", during=False)
    fell = 100.0 * (was - clock) / was if clock is not None and was else None
    partial = fell is not None and clues.lost_pct is not None
    partial = partial and (fell or 0.0) < CLOCK_SHARE_OF_LOSS * (clues.lost_pct or 0.0)
    evidence = {
        "gpu": gpu.index,
        "reason": reason,
        "share_of_drop": round(share, 2),
        "power_w": rounded(gpu.mean("power_w")),
        "power_limit_w": rounded(gpu.last("power_limit_w")),
        "clock_sm_mhz": rounded(clock, 0),
        "clock_sm_mhz_before": rounded(was, 0),
        "clock_sm_max_mhz": rounded(gpu.last("clock_sm_max_mhz"), 0),
        "temperature_c": rounded(gpu.mean("temperature_c")),
    }
    clocks = f"{gpu.clock_text()} (was {num(was)})"
    if reason in POWER_REASONS:
        label = "power cap" if reason == "sw_power_cap" else "power brake"
        detail = (
            f"{where}{num(gpu.last('power_limit_w'))} W limit, GPU at "
            f"{num(gpu.mean('power_w'))} W, {clocks}"
        )
        return Cause("power_cap", label, detail, evidence, partial)
    if reason in THERMAL_REASONS:
        evidence["temperature_slowdown_c"] = rounded(gpu.last("temperature_slowdown_c"))
        detail = (
            f"{where}GPU at {num(gpu.mean('temperature_c'))} °C (slows down at "
            f"{num(gpu.last('temperature_slowdown_c'))} °C), {clocks}"
        )
        return Cause("thermal", KIND_LABELS["thermal"], detail, evidence, partial)
    detail = f"{where}the GPU reports HW slowdown, {clocks}, {num(gpu.mean('power_w'))} W"
    return Cause("hw_slowdown", KIND_LABELS["hw_slowdown"], detail, evidence, partial)


def _listed(gpus: Sequence[GpuEvidence], pids: frozenset[int]) -> bool:
    return any(p.pid in pids for g in gpus for p in g.processes)


def other_run(clues: Clues, gpus: list[GpuClues]) -> Cause | None:
    """Another gpustation run on one of the run's GPUs, started (or come onto it) since."""
    if not clues.before or not clues.during:
        return None
    since, start = clues.before[0].time, clues.during[0].time
    mine = set(clues.gpus) | {g.index for g in gpus}
    for other in clues.other_runs:
        common = sorted(mine & set(other.gpus))
        if not common:
            continue
        started = other.started_at
        new = started is not None and since <= started <= clues.during[-1].time
        # Started earlier but only now on the GPU (its processes listed in the drop alone).
        arrived = any(
            _listed(g.during, other.pids) and not _listed(g.before, other.pids)
            for g in gpus
            if g.index in common
        )
        if not (new or arrived):
            continue
        on = ",".join(map(str, common))
        if started is not None:
            delta = started - start
            when = f"{abs(delta):.0f} s {'after' if delta >= 0 else 'before'} the slowdown began"
        else:
            when = "its processes came onto the GPU as the slowdown began"
        return Cause(
            "other_run",
            f"another gpustation run ({other.id})",
            f"run {other.id} shares GPU {on}, started {when}",
            {"run": other.id, "gpus": common, "started_at": started},
        )
    return None


def _sm_share(moments: Sequence[GpuEvidence], pid: int) -> float | None:
    """A process's mean SM share over the moments it has a figure in (absent: 0);
    None when it was listed but never with a figure (NVML reads the shares on
    slow passes only: a process new since the last one has none yet)."""
    values: list[float] = []
    for g in moments:
        listed = [p.sm_pct for p in g.processes if p.pid == pid]
        if not listed:
            values.append(0.0)
        elif listed[0] is not None:
            values.append(listed[0])
    known = any(p.pid == pid and p.sm_pct is not None for g in moments for p in g.processes)
    listed_at_all = any(p.pid == pid for g in moments for p in g.processes)
    if listed_at_all and not known:
        return None
    return sum(values) / len(values) if values else None


def process(clues: Clues, gpus: list[GpuClues]) -> Cause | None:
    """Another process that took a real share of the SMs, which it had not before."""
    others = frozenset().union(*(o.pids for o in clues.other_runs))
    best: tuple[float, float, GpuClues, Any] | None = None
    for gpu in gpus:
        if not gpu.before:
            continue
        seen = {
            p.pid: p
            for g in gpu.during
            for p in g.processes
            if p.pid not in clues.run_pids and p.pid not in others
        }
        for pid, proc in seen.items():
            sm, was = _sm_share(gpu.during, pid), _sm_share(gpu.before, pid)
            if sm is None or was is None:
                continue  # no figure to name it by, or none to compare with
            if sm >= PROCESS_MIN_SM_PCT and was <= sm / 2 and (best is None or sm > best[0]):
                best = (sm, was, gpu, proc)
    if best is None:
        return None
    sm, was, gpu, proc = best
    who = ", ".join(x for x in (proc.user, proc.command) if x)
    detail = f"pid {proc.pid}" + (f" ({who})" if who else "")
    detail += f" at {sm:.0f} % of GPU {gpu.index}'s SMs" + (f" (was {was:.0f} %)" if was else "")
    return Cause(
        "process",
        f"another process (pid {proc.pid})",
        detail,
        {
            "gpu": gpu.index,
            "pid": proc.pid,
            "user": proc.user,
            "command": proc.command,
            "sm_pct": round(sm, 1),
            "sm_pct_before": round(was, 1),
        },
    )


def pcie(clues: Clues, gpus: list[GpuClues]) -> Cause | None:
    """The GPU's PCIe link below its maximum gen or width in the drop, at it before."""
    for gpu in gpus:
        if not gpu.before:
            continue
        below = share_of(gpu.during, lambda g: g.pcie_below_max)
        if (
            below < REASON_DURING
            or share_of(gpu.before, lambda g: g.pcie_below_max) > REASON_BEFORE
        ):
            continue
        links = Counter((g.pcie_gen, g.pcie_width) for g in gpu.during if g.pcie_below_max)
        (gen, width), _ = links.most_common(1)[0]
        top = (gpu.last("pcie_max_gen"), gpu.last("pcie_max_width"))
        detail = f"{where_on(gpu, len(gpus) > 1)}{fmt.pcie_link(gen, width)} of "
        detail += fmt.pcie_link(*top)
        return Cause(
            "pcie",
            KIND_LABELS["pcie"],
            detail,
            {
                "gpu": gpu.index,
                "pcie_gen": gen,
                "pcie_width": width,
                "pcie_max_gen": top[0],
                "pcie_max_width": top[1],
            },
        )
    return None


def clocks(clues: Clues, gpus: list[GpuClues]) -> Cause | None:
    """A busy GPU's SM clock held well below its maximum and what it was, no reason given."""
    for gpu in gpus:
        top = gpu.last("clock_sm_max_mhz")
        now, was = gpu.mean("clock_sm_mhz"), gpu.mean("clock_sm_mhz", during=False)
        util = gpu.mean("utilization_pct")
        if not gpu.before or top is None or now is None or was is None or util is None:
            continue
        held = share_of(gpu.during, lambda g: any(r in LIMITING_REASONS for r in g.throttle))
        if held >= REASON_DURING or util < BUSY_UTIL_PCT:
            continue
        if now >= CLOCK_BELOW * top or was - now < CLOCK_FALL * top:
            continue
        app = share_of(gpu.during, has_reason("applications_clocks_setting"))
        why = "application clocks set" if app >= REASON_DURING else "no throttle reason given"
        return Cause(
            "clocks",
            KIND_LABELS["clocks"],
            f"{where_on(gpu, len(gpus) > 1)}SM clock {num(now)} of {num(top)} MHz "
            f"(was {num(was)}), {why}",
            {
                "gpu": gpu.index,
                "clock_sm_mhz": round(now),
                "clock_sm_mhz_before": round(was),
                "clock_sm_max_mhz": round(top),
                "utilization_pct": round(util),
            },
        )
    return None


def memory_temperature(clues: Clues, gpus: list[GpuClues]) -> Cause | None:
    """The memory within a few degrees of its maximum in the drop, not before."""
    for gpu in gpus:
        top = gpu.last("memory_temperature_max_c")
        hot = [g.memory_temperature_c for g in gpu.during if g.memory_temperature_c is not None]
        cool = [g.memory_temperature_c for g in gpu.before if g.memory_temperature_c is not None]
        if top is None or not hot or not cool:
            continue
        if max(hot) < top - MEMORY_MARGIN_C or max(cool) >= top - MEMORY_MARGIN_C:
            continue
        return Cause(
            "memory_temperature",
            KIND_LABELS["memory_temperature"],
            f"{where_on(gpu, len(gpus) > 1)}memory at {num(max(hot))} °C of {num(top)} °C "
            f"(was {num(max(cool))} °C)",
            {
                "gpu": gpu.index,
                "memory_temperature_c": round(max(hot), 1),
                "memory_temperature_before_c": round(max(cool), 1),
                "memory_temperature_max_c": round(top, 1),
            },
        )
    return None
