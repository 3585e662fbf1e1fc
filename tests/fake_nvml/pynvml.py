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

The deeper readings answer as a driver would: XID events come from a queue
(:func:`push_xid`) that ``nvmlEventSetWait_v2`` waits on, timing out as the
real one does; GPM samples carry busy-time counters that advance with the
driver's clock, so ``nvmlGpmMetricsGet`` computes a value from two of them
(the H200's are those measured under a bf16 matmul; the RTX 4090 has no GPM);
NVLink data counters advance by each link's rate; process utilisation gives
samples newer than the timestamp asked for, or NotFound; :func:`mig_scenario`
puts the H200 in MIG mode with two instances, each running a process.
``nvmlDeviceSetMigMode`` exists, as in nvidia-ml-py, so that a call to it
would show in :data:`calls`.
"""

from __future__ import annotations

import copy
import json
import os
import queue
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
NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2
NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3
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
nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlEventTypeDoubleBitEccError = 0x0000000000000002
nvmlEventTypeXidCriticalError = 0x0000000000000008
NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_MAX = 477
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_SUPPORT_VERSION = 1
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_DEVICE_MIG_DISABLE = 0x0
NVML_DEVICE_MIG_ENABLE = 0x1
# GPM metric id -> the device's "gpm" key that gives its rate (% of the time)
_GPM_KEYS = {
    NVML_GPM_METRIC_SM_UTIL: "sm",
    NVML_GPM_METRIC_SM_OCCUPANCY: "occupancy",
    NVML_GPM_METRIC_ANY_TENSOR_UTIL: "tensor",
    NVML_GPM_METRIC_DRAM_BW_UTIL: "dram",
}

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
        # GDDR6X: no memory temperature field, no memory maximum
        "memory_temp": None,
        "memory_temp_max": None,
        # the GPU maximum threshold: refused by today's drivers
        "gpu_max": None,
        # nvmlDeviceGetMarginTemperature ("T.Limit" in nvidia-smi -q)
        "margin": 23,
        "persistence": 0,  # a desktop card: the display keeps the driver loaded
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
        # [pid, SM %, memory %] per process, as nvmlDeviceGetProcessUtilization gives
        "process_util": [[4242, 88, 31]],
        "minor": 0,
        "remapped_rows": [0, 0, 0, 0],  # correctable, uncorrectable, pending, failure
        "xid_events": True,  # registration for XID events works
        # GPM: an Ada card has none (the driver answers isSupportedDevice=0)
        "gpm_supported": False,
        "gpm": {"sm": 0.0, "occupancy": 0.0, "tensor": 0.0, "dram": 0.0},
        # per link: KiB/s sent and received, and the error counters
        "nvlink_rates": [],
        "nvlink_errors": {},
        "mig_mode": None,  # consumer cards have no MIG: NotSupported
        "mig_devices": [],
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
        # As measured on an H200 (driver 580.159.04): field 82 (an unsigned int)
        # reads 35-40 C idle, the memory maximum 95 C, the GPU maximum 87 C
        # (refused by some drivers: set it to None).
        "memory_temp": 40,
        "memory_temp_max": 95,
        "gpu_max": 87,
        "margin": 53,
        "persistence": 1,
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
        "process_util": [],
        "minor": 1,
        "remapped_rows": [0, 0, 0, 0],  # as measured on an H200
        "xid_events": True,
        # As measured on an H200 under a bf16 matmul.
        "gpm_supported": True,
        "gpm": {"sm": 92.7, "occupancy": 15.6, "tensor": 87.8, "dram": 17.0},
        "nvlink_rates": [],
        "nvlink_errors": {},
        "mig_mode": [0, 0],  # MIG off, as measured
        "mig_devices": [],
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
        #: True: every setter is refused; "euid": refused unless made as root (a driver's check)
        self.require_root: bool | str = False
        self.initialized = 0
        # (device index or None for every device, function name) -> error code
        self.failures: dict[tuple[int | None, str], int] = {}
        self.not_found: set[str] = set()
        self.lost: set[int] = set()
        self.driver_version = "580.159.04"
        self.nvml_version = "13.580.159.04"
        self.cuda_version = 13000
        #: the driver's clock in µs; every sampling call moves it on by one second
        self.clock_us = 1_700_000_000_000_000
        #: XIDs pushed by tests, waiting for nvmlEventSetWait: (device index, code)
        self.events: queue.Queue[tuple[int, int]] = queue.Queue()
        self.event_sets: list[EventSet] = []
        self.gpm_samples_alive = 0


DRIVER = _Driver()
#: Every call, as ``(name, args)`` with handles shown as their GPU index.
calls: list[tuple[str, tuple[Any, ...]]] = []
#: Every successful setter call, as ``(name, args)``.
set_calls: list[tuple[str, tuple[Any, ...]]] = []
_removed: dict[str, Any] = {}


def reset(
    devices: list[dict[str, Any]] | None = None,
    no_driver: bool | int = False,
    require_root: bool | str = False,
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


def push_xid(index: int, code: int) -> None:
    """An XID on GPU ``index``: the next nvmlEventSetWait of a set it is in returns it."""
    DRIVER.events.put((index, code))


def mig_scenario(index: int = 1) -> None:
    """GPU ``index`` (an H200) in MIG mode with two instances, each with a process."""
    dev = DRIVER.devices[index]
    dev["mig_mode"] = [NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE]
    dev["util_gpu"] = None  # in MIG mode the GPU's utilisation is NotSupported
    dev["mig_devices"] = [
        {
            "gi": 1,
            "ci": 0,
            "profile": "3g.71gb",
            "uuid": "MIG-1d3c5e7f-0001-4a2b-8c9d-000000000001",
            "memory_total": 71 * 1024 * _MIB,
            "memory_used": 20480 * _MIB,
            "compute_procs": [[5151, 20000 * _MIB]],
        },
        {
            "gi": 2,
            "ci": 0,
            "profile": "3g.71gb",
            "uuid": "MIG-1d3c5e7f-0002-4a2b-8c9d-000000000002",
            "memory_total": 71 * 1024 * _MIB,
            "memory_used": 1024 * _MIB,
            "compute_procs": [[6262, 900 * _MIB]],
        },
    ]


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
        require_root=data.get("require_root", False),
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


class MigHandle(Handle):
    """A MIG device's handle: ``index`` is its GPU's (so a lost GPU loses it too)."""

    __slots__ = ("slot",)

    def __init__(self, index: int, slot: int) -> None:
        super().__init__(index)
        self.slot = slot

    def __repr__(self) -> str:
        return f"<fake MIG device {self.index}/{self.slot}>"


def _mig(handle: Handle) -> dict[str, Any] | None:
    if isinstance(handle, MigHandle):
        mig: dict[str, Any] = DRIVER.devices[handle.index]["mig_devices"][handle.slot]
        return mig
    return None


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
    mig = _mig(handle)
    if mig is not None:
        return f"{_dev(handle)['name']} MIG {mig['profile']}"
    return str(_dev(handle)["name"])


def nvmlDeviceGetUUID(handle: Handle) -> str:
    _enter("nvmlDeviceGetUUID", handle)
    mig = _mig(handle)
    return str(_dev(handle)["uuid"] if mig is None else mig["uuid"])


def nvmlDeviceGetIndex(handle: Handle) -> int:
    _enter("nvmlDeviceGetIndex", handle)
    return handle.index


def nvmlDeviceGetMinorNumber(handle: Handle) -> int:
    _enter("nvmlDeviceGetMinorNumber", handle)
    return int(_dev(handle)["minor"])


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
    return int(_dev(handle)["temperature"])


def nvmlDeviceGetTemperatureThreshold(handle: Handle, threshold: int) -> int:
    _enter("nvmlDeviceGetTemperatureThreshold", handle, threshold)
    if threshold == NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
        return int(_dev(handle)["slowdown"])
    if threshold == NVML_TEMPERATURE_THRESHOLD_SHUTDOWN:
        return int(_dev(handle)["shutdown"])
    value = {
        NVML_TEMPERATURE_THRESHOLD_MEM_MAX: _dev(handle)["memory_temp_max"],
        NVML_TEMPERATURE_THRESHOLD_GPU_MAX: _dev(handle)["gpu_max"],
    }.get(threshold)
    if value is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(value)


def nvmlDeviceGetPersistenceMode(handle: Handle) -> int:
    _enter("nvmlDeviceGetPersistenceMode", handle)
    return int(_dev(handle)["persistence"])


def nvmlDeviceGetMarginTemperature(handle: Handle) -> int:
    """Degrees below the slowdown limit; absent from drivers before 550 (FunctionNotFound)."""
    _enter("nvmlDeviceGetMarginTemperature", handle)
    margin = _dev(handle)["margin"]
    if margin is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(margin)


def nvmlDeviceGetPowerUsage(handle: Handle) -> int:
    _enter("nvmlDeviceGetPowerUsage", handle)
    return int(_dev(handle)["power_mw"])


def nvmlDeviceGetEnforcedPowerLimit(handle: Handle) -> int:
    _enter("nvmlDeviceGetEnforcedPowerLimit", handle)
    return int(_dev(handle)["power_limit_mw"])


def nvmlDeviceGetPowerManagementLimit(handle: Handle) -> int:
    _enter("nvmlDeviceGetPowerManagementLimit", handle)
    return int(_dev(handle)["power_limit_mw"])


def nvmlDeviceGetPowerManagementDefaultLimit(handle: Handle) -> int:
    _enter("nvmlDeviceGetPowerManagementDefaultLimit", handle)
    return int(_dev(handle)["power_default_mw"])


def nvmlDeviceGetPowerManagementLimitConstraints(handle: Handle) -> list[int]:
    _enter("nvmlDeviceGetPowerManagementLimitConstraints", handle)
    return [_dev(handle)["power_min_mw"], _dev(handle)["power_max_mw"]]


def nvmlDeviceGetTotalEnergyConsumption(handle: Handle) -> int:
    _enter("nvmlDeviceGetTotalEnergyConsumption", handle)
    return int(_dev(handle)["energy_mj"])


def nvmlDeviceGetClockInfo(handle: Handle, clock: int) -> int:
    _enter("nvmlDeviceGetClockInfo", handle, clock)
    return int(
        _dev(handle)["clock_sm" if clock in (NVML_CLOCK_SM, NVML_CLOCK_GRAPHICS) else "clock_mem"]
    )


def nvmlDeviceGetMaxClockInfo(handle: Handle, clock: int) -> int:
    _enter("nvmlDeviceGetMaxClockInfo", handle, clock)
    key = "clock_sm_max" if clock in (NVML_CLOCK_SM, NVML_CLOCK_GRAPHICS) else "clock_mem_max"
    return int(_dev(handle)[key])


def nvmlDeviceGetMemoryInfo(handle: Handle, version: int | None = None) -> SimpleNamespace:
    dev = _dev(handle) if isinstance(handle, Handle) else None
    mig = _mig(handle)
    if mig is not None:
        _enter("nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo", handle)
        total, used = mig["memory_total"], mig["memory_used"]
        return SimpleNamespace(total=total, used=used, free=total - used, reserved=0)
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
    if _dev(handle)["util_gpu"] is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
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
    return int(_dev(handle)["fans"][0])


def nvmlDeviceGetFanSpeed_v2(handle: Handle, fan: int) -> int:
    _enter("nvmlDeviceGetFanSpeed_v2", handle, fan)
    _check_fan(handle, fan)
    return int(_dev(handle)["fans"][fan])


def nvmlDeviceGetMinMaxFanSpeed(handle: Handle) -> list[int]:
    _enter("nvmlDeviceGetMinMaxFanSpeed", handle)
    dev = _dev(handle)
    if dev["fan_min"] is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return [dev["fan_min"], dev["fan_max"]]


def nvmlDeviceGetFanControlPolicy_v2(handle: Handle, fan: int) -> int:
    _enter("nvmlDeviceGetFanControlPolicy_v2", handle, fan)
    _check_fan(handle, fan)
    return int(_dev(handle)["fan_policy"][fan])


def nvmlDeviceGetPerformanceState(handle: Handle) -> int:
    _enter("nvmlDeviceGetPerformanceState", handle)
    return int(_dev(handle)["pstate"])


def nvmlDeviceGetCurrentClocksEventReasons(handle: Handle) -> int:
    _enter("nvmlDeviceGetCurrentClocksEventReasons", handle)
    return int(_dev(handle)["throttle"])


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: Handle) -> int:
    _enter("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    return int(_dev(handle)["throttle"])


def nvmlDeviceGetCurrPcieLinkGeneration(handle: Handle) -> int:
    _enter("nvmlDeviceGetCurrPcieLinkGeneration", handle)
    return int(_dev(handle)["pcie_gen"])


def nvmlDeviceGetCurrPcieLinkWidth(handle: Handle) -> int:
    _enter("nvmlDeviceGetCurrPcieLinkWidth", handle)
    return int(_dev(handle)["pcie_width"])


def nvmlDeviceGetMaxPcieLinkGeneration(handle: Handle) -> int:
    _enter("nvmlDeviceGetMaxPcieLinkGeneration", handle)
    return int(_dev(handle)["pcie_max_gen"])


def nvmlDeviceGetMaxPcieLinkWidth(handle: Handle) -> int:
    _enter("nvmlDeviceGetMaxPcieLinkWidth", handle)
    return int(_dev(handle)["pcie_max_width"])


def nvmlDeviceGetPcieThroughput(handle: Handle, counter: int) -> int:
    _enter("nvmlDeviceGetPcieThroughput", handle, counter)
    return int(_dev(handle)["pcie_tx" if counter == NVML_PCIE_UTIL_TX_BYTES else "pcie_rx"])


def nvmlDeviceGetPcieReplayCounter(handle: Handle) -> int:
    _enter("nvmlDeviceGetPcieReplayCounter", handle)
    return int(_dev(handle)["replay"])


def nvmlDeviceGetTotalEccErrors(handle: Handle, error_type: int, counter_type: int) -> int:
    _enter("nvmlDeviceGetTotalEccErrors", handle, error_type, counter_type)
    if error_type != NVML_MEMORY_ERROR_TYPE_UNCORRECTED or counter_type != NVML_VOLATILE_ECC:
        return 0
    return int(_dev(handle)["ecc_uncorrected"])


def _procs(handle: Handle, key: str) -> list[SimpleNamespace]:
    mig = _mig(handle)
    if mig is not None:
        return [
            SimpleNamespace(
                pid=pid, usedGpuMemory=used, gpuInstanceId=mig["gi"], computeInstanceId=mig["ci"]
            )
            for pid, used in mig.get(key, [])
        ]
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
    return int(topo.get(handle2.index, dev["topology_default"]))


def nvmlDeviceGetP2PStatus(handle1: Handle, handle2: Handle, index: int) -> int:
    _enter("nvmlDeviceGetP2PStatus", handle1, handle2, index)
    if not isinstance(index, int):
        # What ctypes does with the 1-tuple constant of real nvidia-ml-py.
        raise TypeError(f"Don't know how to convert parameter 3: {index!r}")
    dev = _dev(handle1)
    p2p = {int(k): v for k, v in dev["p2p"].items()}
    return int(p2p.get(handle2.index, dev["p2p_default"]))


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
    return int(_dev(handle)["numa_node"])


def nvmlDeviceGetCpuAffinity(handle: Handle, cpu_set_size: int) -> list[int]:
    _enter("nvmlDeviceGetCpuAffinity", handle, cpu_set_size)
    words = [0] * cpu_set_size
    for cpu in _dev(handle)["cpu_affinity"]:
        if cpu // 64 < cpu_set_size:
            words[cpu // 64] |= 1 << (cpu % 64)
    return words


# ---- events ---------------------------------------------------------------------------


class EventSet:
    """What nvmlEventSetCreate gives: the GPUs registered in it, by event types."""

    def __init__(self) -> None:
        self.registered: dict[int, int] = {}
        self.freed = False


def nvmlEventSetCreate() -> EventSet:
    _enter("nvmlEventSetCreate")
    event_set = EventSet()
    DRIVER.event_sets.append(event_set)
    return event_set


def nvmlDeviceGetSupportedEventTypes(handle: Handle) -> int:
    _enter("nvmlDeviceGetSupportedEventTypes", handle)
    return 0xFF9F if _dev(handle)["xid_events"] else 0


def nvmlDeviceRegisterEvents(handle: Handle, event_types: int, event_set: EventSet) -> None:
    _enter("nvmlDeviceRegisterEvents", handle, event_types)
    if not _dev(handle)["xid_events"]:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    event_set.registered[handle.index] = event_types


def nvmlEventSetWait_v2(event_set: EventSet, timeout_ms: int) -> SimpleNamespace:
    # Not recorded in ``calls``: a watcher waits in a loop, as long as a test runs.
    if DRIVER.initialized <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    code = DRIVER.failures.get((None, "nvmlEventSetWait_v2"))
    if code:
        raise NVMLError(code)
    try:
        index, xid = DRIVER.events.get(timeout=timeout_ms / 1000.0)
    except queue.Empty:
        raise NVMLError(NVML_ERROR_TIMEOUT) from None
    if index not in event_set.registered:
        raise NVMLError(NVML_ERROR_TIMEOUT)
    return SimpleNamespace(
        device=Handle(index),
        eventType=nvmlEventTypeXidCriticalError,
        eventData=xid,
        gpuInstanceId=0xFFFFFFFF,
        computeInstanceId=0xFFFFFFFF,
    )


def nvmlEventSetWait(event_set: EventSet, timeout_ms: int) -> SimpleNamespace:
    return nvmlEventSetWait_v2(event_set, timeout_ms)


def nvmlEventSetFree(event_set: EventSet) -> None:
    _enter("nvmlEventSetFree")
    event_set.freed = True


# ---- GPM -----------------------------------------------------------------------------


class GpmSample:
    """An opaque GPM sample: the driver's clock and each engine's busy time so far."""

    def __init__(self) -> None:
        self.index: int | None = None
        self.time_us = 0
        self.busy: dict[str, float] = {}


class c_nvmlGpmMetricsGet_t:  # the name nvidia-ml-py gives it
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: GpmSample | None = None
        self.sample2: GpmSample | None = None
        self.metrics = [
            SimpleNamespace(metricId=0, nvmlReturn=NVML_SUCCESS, value=0.0)
            for _ in range(NVML_GPM_METRIC_MAX)
        ]


def nvmlGpmQueryDeviceSupport(handle: Handle) -> SimpleNamespace:
    _enter("nvmlGpmQueryDeviceSupport", handle)
    return SimpleNamespace(version=1, isSupportedDevice=int(_dev(handle)["gpm_supported"]))


def nvmlGpmSampleAlloc() -> GpmSample:
    _enter("nvmlGpmSampleAlloc")
    DRIVER.gpm_samples_alive += 1
    return GpmSample()


def nvmlGpmSampleFree(sample: GpmSample) -> None:
    _enter("nvmlGpmSampleFree")
    DRIVER.gpm_samples_alive -= 1


def nvmlGpmSampleGet(handle: Handle, sample: GpmSample) -> GpmSample:
    """Each sample moves the driver's clock on by a second, the counters by their rates."""
    _enter("nvmlGpmSampleGet", handle)
    dev = _dev(handle)
    if not dev["gpm_supported"]:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    DRIVER.clock_us += 1_000_000
    seconds = (DRIVER.clock_us - dev.get("_gpm_at", DRIVER.clock_us - 1_000_000)) / 1e6
    dev["_gpm_at"] = DRIVER.clock_us
    counters = dev.setdefault("_gpm_busy", {k: 0.0 for k in dev["gpm"]})
    for key, pct in dev["gpm"].items():
        counters[key] = counters.get(key, 0.0) + pct / 100.0 * seconds
    sample.index, sample.time_us, sample.busy = handle.index, DRIVER.clock_us, dict(counters)
    return sample


def nvmlGpmMetricsGet(get: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
    _enter("nvmlGpmMetricsGet")
    first, second = get.sample1, get.sample2
    if first is None or second is None or first.index != second.index or first is second:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    seconds = (second.time_us - first.time_us) / 1e6
    if seconds <= 0:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    for metric in get.metrics[: get.numMetrics]:
        key = _GPM_KEYS.get(metric.metricId)
        if key is None:
            metric.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            continue
        metric.nvmlReturn = NVML_SUCCESS
        metric.value = 100.0 * (second.busy[key] - first.busy[key]) / seconds
    return get


# ---- process utilisation, memory health, NVLink counters, MIG ----------------------------


def nvmlDeviceGetProcessUtilization(handle: Handle, last_seen: int) -> list[SimpleNamespace]:
    _enter("nvmlDeviceGetProcessUtilization", handle, last_seen)
    DRIVER.clock_us += 1_000_000
    rows = _dev(handle)["process_util"]
    if not rows:
        raise NVMLError(NVML_ERROR_NOT_FOUND)  # no samples since last_seen
    return [
        SimpleNamespace(
            pid=pid, timeStamp=DRIVER.clock_us, smUtil=sm, memUtil=mem, encUtil=0, decUtil=0
        )
        for pid, sm, mem in rows
    ]


def nvmlDeviceGetRemappedRows(handle: Handle) -> tuple[int, int, int, int]:
    _enter("nvmlDeviceGetRemappedRows", handle)
    corr, unc, pending, failure = _dev(handle)["remapped_rows"]
    return (corr, unc, pending, failure)


def nvmlDeviceGetNvLinkErrorCounter(handle: Handle, link: int, counter: int) -> int:
    _enter("nvmlDeviceGetNvLinkErrorCounter", handle, link, counter)
    _active_link(handle, link)
    errors = {int(k): v for k, v in _dev(handle)["nvlink_errors"].items()}
    return int(errors.get(link, [0, 0, 0, 0])[counter])


def nvmlDeviceGetFieldValues(handle: Handle, field_ids: list[Any]) -> list[SimpleNamespace]:
    """NVLink data counters (KiB so far), moving on by their rates a second per call
    that asks for them; the memory temperature where the card has one."""
    _enter("nvmlDeviceGetFieldValues", handle)
    nvlink = (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
    if any((i[0] if isinstance(i, tuple) else i) in nvlink for i in field_ids):
        DRIVER.clock_us += 1_000_000
    dev = _dev(handle)
    seconds = (DRIVER.clock_us - 1_700_000_000_000_000) / 1e6
    out = []
    for item in field_ids:
        fid, scope = item if isinstance(item, tuple) else (item, 0)
        rates = dev["nvlink_rates"]
        if fid == NVML_FI_DEV_MEMORY_TEMP:
            temp = dev["memory_temp"]
            ret = NVML_SUCCESS if temp is not None else NVML_ERROR_NOT_SUPPORTED
            out.append(
                SimpleNamespace(
                    fieldId=fid,
                    scopeId=scope,
                    timestamp=DRIVER.clock_us,
                    latencyUsec=0,
                    valueType=NVML_VALUE_TYPE_UNSIGNED_INT,
                    nvmlReturn=ret,
                    value=SimpleNamespace(uiVal=temp or 0),
                )
            )
            continue
        if fid in (
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        ) and (scope < len(rates)):
            rate = rates[scope][0 if fid == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else 1]
            value, ret = int(rate * seconds), NVML_SUCCESS
        else:
            value, ret = 0, NVML_ERROR_NOT_SUPPORTED
        out.append(
            SimpleNamespace(
                fieldId=fid,
                scopeId=scope,
                timestamp=DRIVER.clock_us,
                latencyUsec=0,
                valueType=NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                nvmlReturn=ret,
                value=SimpleNamespace(ullVal=value),
            )
        )
    return out


def nvmlDeviceGetMigMode(handle: Handle) -> list[int]:
    _enter("nvmlDeviceGetMigMode", handle)
    mode = _dev(handle)["mig_mode"]
    if mode is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return list(mode)


def nvmlDeviceGetMaxMigDeviceCount(handle: Handle) -> int:
    _enter("nvmlDeviceGetMaxMigDeviceCount", handle)
    if _dev(handle)["mig_mode"] is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return 7


def nvmlDeviceGetMigDeviceHandleByIndex(handle: Handle, index: int) -> MigHandle:
    _enter("nvmlDeviceGetMigDeviceHandleByIndex", handle, index)
    if not 0 <= index < len(_dev(handle)["mig_devices"]):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return MigHandle(handle.index, index)


def nvmlDeviceGetGpuInstanceId(handle: Handle) -> int:
    _enter("nvmlDeviceGetGpuInstanceId", handle)
    mig = _mig(handle)
    if mig is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(mig["gi"])


def nvmlDeviceGetComputeInstanceId(handle: Handle) -> int:
    _enter("nvmlDeviceGetComputeInstanceId", handle)
    mig = _mig(handle)
    if mig is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return int(mig["ci"])


# ---- setters ------------------------------------------------------------------------


def _check_privilege() -> None:
    if DRIVER.require_root == "euid" and os.geteuid() == 0:
        return
    if DRIVER.require_root:
        raise NVMLError(NVML_ERROR_NO_PERMISSION)


def nvmlDeviceSetPowerManagementLimit(handle: Handle, limit_mw: int) -> None:
    _enter("nvmlDeviceSetPowerManagementLimit", handle, limit_mw)
    dev = _dev(handle)
    _check_privilege()
    if not dev["power_min_mw"] <= limit_mw <= dev["power_max_mw"]:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    dev["power_limit_mw"] = limit_mw
    set_calls.append(("nvmlDeviceSetPowerManagementLimit", (handle.index, limit_mw)))


def nvmlDeviceSetFanSpeed_v2(handle: Handle, fan: int, speed: int) -> None:
    _enter("nvmlDeviceSetFanSpeed_v2", handle, fan, speed)
    _check_fan(handle, fan)
    dev = _dev(handle)
    _check_privilege()
    if not dev["fan_min"] <= speed <= dev["fan_max"]:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    dev["fans"][fan] = speed
    dev["fan_policy"][fan] = NVML_FAN_POLICY_MANUAL
    set_calls.append(("nvmlDeviceSetFanSpeed_v2", (handle.index, fan, speed)))


def nvmlDeviceSetDefaultFanSpeed_v2(handle: Handle, fan: int) -> None:
    _enter("nvmlDeviceSetDefaultFanSpeed_v2", handle, fan)
    _check_fan(handle, fan)
    _check_privilege()
    _dev(handle)["fan_policy"][fan] = NVML_FAN_POLICY_TEMPERATURE_CONTINOUS_SW
    set_calls.append(("nvmlDeviceSetDefaultFanSpeed_v2", (handle.index, fan)))


def nvmlDeviceSetMigMode(handle: Handle, mode: int) -> int:
    """Present, as in nvidia-ml-py, so that a call would be seen: gpustation must never make one."""
    _enter("nvmlDeviceSetMigMode", handle, mode)
    set_calls.append(("nvmlDeviceSetMigMode", (handle.index, mode)))
    return NVML_SUCCESS


# ---- start-up ---------------------------------------------------------------------------

reset()
if os.environ.get("FAKE_NVML_SCENARIO"):
    with open(os.environ["FAKE_NVML_SCENARIO"]) as _f:
        load_scenario(json.load(_f))
