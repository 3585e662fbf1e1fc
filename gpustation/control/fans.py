"""Fans outside the controller loop: show them, hand them back to the card."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpustation.control import journal
from gpustation.control.fancurve import stop_controllers
from gpustation.errors import NotSupportedError
from gpustation.telemetry.backend import Backend
from gpustation.telemetry.model import GpuSample


@dataclass(slots=True)
class FanRestore:
    gpu: int
    fans: int
    #: fans that were under manual control before
    were_manual: int


def fan_gpus(backend: Backend, samples: Sequence[GpuSample]) -> list[GpuSample]:
    """The cards among ``samples`` that have fans NVML can drive."""
    return [s for s in samples if not s.lost and backend.fan_count(s.index) > 0]


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
    for sample in fresh:
        index = sample.index
        count = backend.fan_count(index)
        manual = 0
        for fan in range(count):
            mode = sample.fan_control[fan] if fan < len(sample.fan_control) else None
            pct = sample.fans_pct[fan] if fan < len(sample.fans_pct) else None
            manual += mode == "manual"
            journal.record(
                gpu=index,
                uuid=sample.uuid,
                what=journal.FAN_AUTO,
                previous={"mode": mode, "pct": pct},
                new={"mode": "auto"},
                command=command,
                fan=fan,
                simulated=backend.simulated,
            )
            backend.set_fan_auto(index, fan)
        done.append(FanRestore(gpu=index, fans=count, were_manual=manual))
    return done
