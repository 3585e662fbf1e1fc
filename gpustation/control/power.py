"""Power limits: plan a change against each card's own range, journal it, make it.

Planning reads the cards and checks every requested limit before anything is
set, so a value outside one card's range leaves all cards untouched. Applying
journals each change before it is made and, if a later card refuses, puts the
cards already changed back the way they were.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpustation.control import journal, lease
from gpustation.control.profiles import PowerValue
from gpustation.errors import GpustationError, NotSupportedError, UsageError
from gpustation.telemetry.backend import Backend
from gpustation.telemetry.model import GpuSample

#: Said wherever limits are shown or set: NVML limits are not persistent.
NOT_PERSISTENT = (
    "Power limits do not survive a reboot or a driver reload; apply them again at boot "
    "(see the gpustation-fan.service example)."
)


def _label(sample: GpuSample) -> str:
    return f"GPU {sample.index}" + (f" ({sample.name})" if sample.name else "")


@dataclass(slots=True)
class PowerChange:
    """One GPU's current limit and the limit it would get."""

    gpu: int
    uuid: str | None
    name: str | None
    current_w: float | None
    new_w: float
    default_w: float | None
    min_w: float
    max_w: float

    @property
    def unchanged(self) -> bool:
        return self.current_w is not None and abs(self.current_w - self.new_w) < 0.5

    def describe(self) -> str:
        current = f"{self.current_w:g} W" if self.current_w is not None else "n/a"
        default = f", default {self.default_w:g} W" if self.default_w is not None else ""
        return (
            f"GPU {self.gpu}: {current} -> {self.new_w:g} W "
            f"(range {self.min_w:g}-{self.max_w:g} W{default})"
        )


def power_range(sample: GpuSample) -> tuple[float, float]:
    """The card's accepted limits; NotSupportedError when it does not say."""
    if sample.lost:
        raise GpustationError(
            f"{_label(sample)} has fallen off the bus; check `nvidia-smi` and the kernel log."
        )
    if sample.power_min_w is None or sample.power_max_w is None:
        raise NotSupportedError(
            f"{_label(sample)} does not report the power limits it accepts; "
            "its power limit cannot be changed."
        )
    return sample.power_min_w, sample.power_max_w


def plan_power(samples: Sequence[GpuSample], value: PowerValue) -> list[PowerChange]:
    """Check ``value`` on every card; raise listing every card it does not fit."""
    changes: list[PowerChange] = []
    unsupported: list[str] = []
    out_of_range: list[str] = []
    for s in samples:
        try:
            lo, hi = power_range(s)
        except NotSupportedError as err:
            unsupported.append(str(err))
            continue
        watts = value.watts_for(s.power_default_w)
        if watts is None:
            unsupported.append(
                f"{_label(s)} does not report its default power limit, so {value} cannot be "
                "worked out; give the limit in watts."
            )
            continue
        if not lo <= watts <= hi:
            what = f"{watts:g} W" + (f" ({value})" if value.kind == "percent" else "")
            out_of_range.append(
                f"GPU {s.index}: {what} is outside the card's range {lo:g}-{hi:g} W"
            )
            continue
        changes.append(
            PowerChange(
                gpu=s.index,
                uuid=s.uuid,
                name=s.name,
                current_w=s.power_limit_w,
                new_w=watts,
                default_w=s.power_default_w,
                min_w=lo,
                max_w=hi,
            )
        )
    if out_of_range:
        raise UsageError("; ".join(out_of_range) + ". Nothing was changed.")
    if unsupported:
        raise NotSupportedError(" ".join(unsupported) + " Nothing was changed.")
    return changes


def apply_power(
    backend: Backend,
    changes: Sequence[PowerChange],
    command: str,
    on_change: Callable[[PowerChange], None] | None = None,
    owner: str | None = None,
) -> list[PowerChange]:
    """Journal, set and read back each change; undo the ones made if a later one fails.

    Holds the control lock throughout, and reads each card's limit again under
    it, so the journal's "previous" is what the card had. Returns the changes
    that were made (cards already at the limit are skipped). Refused (LeaseHeld,
    nothing changed) when a live program other than ``owner`` holds a lease on
    any of the GPUs (:mod:`gpustation.control.lease`).
    """
    done: list[PowerChange] = []
    with journal.control_lock():
        lease.check_free(
            [(c.gpu, c.uuid) for c in changes], backend.simulated, owner, f"`{command}`"
        )
        try:
            for change in changes:
                current = _current_limit(backend, change.gpu)
                if current is not None:
                    change.current_w = current
                if change.unchanged:
                    continue
                _set_and_check(backend, change, change.current_w, change.new_w, command)
                done.append(change)
                if on_change is not None:
                    on_change(change)
        except BaseException:
            _undo(backend, done, command)
            raise
    return done


def _current_limit(backend: Backend, index: int) -> float | None:
    sample = backend.read_gpus([index], slow=False)[0]
    return None if sample.lost else sample.power_limit_w


def _set_and_check(
    backend: Backend, change: PowerChange, previous: float | None, new: float, command: str
) -> None:
    """Journal the intent, set the limit, read it back and journal the outcome."""
    entry = journal.record(
        gpu=change.gpu,
        uuid=change.uuid,
        what=journal.POWER_LIMIT,
        previous=previous,
        new=new,
        command=command,
        simulated=backend.simulated,
    )
    try:
        backend.control.set_power_limit(change.gpu, new)
    except BaseException as err:
        journal.settle(entry, journal.REFUSED, error=str(err) or type(err).__name__)
        raise
    back = _current_limit(backend, change.gpu)
    journal.settle(entry, journal.MADE, read_back=back)
    if back is not None and abs(back - new) >= 0.5:
        raise GpustationError(
            f"GPU {change.gpu}: the driver accepted {new:g} W but the card reads back "
            f"{back:g} W; check `nvidia-smi -q -d POWER`."
        )


def _undo(backend: Backend, done: Sequence[PowerChange], command: str) -> None:
    """Put back the limits already changed; each card on its own, best effort."""
    for change in reversed(done):
        if change.current_w is None:
            continue
        try:
            _set_and_check(
                backend,
                change,
                change.new_w,
                change.current_w,
                f"{command} (undo after a failure)",
            )
        except Exception:  # the original error is the one to report
            pass
