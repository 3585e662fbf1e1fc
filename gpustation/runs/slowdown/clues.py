"""What a slowdown's cause is named from, and what a cause is.

:class:`Clues` hold the evidence of the seconds before a drop and of the
drop (``evidence.py``'s moments) with what else the watch knows; a
:class:`Cause` is a rule's finding: its kind, a short label, its figures in
words and as numbers. :class:`GpuClues` is one GPU's part of the clues, as the
rules read it. Pure data and arithmetic, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpustation.runs.slowdown.evidence import GpuEvidence, Moment
from gpustation.telemetry import format as fmt

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


def mean_of(values: Iterable[float | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return sum(known) / len(known) if known else None


def share_of(gpus: Sequence[GpuEvidence], holds: Callable[[GpuEvidence], bool | None]) -> float:
    return sum(1 for g in gpus if holds(g)) / len(gpus) if gpus else 0.0


def has_reason(reason: str) -> Callable[[GpuEvidence], bool]:
    return lambda g: reason in g.throttle


def num(value: float | None, unit: str = "") -> str:
    return fmt.num(value, 0, unit)


def rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


class GpuClues:
    """One GPU's evidence before and during the drop."""

    def __init__(self, index: int, before: list[GpuEvidence], during: list[GpuEvidence]) -> None:
        self.index = index
        self.before = before
        self.during = during

    def mean(self, attr: str, during: bool = True) -> float | None:
        return mean_of(getattr(g, attr) for g in (self.during if during else self.before))

    def last(self, attr: str) -> Any:
        return next((v for g in reversed(self.during) if (v := getattr(g, attr)) is not None), None)

    def clock_text(self) -> str:
        clock, top = self.mean("clock_sm_mhz"), self.last("clock_sm_max_mhz")
        return f"SM clock {num(clock)} of {num(top)} MHz"


def gpu_clues(clues: Clues) -> list[GpuClues]:
    indices = sorted({g.index for m in clues.during for g in m.gpus})
    out = []
    for index in indices:
        during = [g for m in clues.during for g in m.gpus if g.index == index]
        before = [g for m in clues.before for g in m.gpus if g.index == index]
        out.append(GpuClues(index, before, during))
    return out


def where_on(gpu: GpuClues, many: bool) -> str:
    return f"GPU {gpu.index}: " if many else ""


# ---- the rules, in order --------------------------------------------------------------------
