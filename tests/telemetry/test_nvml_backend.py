"""The NVML backend against a fake pynvml that answers like a driver would."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from operator import attrgetter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpustation.errors import (
    EXIT_NEEDS_ROOT,
    EXIT_NO_DRIVER,
    EXIT_NOT_SUPPORTED,
    GpustationError,
    NeedsRootError,
    NoDriverError,
    NotSupportedError,
)
from gpustation.telemetry.backend import Control
from gpustation.telemetry.model import SLOW as SLOW_COST
from gpustation.telemetry.model import GpuSample, Snapshot, field_keys
from gpustation.telemetry.nvml import NvmlBackend
from gpustation.telemetry.nvml import backend as nvml_module
from gpustation.telemetry.nvml.reads import READS
from gpustation.telemetry.nvml.topology import (
    cpu_mask_to_ranges,
    normalize_bus_id,
    parse_cpu_list,
)
from gpustation.telemetry.sampler import Sampler
from tests.conftest import FAKE_NVML_DIR, REPO, child_env, gpustation_cmd

MIB = 1024 * 1024


@pytest.fixture
def open_backend(fake_nvml: ModuleType) -> Iterator[Callable[..., NvmlBackend]]:
    """Opens NvmlBackends on the fake and closes them after the test."""
    opened: list[NvmlBackend] = []

    def make(**kwargs: Any) -> NvmlBackend:
        # The fake's bus ids may exist in this machine's /sys: never read it.
        kwargs.setdefault("sysfs_pci_root", "/nonexistent/pci")
        backend = NvmlBackend(nvml=fake_nvml, **kwargs)
        opened.append(backend)
        return backend

    yield make
    for backend in opened:
        backend.close()


def read(backend: NvmlBackend, slow: bool = True) -> list[GpuSample]:
    return backend.read_gpus(range(backend.device_count()), slow=slow)


# ---- a healthy driver ----------------------------------------------------------------


def test_every_field_is_read_with_its_unit(open_backend: Callable[..., NvmlBackend]) -> None:
    backend = open_backend()
    rtx, h200 = read(backend)

    assert rtx.name == "NVIDIA GeForce RTX 4090"
    assert rtx.pci_bus_id == "00000000:01:00.0"  # decoded from bytes
    assert rtx.power_w == pytest.approx(285.5)  # mW -> W
    assert (rtx.power_limit_w, rtx.power_default_w) == (450, 450)
    assert (rtx.power_min_w, rtx.power_max_w) == (150, 600)
    assert rtx.energy_j == pytest.approx(91_234.567)  # mJ -> J
    assert (rtx.clock_sm_mhz, rtx.clock_sm_max_mhz) == (2520, 3105)
    assert (rtx.clock_mem_mhz, rtx.clock_mem_max_mhz) == (10501, 10501)
    # Memory info v2: used excludes the driver's reservation.
    assert (rtx.memory_used_mib, rtx.memory_total_mib) == (8192, 24564)
    assert (rtx.utilization_gpu_pct, rtx.utilization_memory_pct) == (97, 45)
    assert (rtx.encoder_utilization_pct, rtx.decoder_utilization_pct) == (7, 23)
    assert (h200.encoder_utilization_pct, h200.decoder_utilization_pct) == (0, 0)  # idle, not None
    assert rtx.fans_pct == [45, 47] and rtx.fan_control == ["auto", "auto"]
    assert rtx.pstate == 2
    assert rtx.throttle_reasons == ["sw_power_cap"] and rtx.power_throttled
    assert (rtx.pcie.gen, rtx.pcie.width, rtx.pcie.max_gen, rtx.pcie.max_width) == (4, 16, 4, 16)
    assert (rtx.pcie.tx_kib_s, rtx.pcie.rx_kib_s, rtx.pcie.replay_errors) == (1520, 20480, 0)
    assert (rtx.temperature_c, rtx.temperature_slowdown_c, rtx.temperature_shutdown_c) == (
        64,
        87,
        92,
    )
    assert rtx.ecc_uncorrected == 0
    procs = {p.pid: p for p in rtx.processes}
    assert procs[4242].kind == "compute" and procs[4242].gpu_memory_mib == 7680
    assert procs[1234].kind == "graphics" and procs[1234].gpu_memory_mib == 210
    # The sampler fills these from psutil; the backend leaves them alone.
    assert procs[4242].name is None and procs[4242].user is None

    assert h200.name == "NVIDIA H200" and h200.fans_pct == [] and h200.fan_control == []
    assert h200.throttle_reasons == ["gpu_idle"] and not h200.power_throttled
    assert h200.pcie.max_gen == 5
    assert backend.control.fan_count(1) == 0 and backend.control.fan_count(0) == 2

    assert backend.driver_version() == "580.159.04"
    assert str(backend.library_version()) == "NVML 13.580.159.04"
    assert str(backend.compute_runtime_version()) == "CUDA 13.0"
    # The H200's missing fans are NotSupported, which is not an error to report.
    assert backend.errors == {}


def test_sampler_builds_a_real_snapshot(open_backend: Callable[..., NvmlBackend]) -> None:
    snap = Sampler(open_backend(), with_host=False).sample(slow=True)
    assert not snap.simulated and snap.driver_version == "580.159.04"
    doc = json.loads(json.dumps(snap.to_dict()))
    again = Snapshot.from_dict(doc)
    assert [g.name for g in again.gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA H200"]
    assert again.topology.link(0, 1) is not None


# ---- every field failing on its own --------------------------------------------------

# field id -> (the pynvml functions behind it, the sample attributes it fills)
FIELDS: dict[str, tuple[list[str], list[str]]] = {
    "uuid": (["nvmlDeviceGetUUID"], ["uuid"]),
    "name": (["nvmlDeviceGetName"], ["name"]),
    "pci_bus_id": (["nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo"], ["pci_bus_id"]),
    "temperature": (["nvmlDeviceGetTemperature"], ["temperature_c"]),
    "thresholds": (
        ["nvmlDeviceGetTemperatureThreshold"],
        ["temperature_slowdown_c", "temperature_shutdown_c"],
    ),
    "power": (["nvmlDeviceGetPowerUsage"], ["power_w"]),
    "power_limit": (
        ["nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"],
        ["power_limit_w"],
    ),
    "power_default": (["nvmlDeviceGetPowerManagementDefaultLimit"], ["power_default_w"]),
    "power_range": (
        ["nvmlDeviceGetPowerManagementLimitConstraints"],
        ["power_min_w", "power_max_w"],
    ),
    "energy": (["nvmlDeviceGetTotalEnergyConsumption"], ["energy_j"]),
    "clocks": (["nvmlDeviceGetClockInfo"], ["clock_sm_mhz", "clock_mem_mhz"]),
    "max_clocks": (["nvmlDeviceGetMaxClockInfo"], ["clock_sm_max_mhz", "clock_mem_max_mhz"]),
    "memory": (
        ["nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo"],
        ["memory_used_mib", "memory_total_mib"],
    ),
    "utilization": (
        ["nvmlDeviceGetUtilizationRates"],
        ["utilization_gpu_pct", "utilization_memory_pct"],
    ),
    "encoder": (["nvmlDeviceGetEncoderUtilization"], ["encoder_utilization_pct"]),
    "decoder": (["nvmlDeviceGetDecoderUtilization"], ["decoder_utilization_pct"]),
    "fans": (["nvmlDeviceGetFanSpeed_v2"], ["fans_pct"]),
    "fan_control": (["nvmlDeviceGetFanControlPolicy_v2"], ["fan_control"]),
    "pstate": (["nvmlDeviceGetPerformanceState"], ["pstate"]),
    "throttle": (
        ["nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"],
        ["throttle_reasons"],
    ),
    "pcie_gen": (["nvmlDeviceGetCurrPcieLinkGeneration"], ["pcie.gen"]),
    "pcie_width": (["nvmlDeviceGetCurrPcieLinkWidth"], ["pcie.width"]),
    "pcie_max_gen": (["nvmlDeviceGetMaxPcieLinkGeneration"], ["pcie.max_gen"]),
    "pcie_max_width": (["nvmlDeviceGetMaxPcieLinkWidth"], ["pcie.max_width"]),
    "pcie_throughput": (["nvmlDeviceGetPcieThroughput"], ["pcie.tx_kib_s", "pcie.rx_kib_s"]),
    "pcie_replay": (["nvmlDeviceGetPcieReplayCounter"], ["pcie.replay_errors"]),
    "ecc": (["nvmlDeviceGetTotalEccErrors"], ["ecc_uncorrected"]),
    "processes": (
        [
            f"nvmlDevice{kind}RunningProcesses{version}"
            for kind in ("GetCompute", "GetGraphics")
            for version in ("_v3", "_v2", "")
        ],
        ["processes"],
    ),
}
ALL_ATTRS = [attr for _, attrs in FIELDS.values() for attr in attrs]


def present(sample: GpuSample, attr: str) -> bool:
    value = attrgetter(attr)(sample)
    return value is not None and value != []


@pytest.mark.parametrize("field", list(FIELDS))
@pytest.mark.parametrize("code", ["NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_UNKNOWN"])
def test_one_field_failing_leaves_every_other_field(
    fake_nvml: ModuleType,
    open_backend: Callable[..., NvmlBackend],
    field: str,
    code: str,
) -> None:
    functions, attrs = FIELDS[field]
    for name in functions:
        fake_nvml.fail(0, name, getattr(fake_nvml, code))
    backend = open_backend()
    rtx, h200 = read(backend)

    for attr in ALL_ATTRS:
        assert present(rtx, attr) is (attr not in attrs), attr
    assert not rtx.lost
    # The other GPU does not notice.
    assert h200.name == "NVIDIA H200" and h200.power_w is not None and not h200.lost
    if code == "NVML_ERROR_UNKNOWN":
        # A real error is kept for a debug view; NotSupported is just "n/a".
        assert any(index == 0 for index, _ in backend.errors)
    else:
        assert backend.errors == {}


def test_not_supported_is_not_asked_again(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.fail(0, "nvmlDeviceGetPowerUsage", fake_nvml.NVML_ERROR_NOT_SUPPORTED)
    backend = open_backend()
    for _ in range(3):
        rtx, h200 = read(backend, slow=False)
        assert rtx.power_w is None and h200.power_w is not None
    assert fake_nvml.calls_of("nvmlDeviceGetPowerUsage").count((0,)) == 1
    assert fake_nvml.calls_of("nvmlDeviceGetPowerUsage").count((1,)) == 3


def test_other_errors_are_recorded_and_retried(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.fail(1, "nvmlDeviceGetTemperature", fake_nvml.NVML_ERROR_NO_PERMISSION)
    backend = open_backend()
    assert read(backend)[1].temperature_c is None
    assert "Insufficient Permissions" in backend.errors[(1, "temperature_c")]
    fake_nvml.heal(1, "nvmlDeviceGetTemperature")
    assert read(backend)[1].temperature_c == 36


# ---- missing functions and versioned fallbacks --------------------------------------


def test_function_not_found_is_remembered(
    fake_nvml: ModuleType,
    open_backend: Callable[..., NvmlBackend],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gpustation.telemetry.nvml.query")
    fake_nvml.function_not_found("nvmlDeviceGetCurrentClocksEventReasons")
    backend = open_backend()
    for _ in range(3):
        rtx, h200 = read(backend, slow=False)
        # The older name still answers.
        assert rtx.throttle_reasons == ["sw_power_cap"]
        assert h200.throttle_reasons == ["gpu_idle"]
    assert len(fake_nvml.calls_of("nvmlDeviceGetCurrentClocksEventReasons")) == 1
    assert len(fake_nvml.calls_of("nvmlDeviceGetCurrentClocksThrottleReasons")) == 6
    assert "nvmlDeviceGetCurrentClocksEventReasons" in backend.missing_functions
    assert backend.errors == {}
    # said once in the log, not on every read
    said = [r for r in caplog.records if "nvmlDeviceGetCurrentClocksEventReasons" in r.getMessage()]
    assert len(said) == 1


def test_function_absent_from_an_old_pynvml_falls_back(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.remove_function("nvmlDeviceGetComputeRunningProcesses_v3")
    fake_nvml.remove_function("nvmlDeviceGetCurrentClocksEventReasons")
    backend = open_backend()
    rtx = read(backend)[0]
    assert 4242 in {p.pid for p in rtx.processes}
    assert fake_nvml.calls_of("nvmlDeviceGetComputeRunningProcesses_v2")
    assert rtx.throttle_reasons == ["sw_power_cap"]
    assert fake_nvml.calls_of("nvmlDeviceGetCurrentClocksThrottleReasons")
    assert {
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetCurrentClocksEventReasons",
    } <= backend.missing_functions


def test_processes_fall_back_to_v1_and_unavailable_memory_is_none(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.reset(
        devices=[
            {
                "compute_procs": [[10, fake_nvml.NVML_VALUE_NOT_AVAILABLE_ULONGLONG], [11, None]],
                "graphics_procs": [[10, 64 * MIB]],
            }
        ]
    )
    for version in ("_v3", "_v2"):
        fake_nvml.function_not_found(f"nvmlDeviceGetComputeRunningProcesses{version}")
        fake_nvml.remove_function(f"nvmlDeviceGetGraphicsRunningProcesses{version}")
    procs = {p.pid: p for p in read(open_backend())[0].processes}
    # pid 10 is both compute and graphics: one entry, with the memory NVML knows.
    assert sorted(procs) == [10, 11]
    assert procs[10].gpu_memory_mib == 64 and procs[10].kind == "compute"
    assert procs[11].gpu_memory_mib is None


@pytest.mark.parametrize(
    "code", ["NVML_ERROR_ARGUMENT_VERSION_MISMATCH", "NVML_ERROR_FUNCTION_NOT_FOUND"]
)
def test_memory_v2_refused_falls_back_to_v1(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend], code: str
) -> None:
    # A refused version is not asked again of that GPU; a function the driver
    # lacks is not asked again in this process.
    fake_nvml.fail(None, "nvmlDeviceGetMemoryInfo_v2", getattr(fake_nvml, code))
    backend = open_backend()
    for _ in range(3):
        rtx = read(backend, slow=False)[0]
        # v1 counts the reservation (372 MiB) as used.
        assert (rtx.memory_used_mib, rtx.memory_total_mib) == (8192 + 372, 24564)
    # Tried once per GPU (or once at all when the driver lacks it), then v1 only.
    tries = 1 if code == "NVML_ERROR_FUNCTION_NOT_FOUND" else 2
    assert len(fake_nvml.calls_of("nvmlDeviceGetMemoryInfo_v2")) == tries


def test_memory_info_without_version_argument_falls_back(
    fake_nvml: ModuleType,
    open_backend: Callable[..., NvmlBackend],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    v1 = fake_nvml.nvmlDeviceGetMemoryInfo

    def old_signature(handle: Any) -> Any:  # an old pynvml: no version= argument
        return v1(handle)

    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetMemoryInfo", old_signature)
    rtx = read(open_backend())[0]
    assert rtx.memory_used_mib == 8192 + 372


# ---- lost GPUs ----------------------------------------------------------------------


def test_a_lost_gpu_is_marked_and_the_others_keep_reporting(
    fake_nvml: ModuleType,
    open_backend: Callable[..., NvmlBackend],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = open_backend()
    read(backend)
    fake_nvml.lose_gpu(1)
    rtx, h200 = read(backend)
    assert not rtx.lost and rtx.power_w is not None and rtx.energy_j is not None
    assert h200.lost
    # It keeps its identity and nothing else: no stale numbers.
    assert (h200.name, h200.uuid, h200.pci_bus_id) == (
        "NVIDIA H200",
        "GPU-be6fbabe-98e6-a75f-51f9-54038a182998",
        "00000000:00:06.0",
    )
    empty = GpuSample(index=1)
    for attr in ALL_ATTRS:
        if attr not in ("uuid", "name", "pci_bus_id"):
            assert attrgetter(attr)(h200) == attrgetter(attr)(empty), attr

    # Not read again at full cost on every refresh.
    before = sum(1 for _, args in fake_nvml.calls if args[:1] == (1,))
    for _ in range(3):
        assert read(backend)[1].lost
    after = sum(1 for _, args in fake_nvml.calls if args[:1] == (1,))
    assert after == before

    # Once the retry interval has passed and the card answers again, it is back.
    fake_nvml.recover_gpu(1)
    monkeypatch.setattr(nvml_module, "LOST_RETRY_S", 0.0)
    h200 = read(backend)[1]
    assert not h200.lost and h200.temperature_c == 36


def test_a_gpu_lost_before_opening_is_reported_lost(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.lose_gpu(0)
    backend = open_backend()
    assert backend.device_count() == 2
    rtx, h200 = read(backend)
    assert rtx.lost and rtx.index == 0 and rtx.name is None
    assert not h200.lost and h200.name == "NVIDIA H200"
    topo = backend.topology([0, 1])
    assert topo.link(0, 1) is not None and topo.link(0, 1).level is None  # type: ignore[union-attr]
    assert topo.gpus[1].numa_node == 1


def test_a_gpu_lost_during_a_slow_read_is_marked(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    backend = open_backend()
    fake_nvml.fail(1, "nvmlDeviceGetTotalEnergyConsumption", fake_nvml.NVML_ERROR_GPU_IS_LOST)
    rtx, h200 = read(backend, slow=True)
    assert h200.lost and not rtx.lost and rtx.energy_j is not None


# ---- no driver ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "text"),
    [
        ("NVML_ERROR_DRIVER_NOT_LOADED", "Driver Not Loaded"),
        ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML Shared Library Not Found"),
        ("NVML_ERROR_NO_PERMISSION", "Insufficient Permissions"),
    ],
)
def test_no_driver_is_a_clear_error(fake_nvml: ModuleType, code: str, text: str) -> None:
    fake_nvml.reset(no_driver=getattr(fake_nvml, code))
    with pytest.raises(NoDriverError) as info:
        NvmlBackend(nvml=fake_nvml)
    assert info.value.exit_code == EXIT_NO_DRIVER == 3
    message = str(info.value)
    assert text in message and "--simulate" in message


def test_no_driver_gives_no_fake_data(fake_nvml: ModuleType) -> None:
    from gpustation.telemetry.registry import open_backend

    fake_nvml.reset(no_driver=True)
    # ``import pynvml`` inside the backend meets the fake; no simulator steps in.
    with pytest.raises(NoDriverError, match="Driver Not Loaded"):
        open_backend()


def test_a_broken_library_is_a_clear_error(
    fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> None:
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setattr(fake_nvml, "nvmlInit", broken)
    with pytest.raises(NoDriverError, match=r"libnvidia-ml\.so\.1.*--simulate"):
        NvmlBackend(nvml=fake_nvml)


def test_close_shuts_nvml_down(fake_nvml: ModuleType) -> None:
    backend = NvmlBackend(nvml=fake_nvml)
    read(backend)
    assert fake_nvml.DRIVER.initialized == 1
    backend.close()
    backend.close()
    assert fake_nvml.DRIVER.initialized == 0


# ---- slow fields -------------------------------------------------------------------------

SLOW = ("nvmlDeviceGetPcieThroughput", "nvmlDeviceGetTotalEnergyConsumption")


def test_slow_fields_only_when_asked_and_reused_between(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    backend = open_backend()
    rtx = read(backend, slow=False)[0]
    assert rtx.energy_j is None and rtx.pcie.tx_kib_s is None
    assert not any(fake_nvml.calls_of(name) for name in SLOW)

    rtx = read(backend, slow=True)[0]
    assert rtx.energy_j == pytest.approx(91_234.567) and rtx.pcie.rx_kib_s == 20480
    assert len(fake_nvml.calls_of("nvmlDeviceGetPcieThroughput")) == 4  # tx+rx, 2 GPUs

    fake_nvml.DRIVER.devices[0]["energy_mj"] = 92_000_000
    fake_nvml.DRIVER.devices[0]["power_mw"] = 300_000
    rtx = read(backend, slow=False)[0]
    assert rtx.energy_j == pytest.approx(91_234.567)  # the last slow value, reused
    assert rtx.power_w == 300  # fast fields are fresh
    assert len(fake_nvml.calls_of("nvmlDeviceGetPcieThroughput")) == 4

    assert read(backend, slow=True)[0].energy_j == 92_000


def test_the_slow_pass_reads_the_functions_declared_slow(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    declared = {
        nvml_read.function
        for key, spec in field_keys().items()
        if spec.cost == SLOW_COST and (nvml_read := READS[key]) is not None
    }
    assert "nvmlDeviceGetPcieReplayCounter" in declared
    backend = open_backend()
    fake_nvml.calls.clear()
    read(backend, slow=False)
    assert not {name for name, _ in fake_nvml.calls} & declared
    read(backend, slow=True)
    assert {name for name, _ in fake_nvml.calls} >= declared


def test_slow_getters_of_all_gpus_run_side_by_side(
    fake_nvml: ModuleType,
    open_backend: Callable[..., NvmlBackend],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each PCIe throughput call waits until tx and rx of both GPUs are in
    # flight at once; read one after another, the barrier would break.
    barrier = threading.Barrier(4, timeout=30)
    original = fake_nvml.nvmlDeviceGetPcieThroughput

    def slow_throughput(handle: Any, counter: int) -> int:
        barrier.wait()
        return int(original(handle, counter))

    backend = open_backend()
    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetPcieThroughput", slow_throughput)
    rtx, h200 = read(backend, slow=True)
    assert (rtx.pcie.tx_kib_s, rtx.pcie.rx_kib_s) == (1520, 20480)
    assert (h200.pcie.tx_kib_s, h200.pcie.rx_kib_s) == (732, 697)
    assert backend.errors == {}


def test_energy_left_out_when_the_reader_does_not_show_it(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    # The driver spends milliseconds of CPU on each energy read; the dashboard
    # never shows the counter, so its backend does not ask.
    backend = open_backend()
    backend.read_energy = False
    fake_nvml.calls.clear()
    samples = read(backend, slow=True)
    assert not fake_nvml.calls_of("nvmlDeviceGetTotalEnergyConsumption")
    assert [s.energy_j for s in samples] == [None, None]
    assert samples[1].pcie.tx_kib_s == 732  # the other slow fields still come
    backend.read_energy = True
    assert read(backend, slow=True)[1].energy_j is not None


def test_ecc_left_out_when_the_reader_does_not_show_it(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    # The snapshot table does not print the ECC counter, whose first read
    # costs the driver about 2 ms.
    backend = open_backend()
    fake_nvml.DRIVER.devices[0]["ecc_uncorrected"] = 3
    backend.read_ecc = False
    fake_nvml.calls.clear()
    samples = read(backend, slow=False)
    assert not fake_nvml.calls_of("nvmlDeviceGetTotalEccErrors")
    assert [s.ecc_uncorrected for s in samples] == [None, None]
    assert samples[0].temperature_c is not None
    backend.read_ecc = True
    assert read(backend, slow=False)[0].ecc_uncorrected == 3


def test_a_read_leaves_no_call_running_and_close_shuts_nvml_down(
    fake_nvml: ModuleType, tmp_path: Path
) -> None:
    for one_shot in (False, True):
        fake_nvml.calls.clear()
        backend = NvmlBackend(nvml=fake_nvml, one_shot=one_shot, static_cache=str(tmp_path / "c"))
        read(backend, slow=True)
        # every slow call has answered before read_gpus returns
        assert not [t for t in threading.enumerate() if t.name == "gpustation-nvml"]
        backend.close()
        assert len(fake_nvml.calls_of("nvmlShutdown")) == 1


# ---- topology ----------------------------------------------------------------------------

BUS = ["00000000:01:00.0", "00000000:41:00.0", "00000000:81:00.0", "00000000:C1:00.0"]


def four_gpus(fake: ModuleType) -> None:
    t = fake
    fake.reset(
        devices=[
            {
                "card": "h200",
                "bus_id": BUS[0],
                "nvlinks": [BUS[1], BUS[1], "", BUS[1], BUS[1], BUS[1], BUS[1]],
                "topology": {2: t.NVML_TOPOLOGY_SINGLE, 3: t.NVML_TOPOLOGY_SYSTEM},
                "p2p": {3: t.NVML_P2P_STATUS_NOT_SUPPORTED},
                "numa_node": 0,
                "cpu_affinity": [*range(0, 8), *range(64, 72)],
                "errors": {},
            },
            {
                "card": "h200",
                "bus_id": BUS[1],
                "nvlinks": [BUS[0]] * 6,
                "topology": {2: t.NVML_TOPOLOGY_MULTIPLE, 3: t.NVML_TOPOLOGY_HOSTBRIDGE},
                "errors": {},
            },
            {"card": "h200", "bus_id": BUS[2], "topology": {3: t.NVML_TOPOLOGY_NODE}},
            {"card": "h200", "bus_id": BUS[3]},
        ]
    )


def test_topology_levels_nvlink_and_p2p(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    four_gpus(fake_nvml)
    backend = open_backend()
    topo = backend.topology([0, 1, 2, 3])

    def level(a: int, b: int) -> str | None:
        link = topo.link(a, b)
        assert link is not None
        return link.level

    link01 = topo.link(0, 1)
    assert link01 is not None and link01.nvlink_count == 6 and link01.level == "NV6"
    assert level(0, 2) == "PIX"
    assert level(0, 3) == "SYS"
    assert level(1, 2) == "PXB"
    assert level(1, 3) == "PHB"
    assert level(2, 3) == "NODE"
    assert len(topo.links) == 6  # each pair once
    link03 = topo.link(0, 3)
    assert link03 is not None and link03.p2p_read is False and link03.p2p_write is False
    link02 = topo.link(0, 2)
    assert link02 is not None and link02.p2p_read is True and link02.p2p_write is True

    assert topo.gpus[0].numa_node == 0
    assert topo.gpus[0].cpu_affinity == ("0-7,64-71" if (os.cpu_count() or 1) > 64 else "0-7")
    assert topo.gpus[1].cpu_affinity == "16-31"


def test_gpus_on_nvswitches_are_linked_through_them(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    sw = fake_nvml.SWITCH
    fake_nvml.reset(
        devices=[
            {"card": "h200", "bus_id": BUS[i], "nvlinks": [sw] * 18, "errors": {}} for i in range(3)
        ]
        + [{"card": "h200", "bus_id": BUS[3], "nvlinks": [sw] * 12 + [""] * 6, "errors": {}}]
    )
    topo = open_backend().topology([0, 1, 2, 3])
    counts = {(link.gpu_a, link.gpu_b): (link.level, link.nvlink_count) for link in topo.links}
    assert counts[(0, 1)] == counts[(1, 2)] == ("NV18", 18)
    assert counts[(0, 3)] == ("NV12", 12)  # the lesser side decides


def test_topology_not_supported_leaves_levels_unknown(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.fail(None, "nvmlDeviceGetTopologyCommonAncestor", fake_nvml.NVML_ERROR_NOT_SUPPORTED)
    fake_nvml.fail(None, "nvmlDeviceGetP2PStatus", fake_nvml.NVML_ERROR_NOT_SUPPORTED)
    backend = open_backend()
    link = backend.topology([0, 1]).link(0, 1)
    assert link is not None
    assert (link.level, link.p2p_read, link.p2p_write, link.nvlink_count) == (None, None, None, 0)
    assert backend.errors == {}


def test_numa_node_from_sysfs_when_nvml_lacks_it(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend], tmp_path: Path
) -> None:
    fake_nvml.remove_function("nvmlDeviceGetNumaNodeId")
    (tmp_path / "0000:01:00.0").mkdir()
    (tmp_path / "0000:01:00.0" / "numa_node").write_text("1\n")
    (tmp_path / "0000:00:06.0").mkdir()
    (tmp_path / "0000:00:06.0" / "numa_node").write_text("-1\n")
    topo = open_backend(sysfs_pci_root=str(tmp_path), sysfs_node_root=str(tmp_path / "none"))
    assert [g.numa_node for g in topo.topology([0, 1]).gpus] == [1, None]


def test_numa_node_from_the_cpus_near_the_gpu_when_nothing_else_says(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend], tmp_path: Path
) -> None:
    # A VM: the GPU reports no NUMA node, the kernel says -1, but the GPU's
    # CPU affinity lies inside one node (nvidia-smi prints that node).
    fake_nvml.remove_function("nvmlDeviceGetNumaNodeId")
    nodes = tmp_path / "nodes"
    for node, cpus in (("node0", "0-15\n"), ("node1", "16-31\n")):
        (nodes / node).mkdir(parents=True)
        (nodes / node / "cpulist").write_text(cpus)
    backend = open_backend(sysfs_pci_root=str(tmp_path / "pci"), sysfs_node_root=str(nodes))
    topo = backend.topology([0, 1])
    # the fake RTX 4090 sits by CPUs 0-15, the H200 by CPUs 16-31
    assert [g.cpu_affinity for g in topo.gpus] == ["0-15", "16-31"]
    assert [g.numa_node for g in topo.gpus] == [0, 1]


def test_cpu_affinity_from_sysfs_before_nvml(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend], tmp_path: Path
) -> None:
    # The kernel's local_cpulist answers at once; NVML's call is slow on
    # real cards, so it is asked only for a GPU sysfs says nothing about.
    (tmp_path / "0000:01:00.0").mkdir()
    (tmp_path / "0000:01:00.0" / "local_cpulist").write_text("0-3,8\n")
    backend = open_backend(sysfs_pci_root=str(tmp_path))
    fake_nvml.calls.clear()
    topo = backend.topology([0, 1])
    assert [g.cpu_affinity for g in topo.gpus] == ["0-3,8", "16-31"]
    # only for the GPU without a local_cpulist
    assert [a[0] for a in fake_nvml.calls_of("nvmlDeviceGetCpuAffinity")] == [1]


def test_cpu_lists_parse() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("") == set()


def test_bus_ids_and_cpu_masks() -> None:
    assert normalize_bus_id("00000000:C1:00.0") == "0000:c1:00.0"
    assert normalize_bus_id("0001:01:00.0") == "0001:01:00.0"
    assert normalize_bus_id(None) is None
    assert cpu_mask_to_ranges([0xFFFF, 0]) == "0-15"
    assert cpu_mask_to_ranges([0b1011, 1 << 63, 1]) == "0-1,3,127-128"
    assert cpu_mask_to_ranges([0]) is None


# ---- control -------------------------------------------------------------------------------


def test_control_is_an_object_the_backend_owns_not_the_backend_itself(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    backend = open_backend()
    assert isinstance(backend.control, Control) and not isinstance(backend, Control)
    # a GPU the reads found lost is lost to the control too: they share the backend's GPUs
    fake_nvml.lose_gpu(1)
    read(backend, slow=False)
    with pytest.raises(GpustationError, match="fallen off the bus"):
        backend.control.set_power_limit(1, 300)


def test_power_limit_is_set_in_milliwatts(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    backend = open_backend()
    backend.control.set_power_limit(0, 300)
    backend.control.set_power_limit(1, 512.5)
    assert fake_nvml.set_calls == [
        ("nvmlDeviceSetPowerManagementLimit", (0, 300_000)),
        ("nvmlDeviceSetPowerManagementLimit", (1, 512_500)),
    ]
    rtx, h200 = read(backend, slow=False)
    assert rtx.power_limit_w == 300 and h200.power_limit_w == 512.5


def test_power_limit_out_of_range_is_refused(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    backend = open_backend()
    with pytest.raises(GpustationError) as info:
        backend.control.set_power_limit(0, 700)
    message = str(info.value)
    assert "700 W" in message and "150-600 W" in message and "Invalid Argument" in message
    assert fake_nvml.set_calls == []


def test_power_limit_without_root(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.reset(require_root=True)
    backend = open_backend()
    with pytest.raises(NeedsRootError) as info:
        backend.control.set_power_limit(0, 300)
    assert info.value.exit_code == EXIT_NEEDS_ROOT == 4
    assert "sudo gpustation" in str(info.value)
    with pytest.raises(NeedsRootError, match="sudo gpustation"):
        backend.control.set_fan_speed(0, 0, 60)


def test_fans_on_a_card_without_fans_are_not_supported(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    backend = open_backend()
    for attempt in (
        lambda: backend.control.set_fan_speed(1, 0, 60),
        lambda: backend.control.set_fan_auto(1, 0),
        lambda: backend.control.fan_speed_range(1),
    ):
        with pytest.raises(NotSupportedError) as info:
            attempt()
        assert info.value.exit_code == EXIT_NOT_SUPPORTED == 5
        assert "no fans" in str(info.value)
    assert fake_nvml.set_calls == []


def test_fan_speed_manual_then_auto(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    backend = open_backend()
    assert backend.control.fan_speed_range(0) == (30, 100)
    backend.control.set_fan_speed(0, 1, 60)
    rtx = read(backend, slow=False)[0]
    assert rtx.fans_pct == [45, 60] and rtx.fan_control == ["auto", "manual"]
    backend.control.set_fan_auto(0, 1)
    assert read(backend, slow=False)[0].fan_control == ["auto", "auto"]
    assert fake_nvml.set_calls == [
        ("nvmlDeviceSetFanSpeed_v2", (0, 1, 60)),
        ("nvmlDeviceSetDefaultFanSpeed_v2", (0, 1)),
    ]
    with pytest.raises(GpustationError, match=r"20%.*30-100%"):
        backend.control.set_fan_speed(0, 0, 20)


def test_setter_missing_from_the_library_is_not_supported(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.remove_function("nvmlDeviceSetFanSpeed_v2")
    fake_nvml.function_not_found("nvmlDeviceSetPowerManagementLimit")
    backend = open_backend()
    with pytest.raises(NotSupportedError):
        backend.control.set_fan_speed(0, 0, 60)
    with pytest.raises(NotSupportedError):
        backend.control.set_power_limit(0, 300)


# ---- the command line, end to end ------------------------------------------------------------


def snapshot_cli(tmp_path: Path, scenario: dict[str, Any], *args: str) -> Any:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    return subprocess.run(
        gpustation_cmd("snapshot", *args),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
        env=child_env(
            PYTHONPATH=os.pathsep.join([str(FAKE_NVML_DIR), str(REPO)]),
            FAKE_NVML_SCENARIO=str(path),
        ),
    )


def test_cli_snapshot_reads_nvml(tmp_path: Path) -> None:
    scenario = {
        "devices": [{"card": "rtx4090"}, {"card": "h200"}, {"card": "h200", "bus_id": BUS[3]}],
        "lost": [2],
    }
    result = snapshot_cli(tmp_path, scenario, "--json")
    assert result.returncode == 0, result.stderr
    snap = Snapshot.from_dict(json.loads(result.stdout))
    assert not snap.simulated and snap.driver_version == "580.159.04"
    assert [(g.name, g.lost) for g in snap.gpus] == [
        ("NVIDIA GeForce RTX 4090", False),
        ("NVIDIA H200", False),
        (None, True),
    ]
    assert snap.gpus[0].energy_j == pytest.approx(91_234.567)  # one-shot reads slow fields


def test_cli_snapshot_json_names_versions_vendor_neutrally_and_keeps_the_old_keys(
    tmp_path: Path,
) -> None:
    result = snapshot_cli(tmp_path, {"devices": [{"card": "h200"}]}, "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["driver_version"] == "580.159.04"
    assert doc["library_version"] == {"name": "NVML", "version": "13.580.159.04"}
    assert doc["compute_runtime_version"] == {"name": "CUDA", "version": "13.0"}
    # deprecated, kept for one release: the same values under the old keys
    assert doc["nvml_version"] == "13.580.159.04" and doc["cuda_driver_version"] == "13.0"


def test_cli_snapshot_without_driver_exits_3(tmp_path: Path) -> None:
    result = snapshot_cli(tmp_path, {"no_driver": True}, "--json")
    assert result.returncode == 3
    assert "Driver Not Loaded" in result.stderr and "--simulate" in result.stderr
    assert result.stdout == ""


def test_fake_is_what_pynvml_imports_on_the_path(tmp_path: Path) -> None:
    # Guards the CLI tests above: they only mean something if the child
    # process imports the fake rather than nvidia-ml-py.
    code = "import pynvml; print(pynvml.DRIVER.driver_version, pynvml.__file__)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(PYTHONPATH=str(FAKE_NVML_DIR)),
    )
    assert result.returncode == 0, result.stderr
    assert str(FAKE_NVML_DIR) in result.stdout


def test_fan_range_unread_at_open_is_asked_again(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.fail(0, "nvmlDeviceGetMinMaxFanSpeed", fake_nvml.NVML_ERROR_UNKNOWN)
    backend = open_backend()
    with pytest.raises(NotSupportedError):
        backend.control.fan_speed_range(0)
    fake_nvml.heal(0, "nvmlDeviceGetMinMaxFanSpeed")
    assert backend.control.fan_speed_range(0) == (30, 100)
