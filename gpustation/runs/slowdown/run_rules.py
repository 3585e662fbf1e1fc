"""The rules a slowdown's cause is found by in what the runner and the host show.

A phase the runner reported over a real part of the time around the drop,
swapping, the input pipeline starving the GPU (utilisation fell while the
run's loader processes each use about a whole core), the host's CPU
saturated. Each returns a :class:`~gpustation.runs.slowdown.clues.Cause`
with the figures that show it, or None. Pure logic.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpustation.runs.slowdown.clues import KIND_LABELS, Cause, Clues, GpuClues, mean_of, rounded
from gpustation.runs.slowdown.evidence import Moment

#: the runner's phases that are its normal work: any other one names the cause ...
WORK_PHASES = frozenset({"train", "training"})
#: ... when it took at least this share of the time from min_s before the drop to its
#: confirmation (a short eval a while before it explains nothing)
PHASE_SHARE = 0.2
#: swap traffic (in and out, MiB/s) that slows a run
SWAP_MIB_S = 1.0
#: GPU utilisation must fall by at least this many points for a starved GPU ...
UTIL_FALL_PCT = 15.0
#: ... or to at most this share of what it was, from at least UTIL_LOW_PCT. NVML's
#: utilisation counts a sample period busy if any kernel ran in it, so it falls far less
#: than the work done: ResNet-50 fed by 8 loader workers, then 1, lost 77-81 % of its
#: images while utilisation went 21 → 10 % (H200), 34 → 21 %, 36 → 20 % and 32 → 24 %
#: (H100). The loaders each at a whole core are the finding; the fall only shows that
#: the GPU is not what holds the run back.
UTIL_FALL_SHARE = 0.8
UTIL_LOW_PCT = 10.0
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


def phase(clues: Clues, gpus: list[GpuClues]) -> Cause | None:
    """A phase other than its work that the runner reported for a real part of the time."""
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


def _swap_rate(moments: Sequence[Moment]) -> tuple[float | None, float | None]:
    return (
        mean_of(m.host.swap_in_mib_s for m in moments),
        mean_of(m.host.swap_out_mib_s for m in moments),
    )


def swap(clues: Clues, gpus: list[GpuClues]) -> Cause | None:
    """Swap traffic in the drop, next to none before."""
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


def process_cpu(moments: Sequence[Moment]) -> dict[int, float]:
    """The mean CPU (% of one core) of each of the run's processes in the last moment
    that read a worker's CPU, over the moments it was seen in.

    Workers a loader just replaced (the old ones winding down) are not its loaders
    any more; and a worker just started has no figure at its first reading, so the
    last moment may show the run's own process alone: the one before it still
    shows who was loading (on an H100, a DataLoader of one worker started afresh
    every 7 s left the last moment of a drop with the main process only).
    """
    seen: dict[int, list[float]] = {}
    for m in moments:
        for pid, pct in m.host.run_cpu:
            seen.setdefault(pid, []).append(pct)
    with_figures = [m.host for m in moments if m.host.run_cpu]
    last = next(
        (h for h in reversed(with_figures) if any(pid != h.main_pid for pid, _ in h.run_cpu)),
        with_figures[-1] if with_figures else None,
    )
    return {pid: sum(seen[pid]) / len(seen[pid]) for pid, _ in (last.run_cpu if last else ())}


def input_pipeline(clues: Clues, gpus: list[GpuClues]) -> Cause | None:
    """GPU utilisation fell while each of the run's loader processes used about a core."""
    now = mean_of(g.mean("utilization_pct") for g in gpus)
    was = mean_of(g.mean("utilization_pct", during=False) for g in gpus)
    if now is None or was is None:
        return None
    if was - now < UTIL_FALL_PCT and (was < UTIL_LOW_PCT or now > UTIL_FALL_SHARE * was):
        return None
    main = next((m.host.main_pid for m in clues.during if m.host.main_pid is not None), None)
    cpu = process_cpu(clues.during)
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


def host_cpu(clues: Clues, gpus: list[GpuClues]) -> Cause | None:
    """The host's CPU saturated: busier than before, or the run on a CPU less of its ready time."""
    now = mean_of(m.host.cpu_pct for m in clues.during)
    was = mean_of(m.host.cpu_pct for m in clues.before)
    if now is None or was is None or now < HOST_BUSY_PCT:
        return None
    got = mean_of(m.host.run_on_cpu_pct for m in clues.during)
    had = mean_of(m.host.run_on_cpu_pct for m in clues.before)
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
            "run_on_cpu_pct": rounded(got),
            "run_on_cpu_pct_before": rounded(had),
            "run_cpu_pct": round(sum(process_cpu(clues.during).values()), 1),
        },
    )
