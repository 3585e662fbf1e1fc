"""The GPU figures of a run's phase (power, utilisation, each workload's SM share)
read from the fake pynvml: attributed by pid, and None with a reason where not known."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import ModuleType

import pytest

from gpustation.runners.lib import gpuwatch
from gpustation.runners.lib.gpuwatch import GpuWatch, visible_index

TRAIN_PID, INFER_PID, OTHER_PID = 31337, 31338, 999
PIDS = {"train": TRAIN_PID, "infer": INFER_PID}


def h200(**kw: object) -> dict[str, object]:
    return {"card": "h200", **kw}


def test_power_util_and_each_workload_s_sm_share_from_its_pid(fake_nvml: ModuleType) -> None:
    fake_nvml.reset(
        devices=[
            h200(
                power_mw=400_000,
                util_gpu=90,
                process_util=[[TRAIN_PID, 70, 20], [INFER_PID, 20, 5], [OTHER_PID, 9, 1]],
            )
        ]
    )
    dev = fake_nvml.DRIVER.devices[0]
    with GpuWatch(0, nvml=fake_nvml, env={}) as watch:
        watch.start(PIDS)
        watch.sample()
        dev.update(power_mw=500_000, util_gpu=100)
        dev["process_util"] = [[TRAIN_PID, 40, 20]]  # inference had no sample: it idled
        watch.sample()
        dev.update(power_mw=300_000, util_gpu=80)
        dev["process_util"] = [[TRAIN_PID, 70, 20], [INFER_PID, 20, 5]]
        gpu = watch.stop()  # the last reading is taken at the end
    assert gpu.samples == 3
    assert gpu.power_w_mean == pytest.approx(400.0) and gpu.power_w_peak == pytest.approx(500.0)
    assert gpu.util_pct_mean == pytest.approx(90.0)
    assert gpu.sm_pct["train"] == pytest.approx(60.0)
    assert gpu.sm_pct["infer"] == pytest.approx(40.0 / 3)
    assert gpu.gpu_note is None and gpu.sm_note is None
    fields = gpu.fields(("train", "infer"))
    assert fields["sm_pct_train"] == 60.0 and fields["sm_pct_infer"] == 13.3
    assert "gpu_note" not in fields and "sm_note" not in fields


def test_a_phase_starts_from_its_own_samples(fake_nvml: ModuleType) -> None:
    """What the driver sampled before the phase (the previous phase) is left out."""
    fake_nvml.reset(devices=[h200(process_util=[[TRAIN_PID, 90, 0]])])
    with GpuWatch(0, nvml=fake_nvml, env={}) as watch:
        watch.start({"infer": INFER_PID})
        fake_nvml.DRIVER.devices[0]["process_util"] = [[INFER_PID, 35, 0]]
        gpu = watch.stop()
    reads = fake_nvml.calls_of("nvmlDeviceGetProcessUtilization")
    # The reading at the start moved the driver's "last seen" on: the next asks from there.
    assert len(reads) == 2 and reads[1][1] > reads[0][1] == 0
    assert gpu.sm_pct == {"infer": 35.0}
    assert gpu.fields(("train", "infer"))["sm_pct_train"] is None  # training did not run


def test_the_gpu_the_workloads_ran_on_is_found_by_pid(fake_nvml: ModuleType) -> None:
    fake_nvml.reset(
        devices=[
            h200(power_mw=100_000, process_util=[[OTHER_PID, 50, 0]]),
            h200(power_mw=650_000, process_util=[[TRAIN_PID, 80, 0], [INFER_PID, 15, 0]]),
        ]
    )
    # CUDA_VISIBLE_DEVICES names GPU 0 (say, another device order), but the pids ran on 1.
    with GpuWatch(0, nvml=fake_nvml, env={"CUDA_VISIBLE_DEVICES": "0"}) as watch:
        watch.start(PIDS)
        gpu = watch.stop()
    assert gpu.power_w_mean == pytest.approx(650.0)
    assert gpu.sm_pct == {"train": 80.0, "infer": 15.0}


def test_pids_the_driver_never_names_give_no_share_not_zero(fake_nvml: ModuleType) -> None:
    fake_nvml.reset(
        devices=[
            h200(power_mw=100_000, process_util=[[OTHER_PID, 50, 0]]),
            h200(power_mw=650_000, process_util=[[OTHER_PID + 1, 80, 0]]),
        ]
    )
    # The run was given GPU 1; the driver's pids are of another namespace.
    with GpuWatch(0, nvml=fake_nvml, env={"CUDA_VISIBLE_DEVICES": "1"}) as watch:
        watch.start(PIDS)
        gpu = watch.stop()
    assert gpu.power_w_mean == pytest.approx(650.0)  # the run's own GPU
    assert gpu.sm_pct == {} and gpu.sm_note == gpuwatch.NO_PIDS
    fields = gpu.fields(("train", "infer"))
    assert fields["sm_pct_train"] is None and fields["sm_pct_infer"] is None


@pytest.mark.parametrize("how", ["not_supported", "function_not_found"])
def test_a_driver_without_per_process_utilisation_says_so(fake_nvml: ModuleType, how: str) -> None:
    fake_nvml.reset(devices=[h200(power_mw=420_000, process_util=[[TRAIN_PID, 70, 0]])])
    if how == "not_supported":
        fake_nvml.fail(0, "nvmlDeviceGetProcessUtilization", fake_nvml.NVML_ERROR_NOT_SUPPORTED)
    else:
        fake_nvml.function_not_found("nvmlDeviceGetProcessUtilization")
    with GpuWatch(0, nvml=fake_nvml, env={}) as watch:
        watch.start(PIDS)
        watch.sample()
        gpu = watch.stop()
    assert gpu.power_w_mean == pytest.approx(420.0) and gpu.gpu_note is None
    assert gpu.sm_pct == {} and gpu.sm_note == gpuwatch.NO_PROCESS_UTIL
    fields = gpu.fields(("train", "infer"))
    assert fields["sm_pct_train"] is None and fields["sm_note"] == gpuwatch.NO_PROCESS_UTIL


def test_power_and_utilisation_not_reported_are_none_with_the_reason(
    fake_nvml: ModuleType,
) -> None:
    fake_nvml.reset(devices=[h200(util_gpu=None, process_util=[[TRAIN_PID, 70, 0]])])
    fake_nvml.fail(0, "nvmlDeviceGetPowerUsage", fake_nvml.NVML_ERROR_NOT_SUPPORTED)
    with GpuWatch(0, nvml=fake_nvml, env={}) as watch:
        watch.start({"train": TRAIN_PID})
        gpu = watch.stop()
    assert gpu.power_w_mean is None and gpu.power_w_peak is None and gpu.util_pct_mean is None
    assert gpu.gpu_note == f"{gpuwatch.NO_POWER}; {gpuwatch.NO_UTIL}"
    assert gpu.sm_pct == {"train": 70.0}


def test_no_gpu_and_no_driver_give_none_and_the_reason(fake_nvml: ModuleType) -> None:
    cpu = GpuWatch(None, nvml=fake_nvml)
    cpu.start(PIDS)
    gpu = cpu.stop()
    assert gpu.gpu_note == gpu.sm_note == gpuwatch.NO_GPU
    assert gpu.fields(("train", "infer")) == {
        "power_w_mean": None,
        "power_w_peak": None,
        "util_pct_mean": None,
        "sm_pct_train": None,
        "sm_pct_infer": None,
        "gpu_note": "no GPU",
        "sm_note": "no GPU",
    }
    assert not fake_nvml.calls  # on the CPU NVML is not even started
    fake_nvml.reset(no_driver=True)
    with GpuWatch(0, nvml=fake_nvml) as watch:
        watch.start(PIDS)
        gone = watch.stop()
    assert gone.power_w_mean is None and gone.sm_pct == {}
    assert gone.gpu_note is not None and "NVML could not start" in gone.gpu_note


def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.005)


def test_the_thread_samples_while_the_phase_runs(fake_nvml: ModuleType) -> None:
    fake_nvml.reset(devices=[h200(power_mw=400_000, process_util=[[TRAIN_PID, 70, 0]])])
    with GpuWatch(0, nvml=fake_nvml, env={}, interval=0.01) as watch:
        watch.start({"train": TRAIN_PID})
        until(lambda: len(fake_nvml.calls_of("nvmlDeviceGetPowerUsage")) >= 3)
        gpu = watch.stop()
    assert gpu.samples >= 4 and gpu.sm_pct == {"train": 70.0}


def test_visible_devices_map_to_nvml_indices() -> None:
    uuids: list[str | None] = ["GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-bbbc-3333"]
    assert visible_index(1, {}, lambda: uuids) == 1
    assert visible_index(1, {"CUDA_VISIBLE_DEVICES": "3,2"}, lambda: uuids) == 2
    assert visible_index(0, {"CUDA_VISIBLE_DEVICES": "GPU-bbbc"}, lambda: uuids) == 2
    assert visible_index(0, {"CUDA_VISIBLE_DEVICES": "GPU-bbb"}, lambda: uuids) is None  # ambiguous
    assert visible_index(2, {"CUDA_VISIBLE_DEVICES": "0,1"}, lambda: uuids) is None
    assert visible_index(0, {"CUDA_VISIBLE_DEVICES": "MIG-xyz"}, lambda: uuids) is None


def test_a_phase_left_by_an_error_does_not_keep_sampling_into_the_next(
    fake_nvml: ModuleType,
) -> None:
    fake_nvml.reset(devices=[h200(process_util=[[TRAIN_PID, 70, 0], [INFER_PID, 20, 0]])])
    with GpuWatch(0, nvml=fake_nvml, env={}, interval=0.01) as watch:
        watch.start({"train": TRAIN_PID})  # never stopped: its workload failed
        until(lambda: len(fake_nvml.calls_of("nvmlDeviceGetPowerUsage")) >= 1)
        watch.start({"infer": INFER_PID})
        assert [t.name for t in threading.enumerate()].count("gpuwatch") == 1
        gpu = watch.stop()
    assert "gpuwatch" not in [t.name for t in threading.enumerate()]
    assert gpu.sm_pct == {"infer": 20.0}
