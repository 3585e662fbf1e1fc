"""Host telemetry (CPU, load, memory, disk and network rates) through psutil.

Rates need two readings: :meth:`HostSampler.prime` takes the first (the
sampler calls it before reading the GPUs) and :meth:`HostSampler.sample` the
second, so a one-shot snapshot measures over the time it spends anyway.
"""

from __future__ import annotations

import os
import time

import psutil

from gpustation.telemetry.model import HostSample, ProcessInfo

MIB = 1024 * 1024


class HostSampler:
    def __init__(self) -> None:
        self._t: float | None = None
        self._disk: tuple[int, int] | None = None
        self._net: tuple[int, int] | None = None
        self._primed = False

    def _counters(self) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        disk = net = None
        try:
            d = psutil.disk_io_counters()
            if d is not None:
                disk = (d.read_bytes, d.write_bytes)
        except (OSError, RuntimeError):
            pass
        try:
            n = psutil.net_io_counters()
            if n is not None:
                net = (n.bytes_recv, n.bytes_sent)
        except OSError:
            pass
        return disk, net

    def prime(self) -> None:
        """Take the baseline for rates, unless a previous sample already did."""
        if self._primed:
            return
        self._t = time.monotonic()
        self._disk, self._net = self._counters()
        psutil.cpu_percent(interval=None)
        psutil.cpu_percent(interval=None, percpu=True)
        self._primed = True

    def sample(self) -> HostSample:
        self.prime()
        now = time.monotonic()
        dt = max(now - (self._t or now), 1e-6)
        disk, net = self._counters()
        out = HostSample()
        out.cpu_pct = psutil.cpu_percent(interval=None)
        out.cpu_per_core_pct = list(psutil.cpu_percent(interval=None, percpu=True))
        try:
            out.load_avg = [round(x, 2) for x in os.getloadavg()]
        except OSError:
            out.load_avg = None
        vm = psutil.virtual_memory()
        out.memory_used_mib = round((vm.total - vm.available) / MIB, 1)
        out.memory_total_mib = round(vm.total / MIB, 1)
        sw = psutil.swap_memory()
        out.swap_used_mib = round(sw.used / MIB, 1)
        out.swap_total_mib = round(sw.total / MIB, 1)
        if disk is not None and self._disk is not None:
            out.disk_read_bytes_s = max(0.0, (disk[0] - self._disk[0]) / dt)
            out.disk_write_bytes_s = max(0.0, (disk[1] - self._disk[1]) / dt)
        if net is not None and self._net is not None:
            out.net_rx_bytes_s = max(0.0, (net[0] - self._net[0]) / dt)
            out.net_tx_bytes_s = max(0.0, (net[1] - self._net[1]) / dt)
        # This reading is the baseline of the next one.
        self._t, self._disk, self._net = now, disk, net
        return out


# (pid, create_time) -> (user, name, command)
_PROC_CACHE: dict[tuple[int, float], tuple[str | None, str | None, str | None]] = {}


def describe_process(proc: ProcessInfo) -> None:
    """Fill user, name and command of a GPU process from psutil, if visible."""
    try:
        p = psutil.Process(proc.pid)
        key = (proc.pid, p.create_time())
        cached = _PROC_CACHE.get(key)
        if cached is None:
            with p.oneshot():
                try:
                    user: str | None = p.username()
                except (psutil.Error, KeyError):
                    user = None
                name = p.name()
                try:
                    command = " ".join(p.cmdline()) or name
                except psutil.Error:
                    command = name
            cached = (user, name, command)
            if len(_PROC_CACHE) > 4096:
                _PROC_CACHE.clear()
            _PROC_CACHE[key] = cached
        proc.user, proc.name, proc.command = cached
    except (psutil.Error, OSError):
        # A process in another PID namespace (containers) or already gone.
        pass
