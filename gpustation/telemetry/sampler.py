"""Builds :class:`Snapshot` objects from a backend and the host.

Fast fields are read on every call; slow ones (PCIe throughput, energy) only
when ``slow_interval_s`` has passed, so a fast refresh stays fast. Topology is
static and read once. Process names, users and commands come from psutil and
are cached per (pid, start time); each process's container from its cgroup,
and its part of the GPU's power from its SM share (``shares.py``).

The host fields of each GPU are filled here, for every backend alike:
``unowned_memory_mib`` (VRAM used that no listed process holds) on every
sample, and ``device_holders`` (processes holding the GPU's device node open
without being in NVML's list, from ``/proc``) on the first sample and then
every ``slow_interval_s``.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence

from gpustation.telemetry.backend import Backend, select_gpus
from gpustation.telemetry.containers import ContainerNames
from gpustation.telemetry.holders import device_node_holders
from gpustation.telemetry.host import HostSampler, describe_process
from gpustation.telemetry.model import GpuSample, ProcessInfo, Snapshot, Topology
from gpustation.telemetry.shares import fill_power


class Sampler:
    def __init__(
        self,
        backend: Backend,
        gpus: Sequence[int] | None = None,
        slow_interval_s: float = 5.0,
        with_host: bool = True,
        with_topology: bool = True,
        clock: Callable[[], float] = time.time,
        proc_root: str = "/proc",
        host: HostSampler | None = None,
    ) -> None:
        self.backend = backend
        self.gpus = select_gpus(backend, list(gpus) if gpus is not None else None)
        self.slow_interval_s = slow_interval_s
        # ``host``: one primed earlier, so that its rates cover more of the caller's time
        self.host = host if host is not None else HostSampler() if with_host else None
        self.with_topology = with_topology
        self._clock = clock
        self._last_slow = float("-inf")
        self.proc_root = proc_root
        #: who runs each GPU process: its container, systemd unit or Slurm job
        self.containers = ContainerNames(proc_root)
        self._holders: dict[int, set[int]] | None = None
        self._last_holders = float("-inf")
        self._topology: Topology | None = None
        self._hostname = _hostname()
        self._static = (
            backend.driver_version(),
            backend.library_version(),
            backend.compute_runtime_version(),
        )

    @property
    def read_gpm(self) -> bool:
        """Read the profiling metrics (GPM) with each sample: the dashboard turns
        it on while a card that shows them is on screen or a run is live."""
        return self.backend.read_gpm

    @read_gpm.setter
    def read_gpm(self, on: bool) -> None:
        self.backend.read_gpm = on

    def topology(self) -> Topology:
        if self._topology is None:
            self._topology = self.backend.topology(self.gpus)
        return self._topology

    def sample(self, slow: bool | None = None) -> Snapshot:
        """Take one snapshot; ``slow=None`` reads slow fields when they are due."""
        now = time.monotonic()
        if slow is None:
            slow = now - self._last_slow >= self.slow_interval_s
        if slow:
            self._last_slow = now
        if self.host is not None:
            self.host.prime()
        gpus = self.backend.read_gpus(self.gpus, slow=slow)
        for gpu in gpus:
            for proc in gpu.processes:
                # (the simulator names its own made-up processes; those it
                # leaves unnamed are real ones of this host)
                if proc.name is None:
                    describe_process(proc)
                    proc.container = self.containers.name(proc.pid)
            fill_power(gpu)
        self._host_fields(gpus, now)
        topology = self.topology() if self.with_topology else Topology()
        if topology.gpus:
            by_index = {g.index: g for g in gpus}
            for placement in topology.gpus:
                g = by_index.get(placement.index)
                placement.pcie_below_max = bool(g and g.pcie.below_max)
        host = self.host.sample() if self.host is not None else None
        driver, library, runtime = self._static
        snap = Snapshot(
            hostname=self._hostname,
            time=self._clock(),
            simulated=self.backend.simulated,
            driver_version=driver,
            library_version=library,
            compute_runtime_version=runtime,
            gpus=gpus,
            topology=topology,
            note=self.backend.note,
        )
        if host is not None:
            snap.host = host
        return snap

    def _host_fields(self, gpus: list[GpuSample], now: float) -> None:
        if self.backend.simulated:
            # The simulator says who holds its device nodes (poked in); /proc
            # knows nothing of simulated GPUs.
            for gpu in gpus:
                if not gpu.lost:
                    gpu.unowned_memory_mib = unowned_memory(gpu)
                    gpu.device_holders = gpu.device_holders or []
            return
        if now - self._last_holders >= self.slow_interval_s:
            self._last_holders = now
            self._holders = device_node_holders(self.proc_root, skip=os.getpid())
        holders = self._holders
        for gpu in gpus:
            if gpu.lost:
                continue
            gpu.unowned_memory_mib = unowned_memory(gpu)
            if holders is None or gpu.minor_number is None:
                continue
            listed = {p.pid for p in gpu.processes}
            if gpu.mig is not None:
                listed.update(p.pid for inst in gpu.mig.instances for p in inst.processes)
            found = []
            for pid in sorted(holders.get(gpu.minor_number, ())):
                if pid in listed:
                    continue
                proc = ProcessInfo(pid=pid, kind="holder")
                describe_process(proc)
                proc.container = self.containers.name(pid)
                found.append(proc)
            gpu.device_holders = found


def unowned_memory(gpu: GpuSample) -> float | None:
    """VRAM used minus what the listed processes hold (never below 0); None
    when the used memory or a process's share is unknown."""
    used = gpu.memory_used_mib
    if used is None or any(p.gpu_memory_mib is None for p in gpu.processes):
        return None
    return max(0.0, used - sum(p.gpu_memory_mib or 0.0 for p in gpu.processes))


def _hostname() -> str:
    """The host's name, as ``socket.gethostname()`` gives it, without importing socket."""
    try:
        return os.uname().nodename
    except AttributeError:  # Windows
        return socket.gethostname()


def ticks(interval_s: float) -> Iterator[None]:
    """Yield now, then every ``interval_s`` on a steady cadence (no drift; a late
    tick is not made up for)."""
    next_at = time.monotonic()
    while True:
        yield
        next_at += interval_s
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            next_at = time.monotonic()
