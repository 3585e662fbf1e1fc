"""Builds :class:`Snapshot` objects from a backend and the host.

Fast fields are read on every call; slow ones (PCIe throughput, energy) only
when ``slow_interval_s`` has passed, so a fast refresh stays fast. Topology is
static and read once. Process names, users and commands come from psutil and
are cached per (pid, start time).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence

from gpustation.telemetry.backend import Backend, select_gpus
from gpustation.telemetry.host import HostSampler, describe_process
from gpustation.telemetry.model import Snapshot, Topology


class Sampler:
    def __init__(
        self,
        backend: Backend,
        gpus: Sequence[int] | None = None,
        slow_interval_s: float = 5.0,
        with_host: bool = True,
        with_topology: bool = True,
        clock=time.time,
    ) -> None:
        self.backend = backend
        self.gpus = select_gpus(backend, list(gpus) if gpus is not None else None)
        self.slow_interval_s = slow_interval_s
        self.host = HostSampler() if with_host else None
        self.with_topology = with_topology
        self._clock = clock
        self._last_slow = float("-inf")
        self._topology: Topology | None = None
        self._hostname = _hostname()
        self._static = (
            backend.driver_version(),
            backend.nvml_version(),
            backend.cuda_driver_version(),
        )

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
                if proc.name is None and not self.backend.simulated:
                    describe_process(proc)
        topology = self.topology() if self.with_topology else Topology()
        if topology.gpus:
            by_index = {g.index: g for g in gpus}
            for placement in topology.gpus:
                g = by_index.get(placement.index)
                placement.pcie_below_max = bool(g and g.pcie.below_max)
        host = self.host.sample() if self.host is not None else None
        driver, nvml, cuda = self._static
        snap = Snapshot(
            hostname=self._hostname,
            time=self._clock(),
            simulated=self.backend.simulated,
            driver_version=driver,
            nvml_version=nvml,
            cuda_driver_version=cuda,
            gpus=gpus,
            topology=topology,
            note=self.backend.note,
        )
        if host is not None:
            snap.host = host
        return snap


def _hostname() -> str:
    """The host's name, as ``socket.gethostname()`` gives it, without importing socket."""
    try:
        return os.uname().nodename
    except AttributeError:  # Windows
        import socket

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
