"""A sweep's hold on its GPUs: the limits killed sweeps left, put back first;
another sweep that holds them; runs still going on them.

A sweep with a power-limit axis holds a lease on its GPUs
(:mod:`gpustation.control.lease`) from before its first change until its
limits are back. A sweep killed outright leaves its lease and its
``sweep.json`` (the limit each card had, with the card's UUID): the next
sweep, or ``gpustation sweeps restore ID``, puts each limit back on the card
that had it, wherever that card sits now, newest sweep first, so that each
card ends at the limit it had before the oldest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from gpustation import privs
from gpustation.control import lease
from gpustation.control.power import apply_power, plan_power
from gpustation.control.profiles import PowerValue
from gpustation.errors import GpustationError, NeedsRootError
from gpustation.runs.store.reconcile import list_active_runs
from gpustation.runs.sweep.model import Sweep, scan_sweeps, sweeps_dir
from gpustation.telemetry.backend import Backend
from gpustation.telemetry.model import GpuSample

Event = Callable[[str], None]


def _all_gpus(backend: Backend) -> list[GpuSample]:
    return backend.read_gpus(list(range(backend.device_count())), slow=False)


def _targets(
    sweep: Sweep, samples: Sequence[GpuSample]
) -> tuple[list[tuple[GpuSample, float]], list[str]]:
    """(card now, limit it goes back to) for each GPU the sweep changed, found by
    UUID; and a line for each that is not on this machine."""
    by_uuid = {s.uuid: s for s in samples if s.uuid}
    found: list[tuple[GpuSample, float]] = []
    missing: list[str] = []
    for index, watts in sorted(sweep.original_limits_w.items()):
        uuid = sweep.uuids.get(index)
        if uuid:
            sample = by_uuid.get(uuid)
        else:  # written before UUIDs were kept: the index is all there is
            sample = samples[index] if 0 <= index < len(samples) else None
        if sample is None:
            missing.append(f"GPU {index}" + (f" ({uuid})" if uuid else ""))
        else:
            found.append((sample, watts))
    return found, missing


def on_this_machine(sweep: Sweep, backend: Backend) -> bool:
    """True when any GPU whose limit ``sweep`` changed is one of ``backend``'s cards."""
    if sweep.simulated != backend.simulated:
        return False
    return bool(_targets(sweep, _all_gpus(backend))[0])


def restore_limits(sweep: Sweep, backend: Backend | None) -> list[str]:
    """Put each card back to the limit it had before the sweep (journalled), then
    release the sweep's lease; returns a line per card that is not on this machine."""
    if not sweep.original_limits_w or sweep.restored:
        lease.release(sweep.id)
        return []
    if backend is None:
        raise GpustationError("no GPU backend to restore the limits with")
    targets, missing = _targets(sweep, _all_gpus(backend))
    if not targets:
        raise GpustationError(
            f"sweep {sweep.id} changed the limits of {', '.join(missing)}, and none of "
            "those cards is on this machine now; nothing was changed"
        )
    for sample, watts in targets:
        changes = plan_power([sample], PowerValue("watts", watts))
        apply_power(backend, changes, f"gpustation sweep {sweep.id}: restore", owner=sweep.id)
    sweep.restored = True
    sweep.save()
    lease.release(sweep.id)
    return [f"{m} is not on this machine: its limit was not put back" for m in missing]


def unrestored(backend: Backend, say: Event | None = None) -> list[Sweep]:
    """Sweeps on ``backend``'s cards that changed power limits, never put them
    back, and whose process is gone; a ``sweep.json`` that cannot be read is
    named through ``say`` and left out."""
    found, damaged = scan_sweeps()
    if say is not None:
        for line in damaged:
            say(f"skipped: {line}")
    for gone in lease.leftovers(backend.simulated):
        # killed after taking its lease, before it wrote (or changed) anything
        if gone.owner == f"sweep {gone.id}" and not (sweeps_dir() / gone.id).exists():
            lease.release(gone.id)
    out = []
    samples: list[GpuSample] | None = None
    for s in found:
        if not s.left_limits or s.simulated != backend.simulated:
            continue
        if samples is None:
            samples = _all_gpus(backend)
        if _targets(s, samples)[0]:
            out.append(s)
    return out


def leftovers_text(leftovers: Sequence[Sweep], backend: Backend | None = None) -> str:
    """What restoring ``leftovers`` changes, per sweep and GPU: ``sweep ID: GPU 0
    315 W -> 450 W`` (the limit now from ``backend`` where it can be read)."""
    samples: list[GpuSample] = []
    if backend is not None:
        try:
            samples = _all_gpus(backend)
        except Exception:
            samples = []  # the limits they go back to are still worth saying
    parts = []
    for s in leftovers:
        targets = _targets(s, samples)[0] if samples else []
        if targets:
            gpus = ", ".join(
                f"GPU {g.index} {g.power_limit_w:g} W -> {w:g} W"
                if g.power_limit_w is not None
                else f"GPU {g.index} back to {w:g} W"
                for g, w in targets
            )
        else:
            gpus = ", ".join(
                f"GPU {i} back to {w:g} W" for i, w in sorted(s.original_limits_w.items())
            )
        parts.append(f"sweep {s.id}: {gpus}")
    return "; ".join(parts)


def _refusal(leftovers: Sequence[Sweep], what: str) -> NeedsRootError:
    ids = " ".join(s.id for s in leftovers)
    return NeedsRootError(
        f"a sweep that was killed left power limits changed ({what}); they are put back "
        "before another sweep runs, which needs root: run sudo gpustation sweeps restore "
        f"{ids} (or this sweep with sudo)"
    )


def restore_order(leftovers: Sequence[Sweep]) -> list[Sweep]:
    """Newest first: each card ends at the limit it had before the oldest."""
    return sorted(leftovers, key=lambda s: (s.created_at, s.id), reverse=True)


def restore_leftovers(leftovers: Sequence[Sweep], backend: Backend, say: Event) -> None:
    """Put back the limits killed sweeps left (:func:`restore_order`); NeedsRootError
    naming the GPUs, the limits and ``sudo gpustation sweeps restore`` when not root."""
    if not leftovers:
        return
    what = leftovers_text(leftovers, backend)
    if not backend.simulated and not privs.can_be_root():
        raise _refusal(leftovers, what)
    say(f"a killed sweep left power limits changed; restoring them first: {what}")
    for old in restore_order(leftovers):
        try:
            for line in restore_limits(old, backend):
                say(f"sweep {old.id}: {line}")
        except NeedsRootError:
            raise _refusal(leftovers, what) from None


def holding_sweeps(gpus: Sequence[int], backend: Backend) -> list[lease.Lease]:
    """Live leases on any of ``gpus`` (another sweep changing their limits now)."""
    samples = backend.read_gpus(list(gpus), slow=False)
    return lease.holders([(s.index, s.uuid) for s in samples], backend.simulated)


def runs_on(gpus: Sequence[int], simulated: bool) -> list[tuple[str, list[int]]]:
    """(run id, GPUs in common) of each run still going on any of ``gpus``."""

    found = []
    for other in list_active_runs():
        if bool((other.run.get("backend") or {}).get("simulated")) != simulated:
            continue
        common = sorted(set(gpus) & set(other.run.get("gpus") or []))
        if common:
            found.append((other.id, common))
    return found


def runs_text(found: Sequence[tuple[str, list[int]]]) -> str:
    return "; ".join(f"run {rid} on GPU {', '.join(map(str, g))}" for rid, g in found)


def wait_for_runs(
    gpus: Sequence[int], simulated: bool, say: Event, timeout_s: float | None = None
) -> None:
    """Wait until no run is going on ``gpus`` (said once, naming them)."""
    found = runs_on(gpus, simulated)
    if not found:
        return
    say(f"waiting for {runs_text(found)} to end before the first point")
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while runs_on(gpus, simulated):
        if deadline is not None and time.monotonic() > deadline:
            raise GpustationError(f"{runs_text(runs_on(gpus, simulated))} still going")
        time.sleep(0.5)  # polling the runs' state files
