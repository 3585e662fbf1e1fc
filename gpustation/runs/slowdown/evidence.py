"""What a run's GPUs and the host were doing, a second at a time: what a cause is named from.

Each second the watch makes a :class:`Moment`: the run's GPUs as the
supervisor's telemetry sampler read them anyway (:func:`gpu_evidence` takes
its snapshot: nothing more is asked of NVML), and the host through psutil
(:class:`HostReader`: total CPU, swap in and out, the CPU of each of the
run's processes and, on Linux, how long they waited for one). An
:class:`EvidenceRing` keeps the last minute of them, so that when a slowdown
is confirmed the seconds before it and during it are both there to compare.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil

from gpustation.telemetry.model import Snapshot
from gpustation.textsafe import safe

MIB = 1024 * 1024
#: seconds of moments the ring keeps
RING_S = 60.0
#: ... and at most this many (a clock jump must not grow it)
RING_MAX = 240
#: the longest command line kept per process (enough to tell it)
COMMAND_CHARS = 120


@dataclass(frozen=True, slots=True)
class ProcessShare:
    """A process listed on a GPU, with its share of the SMs (None: the driver does not say)."""

    pid: int
    sm_pct: float | None = None
    user: str | None = None
    command: str | None = None


@dataclass(frozen=True, slots=True)
class GpuEvidence:
    """One GPU at one moment: what can hold a run back."""

    index: int
    #: every clocks-event reason the card gives (idle and application clocks too)
    throttle: tuple[str, ...] = ()
    clock_sm_mhz: float | None = None
    clock_sm_max_mhz: float | None = None
    temperature_c: float | None = None
    temperature_slowdown_c: float | None = None
    memory_temperature_c: float | None = None
    memory_temperature_max_c: float | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None
    utilization_pct: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    processes: tuple[ProcessShare, ...] = ()

    @property
    def pcie_below_max(self) -> bool | None:
        """Whether the link runs below the gen or width it can (None: not known)."""
        if self.pcie_gen is None or self.pcie_max_gen is None:
            return None
        narrow = (
            self.pcie_width is not None
            and self.pcie_max_width is not None
            and self.pcie_width < self.pcie_max_width
        )
        return self.pcie_gen < self.pcie_max_gen or narrow


@dataclass(frozen=True, slots=True)
class HostEvidence:
    """The host at one moment (None: not known yet, or not readable)."""

    cpu_pct: float | None = None
    cores: int | None = None
    swap_in_mib_s: float | None = None
    swap_out_mib_s: float | None = None
    #: (pid, CPU % of one core) of each of the run's processes
    run_cpu: tuple[tuple[int, float], ...] = ()
    #: of the time the run's processes were ready to run, the share they ran (%; the
    #: rest they waited on a run queue, Linux's /proc/PID/schedstat): what a host
    #: saturated by others costs them, whatever the run itself asks for
    run_on_cpu_pct: float | None = None
    #: the run's first process (the one the supervisor started)
    main_pid: int | None = None


@dataclass(frozen=True, slots=True)
class Moment:
    """The run's GPUs and the host at one time (Unix seconds)."""

    time: float
    gpus: tuple[GpuEvidence, ...] = ()
    host: HostEvidence = field(default_factory=HostEvidence)


def _text(value: str | None) -> str | None:
    return None if value is None else safe(value)[:COMMAND_CHARS]


def gpu_evidence(snapshot: Snapshot | None) -> tuple[GpuEvidence, ...]:
    """The GPUs of a snapshot, as evidence (none for a GPU lost or a snapshot missing)."""
    if snapshot is None:
        return ()
    out = []
    for gpu in snapshot.gpus:
        if gpu.lost:
            continue
        processes = tuple(
            ProcessShare(p.pid, p.sm_pct, _text(p.user), _text(p.command or p.name))
            for p in gpu.processes
            if p.kind != "holder"
        )
        out.append(
            GpuEvidence(
                index=gpu.index,
                throttle=tuple(gpu.throttle_reasons or ()),
                clock_sm_mhz=gpu.clock_sm_mhz,
                clock_sm_max_mhz=gpu.clock_sm_max_mhz,
                temperature_c=gpu.temperature_c,
                temperature_slowdown_c=gpu.temperature_slowdown_c,
                memory_temperature_c=gpu.memory_temperature_c,
                memory_temperature_max_c=gpu.memory_temperature_max_c,
                pcie_gen=gpu.pcie.gen,
                pcie_width=gpu.pcie.width,
                pcie_max_gen=gpu.pcie.max_gen,
                pcie_max_width=gpu.pcie.max_width,
                utilization_pct=gpu.utilization_gpu_pct,
                power_w=gpu.power_w,
                power_limit_w=gpu.power_limit_w,
                processes=processes,
            )
        )
    return tuple(out)


class HostReader:
    """The host's CPU and swap, and the run's processes' CPU, through psutil.

    Rates need two readings: the first call of each gives None for them.
    """

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self._procs: dict[int, Any] = {}
        self._sched: dict[int, tuple[int, int]] = {}
        self._cpu_primed = False
        self._swap: tuple[float, int, int] | None = None
        self.cores = psutil.cpu_count() or os.cpu_count()

    def read(self, pids: Iterable[int], main_pid: int | None = None) -> HostEvidence:
        cpu: float | None = None
        try:
            value = float(psutil.cpu_percent(interval=None))
            cpu = value if self._cpu_primed else None
            self._cpu_primed = True
        except (OSError, RuntimeError):
            pass
        swap_in = swap_out = None
        now = time.monotonic()
        try:
            swap = psutil.swap_memory()
            if self._swap is not None and now > self._swap[0]:
                dt = now - self._swap[0]
                swap_in = max(0.0, (swap.sin - self._swap[1]) / MIB / dt)
                swap_out = max(0.0, (swap.sout - self._swap[2]) / MIB / dt)
            self._swap = (now, int(swap.sin), int(swap.sout))
        except (OSError, RuntimeError, AttributeError):
            pass
        return HostEvidence(
            cpu_pct=cpu,
            cores=self.cores,
            swap_in_mib_s=swap_in,
            swap_out_mib_s=swap_out,
            run_cpu=self._run_cpu(set(pids)),
            main_pid=main_pid,
            run_on_cpu_pct=self.on_cpu(set(pids)),
        )

    def on_cpu(self, pids: set[int]) -> float | None:
        """Of the time the run's processes were ready since the last reading, the share
        (%) they ran (None on the first reading, or where /proc has no schedstat)."""
        sched: dict[int, tuple[int, int]] = {}
        for pid in pids:
            try:
                with open(f"{self.proc_root}/{pid}/schedstat", encoding="ascii") as fh:
                    ran, waited = fh.read().split()[:2]
                sched[pid] = (int(ran), int(waited))
            except (OSError, ValueError):
                continue
        before, self._sched = self._sched, sched
        on = off = 0
        for pid, (r, w) in sched.items():
            if pid in before:
                on += max(0, r - before[pid][0])
                off += max(0, w - before[pid][1])
        return 100.0 * on / (on + off) if on + off > 0 else None

    def _run_cpu(self, pids: set[int]) -> tuple[tuple[int, float], ...]:
        for gone in set(self._procs) - pids:
            del self._procs[gone]
        found = []
        for pid in sorted(pids):
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                    proc.cpu_percent(interval=None)  # the baseline: no figure yet
                    continue
                found.append((pid, float(proc.cpu_percent(interval=None))))
            except psutil.Error:
                self._procs.pop(pid, None)
        return tuple(found)


class EvidenceRing:
    """The last :data:`RING_S` seconds of moments."""

    def __init__(self, keep_s: float = RING_S, max_items: int = RING_MAX) -> None:
        self.keep_s = keep_s
        self._items: deque[Moment] = deque(maxlen=max_items)

    def add(self, moment: Moment) -> None:
        self._items.append(moment)
        while self._items and self._items[0].time < moment.time - self.keep_s:
            self._items.popleft()

    def between(self, start: float, end: float) -> list[Moment]:
        """The moments from ``start`` (included) to ``end`` (excluded), oldest first."""
        return [m for m in self._items if start <= m.time < end]

    def __len__(self) -> int:
        return len(self._items)
