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

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpustation.runs.slowdown.evidence import GpuEvidence, Moment
from gpustation.telemetry import format as fmt
from gpustation.telemetry.model import LIMITING_REASONS, POWER_REASONS, THERMAL_REASONS

#: the runner's phases that are its normal work: any other one names the cause ...
WORK_PHASES = frozenset({"train", "training"})
#: ... when it took at least this share of the time from min_s before the drop to its
#: confirmation (a short eval a while before it explains nothing)
PHASE_SHARE = 0.2
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
#: swap traffic (in and out, MiB/s) that slows a run
SWAP_MIB_S = 1.0
#: GPU utilisation must fall by at least this many points for a starved GPU
UTIL_FALL_PCT = 15.0
#: a loader process at this share of one core (%) is saturated
LOADER_BUSY_PCT = 85.0
#: a child of the run doing less than this (%) is not loading anything
LOADER_MIN_PCT = 5.0
#: the host's CPU is saturated at this total (%) ...
HOST_BUSY_PCT = 90.0
#: ... having risen by this many points, or the run's processes getting a CPU for at
#: most this part of the share of their ready time they got before (a run that uses
#: less CPU by itself, fewer loader workers, waits less, not more)
HOST_RISE_PCT = 10.0
ON_CPU_FALL = 0.75

#: what each kind of cause is called
KIND_LABELS = {
    "phase": "runner phase",
    "power_cap": "power cap",
    "thermal": "thermal slowdown",
    "hw_slowdown": "hardware slowdown",
    "other_run": "another gpustation run",
    "process": "another process",
    "pcie": "PCIe link below its maximum",
    "clocks": "clocks held below maximum",
    "memory_temperature": "memory temperature near its maximum",
    "swap": "swapping",
    "input_pipeline": "input pipeline starving the GPU",
    "host_cpu": "host CPU saturated",
    "unknown": "unknown",
}


@dataclass(frozen=True)
class Cause:
    """A slowdown's cause: its kind, a short label, the figures in words and as numbers."""

    kind: str
    label: str
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)
    #: it holds but explains only part of the drop: named only when no later rule holds
    partial: bool = False

    @property
    def words(self) -> str:
        return f"{self.label}: {self.detail}" if self.detail else self.label

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "label": self.label,
            "detail": self.detail,
            "words": self.words,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class OtherRun:
    """Another gpustation run still going on some of the run's GPUs."""

    id: str
    gpus: tuple[int, ...]
    started_at: float | None
    pids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Clues:
    """Everything a cause is named from."""

    #: moments of the steady time before the drop, and of the drop, oldest first
    before: Sequence[Moment]
    during: Sequence[Moment]
    #: the run's GPUs and processes
    gpus: tuple[int, ...] = ()
    run_pids: frozenset[int] = frozenset()
    #: seconds the runner spent in each phase it reported (:func:`phase_seconds`) over
    #: the ``phase_window_s`` from a little before the drop to its confirmation
    phases: tuple[tuple[str, float], ...] = ()
    phase_window_s: float = 0.0
    other_runs: tuple[OtherRun, ...] = ()
    #: how far below its steady level the run's throughput fell (%)
    lost_pct: float | None = None


def _mean(values: Iterable[float | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _share(gpus: Sequence[GpuEvidence], holds: Callable[[GpuEvidence], bool | None]) -> float:
    return sum(1 for g in gpus if holds(g)) / len(gpus) if gpus else 0.0


def _has(reason: str) -> Callable[[GpuEvidence], bool]:
    return lambda g: reason in g.throttle


def _n(value: float | None, unit: str = "") -> str:
    return fmt.num(value, 0, unit)


def _r(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


class _Gpu:
    """One GPU's evidence before and during the drop."""

    def __init__(self, index: int, before: list[GpuEvidence], during: list[GpuEvidence]) -> None:
        self.index = index
        self.before = before
        self.during = during

    def mean(self, attr: str, during: bool = True) -> float | None:
        return _mean(getattr(g, attr) for g in (self.during if during else self.before))

    def last(self, attr: str) -> Any:
        return next((v for g in reversed(self.during) if (v := getattr(g, attr)) is not None), None)

    def clock_text(self) -> str:
        clock, top = self.mean("clock_sm_mhz"), self.last("clock_sm_max_mhz")
        return f"SM clock {_n(clock)} of {_n(top)} MHz"


def _gpus(clues: Clues) -> list[_Gpu]:
    indices = sorted({g.index for m in clues.during for g in m.gpus})
    out = []
    for index in indices:
        during = [g for m in clues.during for g in m.gpus if g.index == index]
        before = [g for m in clues.before for g in m.gpus if g.index == index]
        out.append(_Gpu(index, before, during))
    return out


def _where(gpu: _Gpu, many: bool) -> str:
    return f"GPU {gpu.index}: " if many else ""


# ---- the rules, in order --------------------------------------------------------------------


def phase_seconds(
    changes: Sequence[tuple[float, str]], start: float, end: float
) -> tuple[tuple[str, float], ...]:
    """Seconds spent in each phase from ``start`` to ``end``, from the runner's phase
    changes (time, phase), oldest first; the time before its first report is in none."""
    seconds: dict[str, float] = {}
    current: str | None = None
    since = start
    for when, phase in changes:
        if when <= start:
            current = phase
            continue
        if when >= end:
            break
        if current is not None:
            seconds[current] = seconds.get(current, 0.0) + when - since
        current, since = phase, when
    if current is not None:
        seconds[current] = seconds.get(current, 0.0) + end - since
    return tuple(seconds.items())


def _phase(clues: Clues, gpus: list[_Gpu]) -> Cause | None:
    window = clues.phase_window_s
    spent = [(s, p) for p, s in clues.phases if p.strip().lower() not in WORK_PHASES]
    if not spent or window <= 0:
        return None
    seconds, phase = max(spent)
    if seconds < PHASE_SHARE * window:
        return None
    return Cause(
        "phase",
        f"{phase} phase",
        f"the runner reported its {phase} phase for {seconds:.0f} s of the {window:.0f} s "
        "around the drop",
        {"phase": phase, "seconds": round(seconds, 1), "window_s": round(window, 1)},
    )


def _throttle(clues: Clues, gpus: list[_Gpu]) -> Cause | None:
    found: tuple[float, str, _Gpu] | None = None
    for gpu in gpus:
        if not gpu.before:
            continue
        for reason in sorted(LIMITING_REASONS):
            during, before = _share(gpu.during, _has(reason)), _share(gpu.before, _has(reason))
            held = during >= REASON_DURING and before <= REASON_BEFORE
            if held and (found is None or during > found[0]):
                found = (during, reason, gpu)
    if found is None:
        return None
    share, reason, gpu = found
    where = _where(gpu, len(gpus) > 1)
    clock, was = gpu.mean("clock_sm_mhz"), gpu.mean("clock_sm_mhz", during=False)
    fell = 100.0 * (was - clock) / was if clock is not None and was else None
    partial = fell is not None and clues.lost_pct is not None
    partial = partial and (fell or 0.0) < CLOCK_SHARE_OF_LOSS * (clues.lost_pct or 0.0)
    evidence = {
        "gpu": gpu.index,
        "reason": reason,
        "share_of_drop": round(share, 2),
        "power_w": _r(gpu.mean("power_w")),
        "power_limit_w": _r(gpu.last("power_limit_w")),
        "clock_sm_mhz": _r(clock, 0),
        "clock_sm_mhz_before": _r(was, 0),
        "clock_sm_max_mhz": _r(gpu.last("clock_sm_max_mhz"), 0),
        "temperature_c": _r(gpu.mean("temperature_c")),
    }
    clocks = f"{gpu.clock_text()} (was {_n(was)})"
    if reason in POWER_REASONS:
        label = "power cap" if reason == "sw_power_cap" else "power brake"
        detail = (
            f"{where}{_n(gpu.last('power_limit_w'))} W limit, GPU at "
            f"{_n(gpu.mean('power_w'))} W, {clocks}"
        )
        return Cause("power_cap", label, detail, evidence, partial)
    if reason in THERMAL_REASONS:
        evidence["temperature_slowdown_c"] = _r(gpu.last("temperature_slowdown_c"))
        detail = (
            f"{where}GPU at {_n(gpu.mean('temperature_c'))} °C (slows down at "
            f"{_n(gpu.last('temperature_slowdown_c'))} °C), {clocks}"
        )
        return Cause("thermal", KIND_LABELS["thermal"], detail, evidence, partial)
    detail = f"{where}the GPU reports HW slowdown, {clocks}, {_n(gpu.mean('power_w'))} W"
    return Cause("hw_slowdown", KIND_LABELS["hw_slowdown"], detail, evidence, partial)


def _listed(gpus: Sequence[GpuEvidence], pids: frozenset[int]) -> bool:
    return any(p.pid in pids for g in gpus for p in g.processes)


def _other_run(clues: Clues, gpus: list[_Gpu]) -> Cause | None:
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


def _process(clues: Clues, gpus: list[_Gpu]) -> Cause | None:
    others = frozenset().union(*(o.pids for o in clues.other_runs))
    best: tuple[float, float, _Gpu, Any] | None = None
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


def _pcie(clues: Clues, gpus: list[_Gpu]) -> Cause | None:
    for gpu in gpus:
        if not gpu.before:
            continue
        below = _share(gpu.during, lambda g: g.pcie_below_max)
        if below < REASON_DURING or _share(gpu.before, lambda g: g.pcie_below_max) > REASON_BEFORE:
            continue
        links = Counter((g.pcie_gen, g.pcie_width) for g in gpu.during if g.pcie_below_max)
        (gen, width), _ = links.most_common(1)[0]
        top = (gpu.last("pcie_max_gen"), gpu.last("pcie_max_width"))
        detail = f"{_where(gpu, len(gpus) > 1)}{fmt.pcie_link(gen, width)} of "
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


def _clocks(clues: Clues, gpus: list[_Gpu]) -> Cause | None:
    for gpu in gpus:
        top = gpu.last("clock_sm_max_mhz")
        now, was = gpu.mean("clock_sm_mhz"), gpu.mean("clock_sm_mhz", during=False)
        util = gpu.mean("utilization_pct")
        if not gpu.before or top is None or now is None or was is None or util is None:
            continue
        held = _share(gpu.during, lambda g: any(r in LIMITING_REASONS for r in g.throttle))
        if held >= REASON_DURING or util < BUSY_UTIL_PCT:
            continue
        if now >= CLOCK_BELOW * top or was - now < CLOCK_FALL * top:
            continue
        app = _share(gpu.during, _has("applications_clocks_setting"))
        why = "application clocks set" if app >= REASON_DURING else "no throttle reason given"
        return Cause(
            "clocks",
            KIND_LABELS["clocks"],
            f"{_where(gpu, len(gpus) > 1)}SM clock {_n(now)} of {_n(top)} MHz "
            f"(was {_n(was)}), {why}",
            {
                "gpu": gpu.index,
                "clock_sm_mhz": round(now),
                "clock_sm_mhz_before": round(was),
                "clock_sm_max_mhz": round(top),
                "utilization_pct": round(util),
            },
        )
    return None


def _memory_temperature(clues: Clues, gpus: list[_Gpu]) -> Cause | None:
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
            f"{_where(gpu, len(gpus) > 1)}memory at {_n(max(hot))} °C of {_n(top)} °C "
            f"(was {_n(max(cool))} °C)",
            {
                "gpu": gpu.index,
                "memory_temperature_c": round(max(hot), 1),
                "memory_temperature_before_c": round(max(cool), 1),
                "memory_temperature_max_c": round(top, 1),
            },
        )
    return None


def _swap_rate(moments: Sequence[Moment]) -> tuple[float | None, float | None]:
    return (
        _mean(m.host.swap_in_mib_s for m in moments),
        _mean(m.host.swap_out_mib_s for m in moments),
    )


def _swap(clues: Clues, gpus: list[_Gpu]) -> Cause | None:
    swap_in, swap_out = _swap_rate(clues.during)
    was_in, was_out = _swap_rate(clues.before)
    if swap_in is None or swap_out is None or was_in is None or was_out is None:
        return None
    now, was = swap_in + swap_out, was_in + was_out
    if now < SWAP_MIB_S or was >= now / 4:
        return None
    return Cause(
        "swap",
        KIND_LABELS["swap"],
        f"{swap_in:.1f} MiB/s in, {swap_out:.1f} MiB/s out (was {was:.1f} MiB/s)",
        {
            "swap_in_mib_s": round(swap_in, 2),
            "swap_out_mib_s": round(swap_out, 2),
            "swap_before_mib_s": round(was, 2),
        },
    )


def _process_cpu(moments: Sequence[Moment]) -> dict[int, float]:
    """Each of the run's processes' mean CPU (% of one core) over the moments it was seen in."""
    seen: dict[int, list[float]] = {}
    for m in moments:
        for pid, pct in m.host.run_cpu:
            seen.setdefault(pid, []).append(pct)
    return {pid: sum(v) / len(v) for pid, v in seen.items()}


def _input_pipeline(clues: Clues, gpus: list[_Gpu]) -> Cause | None:
    now = _mean(g.mean("utilization_pct") for g in gpus)
    was = _mean(g.mean("utilization_pct", during=False) for g in gpus)
    if now is None or was is None or was - now < UTIL_FALL_PCT:
        return None
    main = next((m.host.main_pid for m in clues.during if m.host.main_pid is not None), None)
    cpu = _process_cpu(clues.during)
    loaders = {pid: pct for pid, pct in cpu.items() if pid != main and pct >= LOADER_MIN_PCT}
    itself = not loaders
    if itself:
        # No workers: the run's own process loads its data.
        loaders = {main: cpu[main]} if main in cpu else {}
    if not loaders or min(loaders.values()) < LOADER_BUSY_PCT:
        return None
    pids = sorted(loaders)
    pcts = ", ".join(f"{loaders[p]:.0f}" for p in pids)
    who = (
        "the run's own process, with no loader processes,"
        if itself
        else f"its loader process{'es' if len(pids) > 1 else ''}"
    )
    return Cause(
        "input_pipeline",
        KIND_LABELS["input_pipeline"],
        f"GPU utilisation {was:.0f} → {now:.0f} %, {who} at {pcts} % CPU "
        f"(pid {', '.join(map(str, pids))})",
        {
            "utilization_pct": round(now, 1),
            "utilization_pct_before": round(was, 1),
            "loaders": [{"pid": p, "cpu_pct": round(loaders[p], 1)} for p in pids],
        },
    )


def _host_cpu(clues: Clues, gpus: list[_Gpu]) -> Cause | None:
    now = _mean(m.host.cpu_pct for m in clues.during)
    was = _mean(m.host.cpu_pct for m in clues.before)
    if now is None or was is None or now < HOST_BUSY_PCT:
        return None
    got = _mean(m.host.run_on_cpu_pct for m in clues.during)
    had = _mean(m.host.run_on_cpu_pct for m in clues.before)
    starved = got is not None and had is not None and got <= ON_CPU_FALL * had
    if was > now - HOST_RISE_PCT and not starved:
        return None
    cores = next((m.host.cores for m in clues.during if m.host.cores), None)
    of = f" of {cores} cores" if cores else ""
    detail = f"{now:.0f} %{of} busy (was {was:.0f} %)"
    if got is not None and had is not None:
        detail += (
            f", the run's processes on a CPU {got:.0f} % of their ready time (was {had:.0f} %)"
        )
    return Cause(
        "host_cpu",
        KIND_LABELS["host_cpu"],
        detail,
        {
            "cpu_pct": round(now, 1),
            "cpu_pct_before": round(was, 1),
            "cores": cores,
            "run_on_cpu_pct": _r(got),
            "run_on_cpu_pct_before": _r(had),
            "run_cpu_pct": round(sum(_process_cpu(clues.during).values()), 1),
        },
    )


RULES: tuple[Callable[[Clues, list[_Gpu]], Cause | None], ...] = (
    _phase,
    _throttle,
    _other_run,
    _process,
    _pcie,
    _clocks,
    _memory_temperature,
    _swap,
    _input_pipeline,
    _host_cpu,
)


def _unknown(clues: Clues, gpus: list[_Gpu]) -> Cause:
    """No rule holds: say so, with the figures that were looked at."""
    parts = []
    evidence: dict[str, Any] = {}
    for gpu in gpus:
        where = _where(gpu, len(gpus) > 1)
        reasons = sorted({r for g in gpu.during for r in g.throttle if r in LIMITING_REASONS})
        parts.append(
            f"{where}{gpu.clock_text()}, utilisation {_n(gpu.mean('utilization_pct'), ' %')}, "
            f"throttle {fmt.throttle(reasons)}"
        )
        evidence[f"gpu{gpu.index}"] = {
            "clock_sm_mhz": _r(gpu.mean("clock_sm_mhz"), 0),
            "utilization_pct": _r(gpu.mean("utilization_pct")),
            "throttle": reasons,
        }
    cpu = _mean(m.host.cpu_pct for m in clues.during)
    was = _mean(m.host.cpu_pct for m in clues.before)
    parts.append(f"host CPU {_n(cpu, ' %')} (was {_n(was, ' %')})")
    evidence["cpu_pct"], evidence["cpu_pct_before"] = _r(cpu), _r(was)
    for key in ("run_on_cpu_pct", "swap_in_mib_s", "swap_out_mib_s"):
        evidence[key] = _r(_mean(getattr(m.host, key) for m in clues.during))
    detail = "no reading explains it (" + "; ".join(parts) + ")"
    return Cause("unknown", "unknown", detail, evidence)


def name_cause(clues: Clues) -> Cause:
    """The first rule whose evidence holds (one that explains only part of the drop
    when no later one holds), else ``unknown``."""
    gpus = _gpus(clues)
    partial: Cause | None = None
    for rule in RULES:
        found = rule(clues, gpus)
        if found is not None and not found.partial:
            return found
        partial = partial or found
    return partial or _unknown(clues, gpus)
