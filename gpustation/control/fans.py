"""Fans outside the controller loop: show them, hand them back to the card."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

from gpustation.control import journal
from gpustation.control.fancurve import running_controllers, stop_controllers
from gpustation.errors import GpustationError, NotSupportedError
from gpustation.telemetry.backend import Backend
from gpustation.telemetry.model import GpuSample


@dataclass(slots=True)
class FanRestore:
    gpu: int
    fans: int
    #: fans that were under manual control before
    were_manual: int
    #: fans the card refused to hand back: "fan N: why"
    failed: list[str] = field(default_factory=list)
    #: why the journal could not be written (the fans were handed back anyway)
    journal_error: str | None = None

    @property
    def ok(self) -> bool:
        return not self.failed


def fan_gpus(backend: Backend, samples: Sequence[GpuSample]) -> list[GpuSample]:
    """The cards among ``samples`` that have fans NVML can drive."""
    return [s for s in samples if not s.lost and backend.control.fan_count(s.index) > 0]


def set_fans_auto(
    backend: Backend,
    indices: Sequence[int],
    command: str,
    require_fans: bool = True,
) -> list[FanRestore]:
    """Stop any fan controller on these cards, then put every fan on automatic.

    With ``require_fans``, a selection in which no card has fans is refused
    (NotSupportedError); cards without fans are otherwise skipped.
    """
    samples = backend.read_gpus(list(indices), slow=False)
    with_fans = fan_gpus(backend, samples)
    if not with_fans:
        if require_fans:
            names = ", ".join(
                f"GPU {s.index}" + (f" ({s.name})" if s.name else "") for s in samples
            )
            raise NotSupportedError(
                f"{names}: no fans gpustation can control (datacenter cards are cooled by "
                "the chassis); nothing was changed."
            )
        return []
    # A running controller would take the fans straight back; it restores them
    # to automatic itself when it stops.
    stop_controllers([s.index for s in with_fans], backend.simulated)
    fresh = backend.read_gpus([s.index for s in with_fans], slow=False)
    done: list[FanRestore] = []
    with ExitStack() as stack:
        try:
            stack.enter_context(journal.control_lock(timeout_s=5.0))
        except GpustationError:
            pass  # fans go back to the card regardless
        for sample in fresh:
            done.append(_hand_back(backend, sample, command))
    return done


def _hand_back(backend: Backend, sample: GpuSample, command: str) -> FanRestore:
    """Every fan of one card back to automatic: journalled when the journal
    can be written, handed back even when it cannot (a fan left manual is the
    one state worse than an unjournalled change)."""
    index = sample.index
    count = backend.control.fan_count(index)
    result = FanRestore(gpu=index, fans=count, were_manual=0)
    for fan in range(count):
        mode = sample.fan_control[fan] if fan < len(sample.fan_control) else None
        pct = sample.fans_pct[fan] if fan < len(sample.fans_pct) else None
        result.were_manual += mode == "manual"
        entry = None
        try:
            entry = journal.record(
                gpu=index,
                uuid=sample.uuid,
                what=journal.FAN_AUTO,
                previous={"mode": mode, "pct": pct},
                new={"mode": "auto"},
                command=command,
                fan=fan,
                simulated=backend.simulated,
            )
        except GpustationError as err:
            result.journal_error = str(err)
        try:
            backend.control.set_fan_auto(index, fan)
        except GpustationError as err:
            result.failed.append(f"fan {fan}: {err}")
            if entry is not None:
                journal.settle(entry, journal.REFUSED, error=str(err))
            continue
        if entry is not None:
            journal.settle(entry, journal.MADE, read_back={"mode": "auto"})
    return result


def unattended_manual_fans(samples: Sequence[GpuSample], simulated: bool) -> dict[int, list[int]]:
    """GPU index -> its fans under manual control with no fan controller driving them.

    A controller killed with SIGKILL (or a crash of the machine's other fan
    tools) leaves fans at a fixed speed that no longer follows the card's
    temperature: the one fan state worth an alert.
    """
    manual = {
        s.index: [fan for fan, mode in enumerate(s.fan_control) if mode == "manual"]
        for s in samples
        if not s.lost and "manual" in s.fan_control
    }
    if not manual:
        return {}
    driven = running_controllers(list(manual), simulated)
    return {index: fans for index, fans in manual.items() if index not in driven}


UNATTENDED_HINT = "`gpustation fan auto` hands them back to the card"
