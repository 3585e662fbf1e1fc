"""The burn-in's NVML monitor on the fake pynvml: readings through the query
helper, the telemetry's throttle words, and errors reported, not swallowed."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

from gpustation.runners import burnin
from gpustation.runners.lib.burnin_monitor import Card, Monitor
from tests.runners.test_burnin import _results
from tests.runs.conftest import wait_until

H200 = Card(index=1)  # the fake's second GPU


@pytest.fixture
def monitor(fake_nvml: ModuleType) -> Iterator[Monitor]:
    mon = Monitor(torch.device("cpu"), interval=0.01, nvml=fake_nvml, card=H200)
    yield mon
    mon.stop()


def test_the_monitor_samples_the_gpu_and_its_xids_through_the_query_helper(
    fake_nvml: ModuleType, monitor: Monitor
) -> None:
    assert monitor.available, monitor.reason
    assert monitor.static["name"] == "NVIDIA H200"
    assert (monitor.static["pcie_gen_max"], monitor.static["xid_events_supported"]) == (5, True)
    fake_nvml.DRIVER.devices[1]["throttle"] = 0x004 | 0x040  # power cap and HW thermal
    monitor.start()
    fake_nvml.push_xid(1, 79)
    wait_until(lambda: monitor.samples >= 3 and monitor.xids, what="samples and the XID")
    monitor.stop()
    assert monitor.xids == [79]
    # the telemetry's names for the reasons (telemetry/model.py's table)
    assert set(monitor.throttled_s) == {"sw_power_cap", "hw_thermal"}
    assert monitor.thermal_s() == pytest.approx(monitor.throttled_s["hw_thermal"])
    assert monitor.after["ecc_uncorrected"] == 0 and monitor.errors() == []
    checks = {c["name"]: c for c in burnin.verdicts(*_results(), monitor)}
    assert checks["NVML readings"]["status"] == "pass"
    assert checks["XID errors"]["status"] == "fail"


def test_a_failing_reading_is_reported_not_swallowed(
    fake_nvml: ModuleType, monitor: Monitor
) -> None:
    fake_nvml.fail(1, "nvmlDeviceGetTemperature", fake_nvml.NVML_ERROR_UNKNOWN)
    reading = monitor.sample()
    assert reading["temp_c"] is None and reading["power_w"] is not None  # the others still read
    (error,) = monitor.errors()
    assert error.startswith("temp_c: nvmlDeviceGetTemperature") and "Unknown Error" in error
    checks = {c["name"]: c for c in burnin.verdicts(*_results(), monitor)}
    assert checks["NVML readings"]["status"] == "warn"
    assert "nvmlDeviceGetTemperature" in checks["NVML readings"]["detail"]


def test_a_gpu_lost_while_sampled_is_reported(fake_nvml: ModuleType, monitor: Monitor) -> None:
    monitor.start()
    wait_until(lambda: monitor.samples >= 1, what="a first sample")
    fake_nvml.lose_gpu(1)
    wait_until(lambda: any("lost" in e for e in monitor.errors()), what="the loss reported")
    monitor.stop()
    assert monitor.after == {}  # no counters from a card that is gone


def test_without_a_driver_the_monitor_says_why(fake_nvml: ModuleType) -> None:
    fake_nvml.reset(no_driver=True)
    mon = Monitor(torch.device("cpu"), nvml=fake_nvml, card=H200)
    assert not mon.available and "Driver Not Loaded" in mon.reason
