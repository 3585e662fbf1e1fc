"""Each process's share of a shared GPU's power and energy.

A GPU's power reading and energy counter count every process on it as one.
The driver does say, per process, what share of the SMs' time it used since
the last read (``ProcessInfo.sm_pct``); a sample's shares follow from that:

- each process gets its SM share (the shares are scaled down to a whole when
  the driver's sampling makes them add up to more);
- the rest, the time the SMs were idle, is split evenly between the processes
  on the GPU. Evenly, not kept apart: the idle draw is the price of holding
  the card, which every process on it pays alike, and a process alone on its
  GPU then gets the whole counter, as a run alone on its GPU always has;
- ``idle``: all of it while no process is on the GPU;
- ``unattributed``: what cannot be told: the part of processes the driver
  gives no SM share for, when more than one process is on the GPU.

A sample's ``sm_pct`` covers the interval that ends at it. The counter is a
slow field, read less often than the shares, and a time-sliced GPU's shares
swing from sample to sample, so its rise is split by the shares of every
sample since the last reading, each weighted by the power it drew
(:class:`EnergySplit`). The parts are estimates: the SMs' time is not their
power (a memory-bound copy draws less per SM-second than a matmul).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpustation.telemetry.model import GpuSample, ProcessInfo
from gpustation.telemetry.slotted import field, record

#: the parts that are no process's
IDLE = "idle"
UNATTRIBUTED = "unattributed"


@record(frozen=True)
class Shares:
    """Fractions of a GPU's energy over one interval; they add up to 1."""

    processes: dict[int, float] = field(default_factory=dict)
    idle: float = 0.0
    unattributed: float = 0.0

    def of(self, pids: Iterable[int]) -> float:
        """The part of these processes together."""
        return sum(self.processes.get(pid, 0.0) for pid in set(pids))


def gpu_shares(processes: Sequence[ProcessInfo]) -> Shares:
    """The shares of a GPU's listed processes, from their SM shares."""
    by_pid: dict[int, float | None] = {}
    for proc in processes:
        sm = proc.sm_pct
        if isinstance(sm, (int, float)) and not isinstance(sm, bool) and sm >= 0:
            by_pid[proc.pid] = max(by_pid.get(proc.pid) or 0.0, float(sm))
        else:
            by_pid[proc.pid] = None
    if not by_pid:
        return Shares(idle=1.0)
    if len(by_pid) == 1:
        return Shares(processes={pid: 1.0 for pid in by_pid})
    known: dict[int, float] = {pid: sm / 100.0 for pid, sm in by_pid.items() if sm is not None}
    busy = sum(known.values())
    scale = 1.0 / busy if busy > 1.0 else 1.0
    shares = {pid: value * scale for pid, value in known.items()}
    rest = max(0.0, 1.0 - busy * scale)
    if len(known) < len(by_pid):
        # Whose the idle time and the unknown processes' work are, cannot be told.
        return Shares(processes=shares, unattributed=rest)
    even = rest / len(shares)
    return Shares(processes={pid: value + even for pid, value in shares.items()})


def fill_power(gpu: GpuSample) -> None:
    """Each listed process's ``power_w``: its share of the GPU's power now."""
    power = gpu.power_w
    if power is None or not gpu.processes:
        return
    shares = gpu_shares(gpu.processes)
    for proc in gpu.processes:
        part = shares.processes.get(proc.pid)
        proc.power_w = None if part is None else round(part * power, 1)


class EnergySplit:
    """The energy counters' rises, split between processes, idle and unattributed.

    :meth:`add` each sample of the GPUs in turn; :attr:`parts` keys are PIDs,
    :data:`IDLE` and :data:`UNATTRIBUTED`, in joules; :attr:`counted` is what
    the counters rose by in all, which the parts add up to.
    """

    def __init__(self) -> None:
        self.parts: dict[int | str, float] = {}
        self.counted = 0.0
        self._last: dict[int, float] = {}
        #: per GPU, the power-weighted shares of the samples since its counter last rose
        self._pending: dict[int, dict[int | str, float]] = {}

    def add(self, gpus: Iterable[GpuSample]) -> None:
        for gpu in gpus:
            if gpu.lost:
                continue
            before = self._last.get(gpu.index)
            if before is not None:
                self._gather(gpu)
            energy = gpu.energy_j
            if energy is None:
                continue
            self._last[gpu.index] = energy
            if before is None or energy <= before:
                continue  # the first reading, a counter not read again, or one reset
            rise = energy - before
            self.counted += rise
            pending = self._pending.pop(gpu.index, {})
            weight = sum(pending.values())
            for key, part in pending.items():
                self._put(key, part / weight * rise)

    def _gather(self, gpu: GpuSample) -> None:
        shares = gpu_shares(gpu.processes)
        drawn = gpu.power_w if gpu.power_w is not None and gpu.power_w > 0 else 1.0
        pending = self._pending.setdefault(gpu.index, {})
        parts: list[tuple[int | str, float]] = [*shares.processes.items()]
        parts += [(IDLE, shares.idle), (UNATTRIBUTED, shares.unattributed)]
        for key, part in parts:
            if part > 0:
                pending[key] = pending.get(key, 0.0) + part * drawn

    def _put(self, key: int | str, joules: float) -> None:
        if joules > 0:
            self.parts[key] = self.parts.get(key, 0.0) + joules
