"""Power limits: plan a change against each card's own range, journal it, make it.

Planning reads the cards and checks every requested limit before anything is
set, so a value outside one card's range leaves all cards untouched. Applying
journals each change before it is made and, if a later card refuses, puts the
cards already changed back the way they were.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpustation.control import journal
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
) -> list[PowerChange]:
    """Journal and set each change; undo the ones made if a later one fails.

    Returns the changes that were made (unchanged cards are skipped).
    """
    done: list[PowerChange] = []
    try:
        for change in changes:
            if change.unchanged:
                continue
            journal.record(
                gpu=change.gpu,
                uuid=change.uuid,
                what=journal.POWER_LIMIT,
                previous=change.current_w,
                new=change.new_w,
                command=command,
                simulated=backend.simulated,
            )
            backend.set_power_limit(change.gpu, change.new_w)
            done.append(change)
            if on_change is not None:
                on_change(change)
    except BaseException:
        _undo(backend, done, command)
        raise
    return done


def _undo(backend: Backend, done: Sequence[PowerChange], command: str) -> None:
    """Put back the limits already changed; each card on its own, best effort."""
    for change in reversed(done):
        if change.current_w is None:
            continue
        try:
            journal.record(
                gpu=change.gpu,
                uuid=change.uuid,
                what=journal.POWER_LIMIT,
                previous=change.new_w,
                new=change.current_w,
                command=f"{command} (undo after a failure)",
                simulated=backend.simulated,
            )
            backend.set_power_limit(change.gpu, change.current_w)
        except Exception:  # the original error is the one to report
            pass
