"""Host telemetry: CPU, load, memory, disk and network rates, GPU process details.

Rates need two readings: :meth:`HostSampler.prime` takes the first (the
sampler calls it before reading the GPUs; ``gpustation snapshot`` before it
opens the backend) and :meth:`HostSampler.sample` the second, so a one-shot
snapshot measures over the time it spends anyway. CPU use is counted in
jiffies (a hundredth of a second per core), too coarse for a few
milliseconds: the first reading after :meth:`~HostSampler.prime` waits until
the counters of all the cores together have had time for about
:data:`CPU_TICKS` ticks since the baseline (:func:`min_cpu_interval_s`: 50 ms
on two cores, 20 ms on eight, 10 ms on sixteen or more): a figure to a few
per cent, for a wait of a few milliseconds on a many-core GPU host.

On Linux everything is read from ``/proc`` directly: importing psutil costs
more than a whole snapshot's reading of the host, and ``gpustation snapshot``
must stay fast. Elsewhere psutil does the work.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from gpustation.telemetry.model import HostSample, ProcessInfo
from gpustation.textsafe import safe

MIB = 1024 * 1024
_LINUX = sys.platform.startswith("linux") and os.path.exists("/proc/stat")
_SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device
# Whole disks only: partitions and virtual devices would count the same bytes twice.
_SKIP_DISK_PREFIXES = ("loop", "ram", "zram", "dm-", "md", "sr", "fd")


def _read(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as fh:
        return fh.read()


# ---- /proc readers (Linux) ----------------------------------------------------


def _proc_cpu_times() -> list[tuple[int, int]]:
    """(busy, total) jiffies: the total first, then one per core."""
    out = []
    for line in _read("/proc/stat").splitlines():
        if not line.startswith("cpu"):
            break
        values = [int(v) for v in line.split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        # guest time is already included in user and nice
        total = sum(values[:8])
        out.append((total - idle, total))
    return out


def _is_whole_disk(name: str) -> bool:
    """Disks, not their partitions (``/sys/block`` lists only whole devices)."""
    known = _WHOLE_DISK.get(name)
    if known is None:
        known = _WHOLE_DISK[name] = not name.startswith(_SKIP_DISK_PREFIXES) and (
            not os.path.isdir("/sys/block") or os.path.exists(f"/sys/block/{name}")
        )
    return known


# Device name -> whole disk or not: asked once per name, not on every sample.
_WHOLE_DISK: dict[str, bool] = {}


def _proc_disk() -> tuple[int, int] | None:
    read = written = 0
    try:
        text = _read("/proc/diskstats")
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 10 or not _is_whole_disk(parts[2]):
            continue
        read += int(parts[5]) * _SECTOR
        written += int(parts[9]) * _SECTOR
    return read, written


def _proc_net() -> tuple[int, int] | None:
    rx = tx = 0
    try:
        lines = _read("/proc/net/dev").splitlines()[2:]
    except OSError:
        return None
    for line in lines:
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            continue
        fields = rest.split()
        rx += int(fields[0])
        tx += int(fields[8])
    return rx, tx


def _proc_meminfo() -> dict[str, int]:
    info = {}
    for line in _read("/proc/meminfo").splitlines():
        key, _, value = line.partition(":")
        info[key] = int(value.split()[0]) * 1024
    return info


# ---- the sampler --------------------------------------------------------------

#: the longest the first CPU reading waits for its interval (see the module docstring)
MIN_CPU_INTERVAL_S = 0.05
#: jiffies (all cores together) the first CPU reading is measured over, at the least
CPU_TICKS = 16


def min_cpu_interval_s(cores: int | None = None) -> float:
    """The shortest interval the first CPU reading is measured over on ``cores`` cores."""
    cores = cores or os.cpu_count() or 1
    return min(MIN_CPU_INTERVAL_S, max(0.01, CPU_TICKS / (100.0 * cores)))


class HostSampler:
    def __init__(self) -> None:
        self._t: float | None = None
        self._disk: tuple[int, int] | None = None
        self._net: tuple[int, int] | None = None
        self._cpu: list[tuple[int, int]] | None = None
        self._primed = False
        #: the next sample is the first after prime: it waits for min_cpu_interval_s()
        self._first = True
        self._psutil: Any = None
        if not _LINUX:
            # platform: psutil only off Linux
            import psutil

            self._psutil = psutil

    def _counters(self) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        if _LINUX:
            return _proc_disk(), _proc_net()
        ps = self._psutil
        disk = net = None
        try:
            d = ps.disk_io_counters()
            if d is not None:
                disk = (d.read_bytes, d.write_bytes)
        except (OSError, RuntimeError):
            pass
        try:
            n = ps.net_io_counters()
            if n is not None:
                net = (n.bytes_recv, n.bytes_sent)
        except OSError:
            pass
        return disk, net

    def _cpu_pcts(self) -> tuple[float | None, list[float]]:
        if not _LINUX:
            ps = self._psutil
            return ps.cpu_percent(interval=None), list(ps.cpu_percent(interval=None, percpu=True))
        now = _proc_cpu_times()
        before, self._cpu = self._cpu, now
        if before is None or len(before) != len(now):
            return None, []
        pcts = []
        for (b0, t0), (b1, t1) in zip(before, now, strict=True):
            dt = t1 - t0
            pcts.append(round(100.0 * (b1 - b0) / dt, 1) if dt > 0 else 0.0)
        return pcts[0], pcts[1:]

    def prime(self) -> None:
        """Take the baseline for rates, unless a previous sample already did."""
        if self._primed:
            return
        self._t = time.monotonic()
        self._disk, self._net = self._counters()
        self._cpu_pcts()
        self._primed = True

    def sample(self) -> HostSample:
        self.prime()
        now = time.monotonic()
        if self._first:
            self._first = False
            short = min_cpu_interval_s() - (now - (self._t or now))
            if short > 0:
                time.sleep(short)  # the measuring interval itself, not a wait on anything
                now = time.monotonic()
        dt = max(now - (self._t or now), 1e-6)
        disk, net = self._counters()
        out = HostSample()
        out.cpu_pct, out.cpu_per_core_pct = self._cpu_pcts()
        try:
            out.load_avg = [round(x, 2) for x in os.getloadavg()]
        except OSError:
            out.load_avg = None
        self._memory(out)
        if disk is not None and self._disk is not None:
            out.disk_read_bytes_s = max(0.0, (disk[0] - self._disk[0]) / dt)
            out.disk_write_bytes_s = max(0.0, (disk[1] - self._disk[1]) / dt)
        if net is not None and self._net is not None:
            out.net_rx_bytes_s = max(0.0, (net[0] - self._net[0]) / dt)
            out.net_tx_bytes_s = max(0.0, (net[1] - self._net[1]) / dt)
        # This reading is the baseline of the next one.
        self._t, self._disk, self._net = now, disk, net
        return out

    def _memory(self, out: HostSample) -> None:
        if _LINUX:
            try:
                m = _proc_meminfo()
            except OSError:
                return
            total = m.get("MemTotal", 0)
            available = m.get("MemAvailable", m.get("MemFree", 0))
            out.memory_used_mib = round((total - available) / MIB, 1)
            out.memory_total_mib = round(total / MIB, 1)
            swap_total = m.get("SwapTotal", 0)
            out.swap_used_mib = round((swap_total - m.get("SwapFree", 0)) / MIB, 1)
            out.swap_total_mib = round(swap_total / MIB, 1)
            return
        vm = self._psutil.virtual_memory()
        out.memory_used_mib = round((vm.total - vm.available) / MIB, 1)
        out.memory_total_mib = round(vm.total / MIB, 1)
        sw = self._psutil.swap_memory()
        out.swap_used_mib = round(sw.used / MIB, 1)
        out.swap_total_mib = round(sw.total / MIB, 1)


# ---- GPU processes ------------------------------------------------------------

# (pid, start time) -> (user, name, command)
_PROC_CACHE: dict[tuple[int, str], tuple[str | None, str | None, str | None]] = {}


def _describe_linux(pid: int) -> tuple[tuple[int, str], tuple[str | None, str | None, str | None]]:
    base = f"/proc/{pid}"
    stat = _read(f"{base}/stat")
    # the name is in parentheses and may itself hold spaces or parentheses
    start = stat[stat.rindex(")") + 2 :].split()[19]
    key = (pid, start)
    cached = _PROC_CACHE.get(key)
    if cached is not None:
        return key, cached
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    try:
        uid = os.stat(base).st_uid
        # platform: POSIX only
        import pwd

        user: str | None = pwd.getpwuid(uid).pw_name
    except (KeyError, OSError):
        user = None
    try:
        with open(f"{base}/cmdline", "rb") as fh:
            raw = fh.read()
        command = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace") or name
    except OSError:
        command = name
    return key, (user, name, command)


def _describe_psutil(pid: int) -> tuple[tuple[int, str], tuple[str | None, str | None, str | None]]:
    # start-up time: psutil, only when processes are inspected
    import psutil

    p = psutil.Process(pid)
    key = (pid, str(p.create_time()))
    cached = _PROC_CACHE.get(key)
    if cached is not None:
        return key, cached
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
    return key, (user, name, command)


def describe_process(proc: ProcessInfo) -> None:
    """Fill user, name and command of a GPU process, if this host can see it."""
    try:
        key, details = (_describe_linux if _LINUX else _describe_psutil)(proc.pid)
    except Exception:
        # A process in another PID namespace (containers), or already gone.
        return
    # Any local user's argv can hold escape sequences (a retitled terminal, a
    # clipboard write): made safe once, here, for every renderer (rule 8).
    details = tuple(None if d is None else safe(d) for d in details)  # type: ignore[assignment]
    if len(_PROC_CACHE) > 4096:
        _PROC_CACHE.clear()
    _PROC_CACHE[key] = details
    proc.user, proc.name, proc.command = details
