"""The dashboard's budgets (gpustation/tui/budget.py) that hold on any machine."""

from __future__ import annotations

import threading
import time
from types import ModuleType

import pytest

from gpustation.telemetry.nvml import NvmlBackend, deep
from gpustation.tui import budget
from tests.conftest import XID_TIMINGS


def test_a_fast_pass_keeps_to_its_driver_call_budget(fake_nvml: ModuleType) -> None:
    backend = NvmlBackend(nvml=fake_nvml, sysfs_pci_root="/nonexistent/pci")
    try:
        backend.read_gpm = True
        gpus = range(backend.device_count())
        backend.read_gpus(gpus, slow=True)
        for _ in range(3):
            fake_nvml.calls.clear()
            backend.read_gpus(gpus, slow=False)
            names = [name for name, _ in fake_nvml.calls]
            assert len(names) <= budget.FAST_PASS_CALLS_PER_GPU * len(gpus), names
            assert "nvmlDeviceGetProcessUtilization" not in names  # a slow-pass reading
            assert not [n for n in names if "NvLink" in n or "Mig" in n]
    finally:
        backend.close()


def test_an_idle_xid_watcher_keeps_to_its_wake_budget_and_closes_in_time(
    fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in XID_TIMINGS.items():  # the shipped timings
        monkeypatch.setattr(deep, name, value)
    assert 60_000 / deep.XID_WAIT_MS <= budget.XID_WAKES_PER_MINUTE
    assert deep.XID_CLOSE_GRACE_S <= budget.XID_CLOSE_S
    backend = NvmlBackend(nvml=fake_nvml, sysfs_pci_root="/nonexistent/pci")
    start = time.monotonic()
    backend.close()
    assert time.monotonic() - start <= budget.XID_CLOSE_S
    fake_nvml.push_xid(0, 13)  # ends the wait in progress, so the watcher ends here
    deadline = time.monotonic() + 10
    while any(t.name == "gpustation-xid" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the watcher never ended"
        time.sleep(0.01)
    assert fake_nvml.calls_of("nvmlShutdown")
