"""Host telemetry read from /proc agrees with psutil and computes rates."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from gpustation.telemetry import host
from gpustation.telemetry.model import ProcessInfo

pytestmark = pytest.mark.skipif(not host._LINUX, reason="the /proc readers are Linux only")


def test_memory_and_cores_agree_with_psutil() -> None:
    sampler = host.HostSampler()
    sampler.prime()
    sample = sampler.sample()
    vm = psutil.virtual_memory()
    assert sample.memory_total_mib == pytest.approx(vm.total / host.MIB, rel=0.01)
    assert sample.memory_used_mib == pytest.approx((vm.total - vm.available) / host.MIB, rel=0.2)
    assert sample.swap_total_mib == pytest.approx(psutil.swap_memory().total / host.MIB, abs=1)
    assert len(sample.cpu_per_core_pct) == psutil.cpu_count()
    assert sample.cpu_pct is not None and 0 <= sample.cpu_pct <= 100
    assert all(0 <= p <= 100 for p in sample.cpu_per_core_pct)
    assert sample.load_avg is not None and len(sample.load_avg) == 3


def test_busy_core_shows_up_as_cpu_use() -> None:
    sampler = host.HostSampler()
    sampler.prime()
    end = os.times().elapsed + 0.3
    while os.times().elapsed < end:  # keep one core busy for 0.3 s
        pass
    sample = sampler.sample()
    assert sample.cpu_pct is not None and sample.cpu_pct > 100 / (psutil.cpu_count() or 1) / 3


def test_rates_are_deltas_over_elapsed_time(monkeypatch: pytest.MonkeyPatch) -> None:
    counters = iter([(1000, 2000), (1000 + 5_000_000, 2000 + 1_000_000)])
    net = iter([(10, 20), (10 + 300_000, 20 + 100_000)])
    monkeypatch.setattr(host, "_proc_disk", lambda: next(counters))
    monkeypatch.setattr(host, "_proc_net", lambda: next(net))
    clock = iter([100.0, 102.0])
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    sampler = host.HostSampler()
    sampler.prime()
    sample = sampler.sample()
    assert sample.disk_read_bytes_s == pytest.approx(2_500_000)
    assert sample.disk_write_bytes_s == pytest.approx(500_000)
    assert sample.net_rx_bytes_s == pytest.approx(150_000)
    assert sample.net_tx_bytes_s == pytest.approx(50_000)


class FakeTime:
    """A monotonic clock that only ``sleep`` moves."""

    def __init__(self) -> None:
        self.t = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def test_cpu_use_is_the_change_since_the_baseline_not_the_average_since_boot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # /proc/stat counts since boot: (busy, total) jiffies, the machine then two cores.
    since_boot = [(40_000, 100_000), (20_000, 50_000), (20_000, 50_000)]
    later = [(40_018, 100_020), (20_010, 50_010), (20_008, 50_010)]
    readings = iter([since_boot, later])
    monkeypatch.setattr(host, "_proc_cpu_times", lambda: next(readings))
    clock = FakeTime()
    monkeypatch.setattr(host, "time", clock)
    sampler = host.HostSampler()
    sampler.prime()
    sample = sampler.sample()
    assert sample.cpu_pct == pytest.approx(90.0)  # 18 of 20 jiffies; since boot: 40 %
    assert sample.cpu_per_core_pct == pytest.approx([100.0, 80.0])


def test_the_first_cpu_reading_covers_a_minimum_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime()
    monkeypatch.setattr(host, "time", clock)
    sampler = host.HostSampler()
    sampler.prime()
    clock.t += host.min_cpu_interval_s() / 4  # reading the GPUs took a moment
    sampler.sample()
    # the first reading waited for the rest of the interval, the next ones do not wait
    assert sum(clock.slept) == pytest.approx(host.min_cpu_interval_s() * 3 / 4)
    clock.t += host.min_cpu_interval_s() / 4
    sampler.sample()
    assert len(clock.slept) == 1


def test_a_baseline_older_than_the_minimum_costs_no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime()
    monkeypatch.setattr(host, "time", clock)
    sampler = host.HostSampler()
    sampler.prime()
    clock.t += host.min_cpu_interval_s() * 2  # opening the backend took longer
    sampler.sample()
    assert clock.slept == []


def test_describe_process_fills_user_name_and_command() -> None:
    proc = ProcessInfo(pid=os.getpid())
    host.describe_process(proc)
    me = psutil.Process()
    assert proc.user == me.username()
    assert proc.name == me.name()
    assert proc.command == " ".join(me.cmdline())


def test_describe_process_leaves_an_unknown_pid_alone() -> None:
    proc = ProcessInfo(pid=2**22 + 12345)
    host.describe_process(proc)
    assert proc.user is None and proc.name is None and proc.command is None


@pytest.mark.parametrize(
    ("cores", "expected"), [(1, 0.05), (2, 0.05), (8, 0.02), (16, 0.01), (64, 0.01), (256, 0.01)]
)
def test_the_minimum_interval_shrinks_with_the_cores(cores: int, expected: float) -> None:
    # about 16 jiffies over all the cores together, between 10 and 50 ms
    assert host.min_cpu_interval_s(cores) == pytest.approx(expected)
