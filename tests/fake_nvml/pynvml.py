"""A fake ``pynvml`` that answers like a driver would, for tests.

Put this directory on ``sys.path`` (or ``PYTHONPATH``) and ``import pynvml``
loads this module instead of nvidia-ml-py, so the NVML backend's real code is
what the tests exercise, in-process or in a ``gpustation`` subprocess.

The state lives in the module-level :data:`DRIVER`; tests configure it with
:func:`reset`, :func:`fail`, :func:`remove_function`, :func:`function_not_found`
and :func:`lose_gpu`, and read :data:`calls` / :data:`set_calls` afterwards.
A scenario can also come from a JSON file named by ``FAKE_NVML_SCENARIO``,
read at import; its keys are :func:`load_scenario`'s.

The default machine is an RTX 4090 (two fans) and an H200 (no fans), with
values like those a real H200 reports.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from types import SimpleNamespace
from typing import Any

# ---- constants (the values of nvml.h) ---------------------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_FAN_POLICY_TEMPERATURE_CONTINOUS_SW = 0
NVML_FAN_POLICY_MANUAL = 1
NVML_PSTATE_UNKNOWN = 32
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50
# Real nvidia-ml-py defines this one as a 1-tuple (a stray comma); so does the fake.
NVML_P2P_CAPS_INDEX_READ = (0,)
NVML_P2P_CAPS_INDEX_WRITE = 1
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED = 1
NVML_P2P_STATUS_NOT_SUPPORTED = 5
NVML_NVLINK_MAX_LINKS = 18
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
# In a device's "nvlinks" list: a link to an NVSwitch rather than to a GPU.
SWITCH = "switch"
_SWITCH_BUS_ID = "00000000:05:00.0"
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
nvmlMemory_v2 = 0x02000028
NVML_VALUE_NOT_AVAILABLE_ULONGLONG = (1 << 64) - 1

_MIB = 1024 * 1024

# ---- errors, built like nvidia-ml-py builds them ----------------------------


class NVMLError(Exception):
    """``NVMLError(code)`` returns the subclass for that code, as in pynvml."""

    _valClassMapping: dict[int, type] = {}  # noqa: RUF012 - mirrors pynvml
    _errcode_to_string = {  # noqa: RUF012
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return self._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")


def _make_error_classes() -> None:
    module = sys.modules[__name__]
    for name in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        value = getattr(module, name)
        words = name[len("NVML_ERROR_") :].split("_")
        class_name = "NVMLError_" + "".join(w.capitalize() for w in words)

        def new(cls: type, *args: Any, _value: int = value) -> NVMLError:
            return NVMLError.__new__(cls, _value)

        cls = type(class_name, (NVMLError,), {"__new__": new, "__module__": __name__})
        setattr(module, class_name, cls)
        NVMLError._valClassMapping[value] = cls


_make_error_classes()

# ---- the machine -------------------------------------------------------------

_CARDS: dict[str, dict[str, Any]] = {
    "rtx4090": {
        "name": "NVIDIA GeForce RTX 4090",
        "uuid": "GPU-5a1d3c1e-7f2b-4c55-9b7e-4090aaaa0001",
        "bus_id": "00000000:01:00.0",
        "temperature": 64,
        "slowdown": 87,
        "shutdown": 92,
        "power_mw": 285_500,
        "power_limit_mw": 450_000,
        "power_default_mw": 450_000,
        "power_min_mw": 150_000,
        "power_max_mw": 600_000,
        "energy_mj": 91_234_567,
        "clock_sm": 2520,
        "clock_mem": 10501,
        "clock_sm_max": 3105,
        "clock_mem_max": 10501,
        "memory_total": 24564 * _MIB,
        "memory_used": 8192 * _MIB,
        "memory_reserved": 372 * _MIB,
        "util_gpu": 97,
        "util_mem": 45,
        "enc_util": 7,
        "dec_util": 23,
        "fans": [45, 47],
        "fan_policy": [0, 0],
        "fan_min": 30,
        "fan_max": 100,
        "pstate": 2,
        "throttle": 0x004,
        "pcie_gen": 4,
        "pcie_width": 16,
        "pcie_max_gen": 4,
        "pcie_max_width": 16,
        "pcie_tx": 1520,
        "pcie_rx": 20480,
        "replay": 0,
        "ecc_uncorrected": 0,
        "compute_procs": [[4242, 7680 * _MIB]],
        "graphics_procs": [[1234, 210 * _MIB]],
        "numa_node": 0,
        "cpu_affinity": list(range(16)),
        "nvlinks": [],
        "topology": {},
        "topology_default": NVML_TOPOLOGY_NODE,
        "p2p": {},
        "p2p_default": NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED,
        "errors": {},
    },
    "h200": {
        "name": "NVIDIA H200",
        "uuid": "GPU-be6fbabe-98e6-a75f-51f9-54038a182998",
        "bus_id": "00000000:00:06.0",
        "temperature": 36,
        "slowdown": 89,
        "shutdown": 95,
        "power_mw": 80_789,
        "power_limit_mw": 700_000,
        "power_default_mw": 700_000,
        "power_min_mw": 200_000,
        "power_max_mw": 700_000,
        "energy_mj": 2_479_150,
        "clock_sm": 345,
        "clock_mem": 3201,
        "clock_sm_max": 1980,
        "clock_mem_max": 3201,
        "memory_total": 143771 * _MIB,
        "memory_used": 0,
        "memory_reserved": 581 * _MIB,
        "util_gpu": 0,
        "util_mem": 0,
        # As measured on an H200 under a matmul: the video engines idle.
        "enc_util": 0,
        "dec_util": 0,
        "fans": [],
        "fan_policy": [],
        "fan_min": None,
        "fan_max": None,
        "pstate": 0,
        "throttle": 0x001,
        "pcie_gen": 5,
        "pcie_width": 16,
        "pcie_max_gen": 5,
        "pcie_max_width": 16,
        "pcie_tx": 732,
        "pcie_rx": 697,
        "replay": 0,
        "ecc_uncorrected": 0,
        "compute_procs": [],
        "graphics_procs": [],
        "numa_node": 1,
        "cpu_affinity": list(range(16, 32)),
        "nvlinks": [],
        "topology": {},
        "topology_default": NVML_TOPOLOGY_SYSTEM,
        "p2p": {},
        "p2p_default": NVML_P2P_STATUS_OK,
        # As measured: a datacenter card answers fan calls like this.
        "errors": {
            "nvmlDeviceGetFanSpeed_v2": NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetFanSpeed": NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetMinMaxFanSpeed": NVML_ERROR_INVALID_ARGUMENT,
            "nvmlDeviceGetFanControlPolicy_v2": NVML_ERROR_INVALID_ARGUMENT,
            "nvmlDeviceGetNvLinkState": NVML_ERROR_NOT_SUPPORTED,
        },
    },
}


def card(kind: str = "rtx4090", **overrides: Any) -> dict[str, Any]:
    """A device dict for ``reset(devices=[...])``: a card's defaults plus overrides."""
    device = copy.deepcopy(_CARDS[kind])
    device.update(copy.deepcopy(overrides))
    return device


class _Driver:
    def __init__(self) -> None:
        self.devices: list[dict[str, Any]] = []
        self.no_driver: int | None = None
        self.require_root = False
        self.initialized = 0
        # (device index or None for every device, function name) -> error code
        self.failures: dict[tuple[int | None, str], int] = {}
        self.not_found: set[str] = set()
        self.lost: set[int] = set()
        self.driver_version = "580.159.04"
        self.nvml_version = "13.580.159.04"
        self.cuda_version = 13000


DRIVER = _Driver()
#: Every call, as ``(name, args)`` with handles shown as their GPU index.
calls: list[tuple[str, tuple[Any, ...]]] = []
#: Every successful setter call, as ``(name, args)``.
set_calls: list[tuple[str, tuple[Any, ...]]] = []
_removed: dict[str, Any] = {}


def reset(
    devices: list[dict[str, Any]] | None = None,
    no_driver: bool | int = False,
    require_root: bool = False,
) -> None:
    """Start over: the given devices (default: an RTX 4090 and an H200)."""
    module = sys.modules[__name__]
    for name, fn in _removed.items():
        setattr(module, name, fn)
    _removed.clear()
    DRIVER.__init__()  # type: ignore[misc]
    DRIVER.devices = (
        [card("rtx4090"), card("h200")]
        if devices is None
        else [
            card(d.get("card", "rtx4090"), **{k: v for k, v in d.items() if k != "card"})
            for d in devices
        ]
    )
    if no_driver is True:
        DRIVER.no_driver = NVML_ERROR_DRIVER_NOT_LOADED
    elif no_driver:
        DRIVER.no_driver = int(no_driver)
    DRIVER.require_root = require_root
    calls.clear()
    set_calls.clear()


def fail(index: int | None, name: str, code: int) -> None:
    """Make ``name`` raise ``code`` on GPU ``index`` (``None``: on every GPU).

    ``nvmlDeviceGetMemoryInfo_v2`` names the versioned memory call.
    """
    DRIVER.failures[(index, name)] = code


def heal(index: int | None, name: str) -> None:
    """Undo :func:`fail`."""
    DRIVER.failures.pop((index, name), None)


def remove_function(name: str) -> None:
    """Drop ``name`` from the module, as an older pynvml would lack it."""
    module = sys.modules[__name__]
    if hasattr(module, name):
        _removed[name] = getattr(module, name)
        delattr(module, name)


def function_not_found(name: str) -> None:
    """Keep ``name`` but make it raise FunctionNotFound, as with an older driver."""
    DRIVER.not_found.add(name)


def lose_gpu(index: int) -> None:
    """Every call on that GPU now raises GPU_IS_LOST."""
    DRIVER.lost.add(index)


def recover_gpu(index: int) -> None:
    DRIVER.lost.discard(index)


def calls_of(name: str) -> list[tuple[Any, ...]]:
    """The argument tuples of every call to ``name``."""
    return [args for called, args in calls if called == name]


def load_scenario(data: dict[str, Any]) -> None:
    """Configure the fake from a dict (the ``FAKE_NVML_SCENARIO`` JSON).

    Keys: ``devices`` (list of device dicts, each may name a ``card``),
    ``no_driver`` (true or an NVML error code), ``require_root``,
    ``fail`` (list of ``[index or null, name, code]``), ``lost`` (indices),
    ``missing`` and ``not_found`` (function names).
    """
    reset(
        devices=data.get("devices"),
        no_driver=data.get("no_driver", False),
        require_root=bool(data.get("require_root", False)),
    )
    for index, name, code in data.get("fail", []):
        fail(index, name, code)
    for index in data.get("lost", []):
        lose_gpu(index)
    for name in data.get("missing", []):
        remove_function(name)
    for name in data.get("not_found", []):
        function_not_found(name)


# ---- the API -------------------------------------------------------------------


class Handle:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<fake nvmlDevice {self.index}>"


def _enter(name: str, *args: Any) -> None:
    """Record the call and raise what the driver would raise for it."""
    calls.append((name, tuple(a.index if isinstance(a, Handle) else a for a in args)))
    if DRIVER.initialized <= 0 and name != "nvmlInit":
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    if name in DRIVER.not_found:
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    for arg in args:
        if isinstance(arg, Handle) and arg.index in DRIVER.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    handle = args[0] if args and isinstance(args[0], Handle) else None
    if handle is not None:
        code = DRIVER.failures.get((handle.index, name)) or DRIVER.devices[handle.index][
            "errors"
        ].get(name)
        if code:
            raise NVMLError(code)
    code = DRIVER.failures.get((None, name))
    if code:
        raise NVMLError(code)


def _dev(handle: Handle) -> dict[str, Any]:
    return DRIVER.devices[handle.index]


def nvmlInit() -> None:
    _enter("nvmlInit")
    if DRIVER.no_driver:
        raise NVMLError(DRIVER.no_driver)
    DRIVER.initialized += 1


def nvmlShutdown() -> None:
    _enter("nvmlShutdown")
    DRIVER.initialized -= 1


def nvmlSystemGetDriverVersion() -> str:
    _enter("nvmlSystemGetDriverVersion")
    return DRIVER.driver_version


def nvmlSystemGetNVMLVersion() -> str:
    _enter("nvmlSystemGetNVMLVersion")
    return DRIVER.nvml_version


def nvmlSystemGetCudaDriverVersion() -> int:
    _enter("nvmlSystemGetCudaDriverVersion")
    return DRIVER.cuda_version


def nvmlSystemGetCudaDriverVersion_v2() -> int:
    _enter("nvmlSystemGetCudaDriverVersion_v2")
    return DRIVER.cuda_version


def nvmlDeviceGetCount() -> int:
    _enter("nvmlDeviceGetCount")
    return len(DRIVER.devices)


def nvmlDeviceGetHandleByIndex(index: int) -> Handle:
    _enter("nvmlDeviceGetHandleByIndex", index)
    if not 0 <= index < len(DRIVER.devices):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if index in DRIVER.lost:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return Handle(index)


def nvmlDeviceGetName(handle: Handle) -> str:
    _enter("nvmlDeviceGetName", handle)
    return _dev(handle)["name"]


def nvmlDeviceGetUUID(handle: Handle) -> str:
    _enter("nvmlDeviceGetUUID", handle)
    return _dev(handle)["uuid"]


def _pci(handle: Handle) -> SimpleNamespace:
    # Older pynvml hands back the bus id as bytes; the backend must decode it.
    return SimpleNamespace(busId=_dev(handle)["bus_id"].encode())


def nvmlDeviceGetPciInfo_v3(handle: Handle) -> SimpleNamespace:
    _enter("nvmlDeviceGetPciInfo_v3", handle)
    return _pci(handle)


def nvmlDeviceGetPciInfo(handle: Handle) -> SimpleNamespace:
    _enter("nvmlDeviceGetPciInfo", handle)
    return _pci(handle)


def nvmlDeviceGetTemperature(handle: Handle, sensor: int) -> int:
    _enter("nvmlDeviceGetTemperature", handle, sensor)
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _dev(handle)["temperature"]


def nvmlDeviceGetTemperatureThreshold(handle: Handle, threshold: int) -> int:
    _enter("nvmlDeviceGetTemperatureThreshold", handle, threshold)
    if threshold == NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
        return _dev(handle)["slowdown"]
    if threshold == NVML_TEMPERATURE_THRESHOLD_SHUTDOWN:
        return _dev(handle)["shutdown"]
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def nvmlDeviceGetPowerUsage(handle: Handle) -> int:
    _enter("nvmlDeviceGetPowerUsage", handle)
    return _dev(handle)["power_mw"]


def nvmlDeviceGetEnforcedPowerLimit(handle: Handle) -> int:
    _enter("nvmlDeviceGetEnforcedPowerLimit", handle)
    return _dev(handle)["power_limit_mw"]


def nvmlDeviceGetPowerManagementLimit(handle: Handle) -> int:
    _enter("nvmlDeviceGetPowerManagementLimit", handle)
    return _dev(handle)["power_limit_mw"]


def nvmlDeviceGetPowerManagementDefaultLimit(handle: Handle) -> int:
    _enter("nvmlDeviceGetPowerManagementDefaultLimit", handle)
    return _dev(handle)["power_default_mw"]


def nvmlDeviceGetPowerManagementLimitConstraints(handle: Handle) -> list[int]:
    _enter("nvmlDeviceGetPowerManagementLimitConstraints", handle)
    return [_dev(handle)["power_min_mw"], _dev(handle)["power_max_mw"]]


def nvmlDeviceGetTotalEnergyConsumption(handle: Handle) -> int:
    _enter("nvmlDeviceGetTotalEnergyConsumption", handle)
    return _dev(handle)["energy_mj"]


def nvmlDeviceGetClockInfo(handle: Handle, clock: int) -> int:
    _enter("nvmlDeviceGetClockInfo", handle, clock)
    return _dev(handle)[
        "clock_sm" if clock in (NVML_CLOCK_SM, NVML_CLOCK_GRAPHICS) else "clock_mem"
    ]


def nvmlDeviceGetMaxClockInfo(handle: Handle, clock: int) -> int:
    _enter("nvmlDeviceGetMaxClockInfo", handle, clock)
    key = "clock_sm_max" if clock in (NVML_CLOCK_SM, NVML_CLOCK_GRAPHICS) else "clock_mem_max"
    return _dev(handle)[key]


def nvmlDeviceGetMemoryInfo(handle: Handle, version: int | None = None) -> SimpleNamespace:
    dev = _dev(handle) if isinstance(handle, Handle) else None
    if version:
        _enter("nvmlDeviceGetMemoryInfo_v2", handle)
        if version != nvmlMemory_v2:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        assert dev is not None
        total, used, reserved = dev["memory_total"], dev["memory_used"], dev["memory_reserved"]
        return SimpleNamespace(
            version=version,
            total=total,
            reserved=reserved,
            used=used,
            free=total - used - reserved,
        )
    _enter("nvmlDeviceGetMemoryInfo", handle)
    assert dev is not None
    # v1 counts the driver's reservation as used, as the real v1 does.
    used = dev["memory_used"] + dev["memory_reserved"]
    return SimpleNamespace(total=dev["memory_total"], used=used, free=dev["memory_total"] - used)


def nvmlDeviceGetUtilizationRates(handle: Handle) -> SimpleNamespace:
    _enter("nvmlDeviceGetUtilizationRates", handle)
    return SimpleNamespace(gpu=_dev(handle)["util_gpu"], memory=_dev(handle)["util_mem"])


def nvmlDeviceGetEncoderUtilization(handle: Handle) -> list[int]:
    _enter("nvmlDeviceGetEncoderUtilization", handle)
    return [_dev(handle)["enc_util"], 167_000]  # [utilization, sampling period in µs]


def nvmlDeviceGetDecoderUtilization(handle: Handle) -> list[int]:
    _enter("nvmlDeviceGetDecoderUtilization", handle)
    return [_dev(handle)["dec_util"], 167_000]


def nvmlDeviceGetNumFans(handle: Handle) -> int:
    _enter("nvmlDeviceGetNumFans", handle)
    return len(_dev(handle)["fans"])


def _check_fan(handle: Handle, fan: int) -> None:
    fans = _dev(handle)["fans"]
    if not fans:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if not 0 <= fan < len(fans):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def nvmlDeviceGetFanSpeed(handle: Handle) -> int:
    _enter("nvmlDeviceGetFanSpeed", handle)
    _check_fan(handle, 0)
    return _dev(handle)["fans"][0]


def nvmlDeviceGetFanSpeed_v2(handle: Handle, fan: int) -> int:
    _enter("nvmlDeviceGetFanSpeed_v2", handle, fan)
    _check_fan(handle, fan)
    return _dev(handle)["fans"][fan]


def nvmlDeviceGetMinMaxFanSpeed(handle: Handle) -> list[int]:
    _enter("nvmlDeviceGetMinMaxFanSpeed", handle)
    dev = _dev(handle)
    if dev["fan_min"] is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return [dev["fan_min"], dev["fan_max"]]


def nvmlDeviceGetFanControlPolicy_v2(handle: Handle, fan: int) -> int:
    _enter("nvmlDeviceGetFanControlPolicy_v2", handle, fan)
    _check_fan(handle, fan)
    return _dev(handle)["fan_policy"][fan]


def nvmlDeviceGetPerformanceState(handle: Handle) -> int:
    _enter("nvmlDeviceGetPerformanceState", handle)
    return _dev(handle)["pstate"]


def nvmlDeviceGetCurrentClocksEventReasons(handle: Handle) -> int:
    _enter("nvmlDeviceGetCurrentClocksEventReasons", handle)
    return _dev(handle)["throttle"]


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: Handle) -> int:
    _enter("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    return _dev(handle)["throttle"]


def nvmlDeviceGetCurrPcieLinkGeneration(handle: Handle) -> int:
    _enter("nvmlDeviceGetCurrPcieLinkGeneration", handle)
    return _dev(handle)["pcie_gen"]


def nvmlDeviceGetCurrPcieLinkWidth(handle: Handle) -> int:
    _enter("nvmlDeviceGetCurrPcieLinkWidth", handle)
    return _dev(handle)["pcie_width"]


def nvmlDeviceGetMaxPcieLinkGeneration(handle: Handle) -> int:
    _enter("nvmlDeviceGetMaxPcieLinkGeneration", handle)
    return _dev(handle)["pcie_max_gen"]


def nvmlDeviceGetMaxPcieLinkWidth(handle: Handle) -> int:
    _enter("nvmlDeviceGetMaxPcieLinkWidth", handle)
    return _dev(handle)["pcie_max_width"]


def nvmlDeviceGetPcieThroughput(handle: Handle, counter: int) -> int:
    _enter("nvmlDeviceGetPcieThroughput", handle, counter)
    return _dev(handle)["pcie_tx" if counter == NVML_PCIE_UTIL_TX_BYTES else "pcie_rx"]


def nvmlDeviceGetPcieReplayCounter(handle: Handle) -> int:
    _enter("nvmlDeviceGetPcieReplayCounter", handle)
    return _dev(handle)["replay"]


def nvmlDeviceGetTotalEccErrors(handle: Handle, error_type: int, counter_type: int) -> int:
    _enter("nvmlDeviceGetTotalEccErrors", handle, error_type, counter_type)
    if error_type != NVML_MEMORY_ERROR_TYPE_UNCORRECTED or counter_type != NVML_VOLATILE_ECC:
        return 0
    return _dev(handle)["ecc_uncorrected"]


def _procs(handle: Handle, key: str) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(
            pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF
        )
        for pid, used in _dev(handle)[key]
    ]


def nvmlDeviceGetComputeRunningProcesses_v3(handle: Handle) -> list[SimpleNamespace]:
    _enter("nvmlDeviceGetComputeRunningProcesses_v3", handle)
    return _procs(handle, "compute_procs")


def nvmlDeviceGetComputeRunningProcesses_v2(handle: Handle) -> list[SimpleNamespace]:
    _enter("nvmlDeviceGetComputeRunningProcesses_v2", handle)
    return _procs(handle, "compute_procs")


def nvmlDeviceGetComputeRunningProcesses(handle: Handle) -> list[SimpleNamespace]:
    _enter("nvmlDeviceGetComputeRunningProcesses", handle)
    return _procs(handle, "compute_procs")


def nvmlDeviceGetGraphicsRunningProcesses_v3(handle: Handle) -> list[SimpleNamespace]:
    _enter("nvmlDeviceGetGraphicsRunningProcesses_v3", handle)
    return _procs(handle, "graphics_procs")


def nvmlDeviceGetGraphicsRunningProcesses_v2(handle: Handle) -> list[SimpleNamespace]:
    _enter("nvmlDeviceGetGraphicsRunningProcesses_v2", handle)
    return _procs(handle, "graphics_procs")


def nvmlDeviceGetGraphicsRunningProcesses(handle: Handle) -> list[SimpleNamespace]:
    _enter("nvmlDeviceGetGraphicsRunningProcesses", handle)
    return _procs(handle, "graphics_procs")


# ---- topology ----------------------------------------------------------------------


def nvmlDeviceGetTopologyCommonAncestor(handle1: Handle, handle2: Handle) -> int:
    _enter("nvmlDeviceGetTopologyCommonAncestor", handle1, handle2)
    dev = _dev(handle1)
    topo = {int(k): v for k, v in dev["topology"].items()}
    return topo.get(handle2.index, dev["topology_default"])


def nvmlDeviceGetP2PStatus(handle1: Handle, handle2: Handle, index: int) -> int:
    _enter("nvmlDeviceGetP2PStatus", handle1, handle2, index)
    if not isinstance(index, int):
        # What ctypes does with the 1-tuple constant of real nvidia-ml-py.
        raise TypeError(f"Don't know how to convert parameter 3: {index!r}")
    dev = _dev(handle1)
    p2p = {int(k): v for k, v in dev["p2p"].items()}
    return p2p.get(handle2.index, dev["p2p_default"])


def nvmlDeviceGetNvLinkState(handle: Handle, link: int) -> int:
    _enter("nvmlDeviceGetNvLinkState", handle, link)
    links = _dev(handle)["nvlinks"]
    if link >= len(links):
        # Cards report the links they have; past those the driver says so.
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return NVML_FEATURE_ENABLED if links[link] else NVML_FEATURE_DISABLED


def _active_link(handle: Handle, link: int) -> str:
    links = _dev(handle)["nvlinks"]
    if not 0 <= link < len(links) or not links[link]:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return str(links[link])


def nvmlDeviceGetNvLinkRemotePciInfo(handle: Handle, link: int) -> SimpleNamespace:
    _enter("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
    remote = _active_link(handle, link)
    return SimpleNamespace(busId=(_SWITCH_BUS_ID if remote == SWITCH else remote).encode())


def nvmlDeviceGetNvLinkRemoteDeviceType(handle: Handle, link: int) -> int:
    _enter("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
    if _active_link(handle, link) == SWITCH:
        return NVML_NVLINK_DEVICE_TYPE_SWITCH
    return NVML_NVLINK_DEVICE_TYPE_GPU


def nvmlDeviceGetNumaNodeId(handle: Handle) -> int:
    _enter("nvmlDeviceGetNumaNodeId", handle)
    return _dev(handle)["numa_node"]


def nvmlDeviceGetCpuAffinity(handle: Handle, cpu_set_size: int) -> list[int]:
    _enter("nvmlDeviceGetCpuAffinity", handle, cpu_set_size)
    words = [0] * cpu_set_size
    for cpu in _dev(handle)["cpu_affinity"]:
        if cpu // 64 < cpu_set_size:
            words[cpu // 64] |= 1 << (cpu % 64)
    return words


# ---- setters ------------------------------------------------------------------------


def nvmlDeviceSetPowerManagementLimit(handle: Handle, limit_mw: int) -> None:
    _enter("nvmlDeviceSetPowerManagementLimit", handle, limit_mw)
    dev = _dev(handle)
    if DRIVER.require_root:
        raise NVMLError(NVML_ERROR_NO_PERMISSION)
    if not dev["power_min_mw"] <= limit_mw <= dev["power_max_mw"]:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    dev["power_limit_mw"] = limit_mw
    set_calls.append(("nvmlDeviceSetPowerManagementLimit", (handle.index, limit_mw)))


def nvmlDeviceSetFanSpeed_v2(handle: Handle, fan: int, speed: int) -> None:
    _enter("nvmlDeviceSetFanSpeed_v2", handle, fan, speed)
    _check_fan(handle, fan)
    dev = _dev(handle)
    if DRIVER.require_root:
        raise NVMLError(NVML_ERROR_NO_PERMISSION)
    if not dev["fan_min"] <= speed <= dev["fan_max"]:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    dev["fans"][fan] = speed
    dev["fan_policy"][fan] = NVML_FAN_POLICY_MANUAL
    set_calls.append(("nvmlDeviceSetFanSpeed_v2", (handle.index, fan, speed)))


def nvmlDeviceSetDefaultFanSpeed_v2(handle: Handle, fan: int) -> None:
    _enter("nvmlDeviceSetDefaultFanSpeed_v2", handle, fan)
    _check_fan(handle, fan)
    if DRIVER.require_root:
        raise NVMLError(NVML_ERROR_NO_PERMISSION)
    _dev(handle)["fan_policy"][fan] = NVML_FAN_POLICY_TEMPERATURE_CONTINOUS_SW
    set_calls.append(("nvmlDeviceSetDefaultFanSpeed_v2", (handle.index, fan)))


# ---- start-up ---------------------------------------------------------------------------

reset()
if os.environ.get("FAKE_NVML_SCENARIO"):
    with open(os.environ["FAKE_NVML_SCENARIO"]) as _f:
        load_scenario(json.load(_f))
