"""How NVML reads each declared field: the NVML backend's read table.

One line per field key of :func:`gpustation.telemetry.model.field_keys`, in
the model's order; ``None`` says the backend's dedicated code fills the field
(the processes, the deep readers of ``deep.py``) or the sampler does (host
fields). A test checks the table names every declared field and nothing else,
so a new field cannot be forgotten here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpustation.telemetry.model import decode_throttle
from gpustation.telemetry.nvml.topology import text
from gpustation.telemetry.slotted import record


@record(frozen=True)
class NvmlRead:
    """How NVML reads one field: names only, resolved when the backend opens.

    ``function(handle, *args)`` where ``args`` name pynvml constants
    (for ``nvmlDeviceGetFieldValues`` they name field ids, asked as a list);
    ``part`` picks an attribute (str) or item (int) of the answer; ``convert``
    names one of :func:`converters`. Versioned variants of ``function`` are
    tried through the fallback table of ``query.py``. ``per_fan`` calls it
    once per fan (fan index last) and gives a list.
    """

    function: str
    args: tuple[str, ...] = ()
    part: str | int | None = None
    convert: str = "float"
    per_fan: bool = False


_R = NvmlRead
_MIB = 1024.0 * 1024.0

READS: dict[str, NvmlRead | None] = {
    "uuid": _R("nvmlDeviceGetUUID", convert="text"),
    "name": _R("nvmlDeviceGetName", convert="text"),
    "pci_bus_id": _R("nvmlDeviceGetPciInfo", part="busId", convert="text"),
    "lost": None,  # set when a call answers GPU_IS_LOST
    "temperature_c": _R("nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",)),
    "temperature_slowdown_c": _R(
        "nvmlDeviceGetTemperatureThreshold", ("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN",)
    ),
    "temperature_shutdown_c": _R(
        "nvmlDeviceGetTemperatureThreshold", ("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN",)
    ),
    "temperature_gpu_max_c": _R(
        "nvmlDeviceGetTemperatureThreshold", ("NVML_TEMPERATURE_THRESHOLD_GPU_MAX",)
    ),
    "temperature_margin_c": _R("nvmlDeviceGetMarginTemperature"),
    "memory_temperature_c": _R(
        "nvmlDeviceGetFieldValues", ("NVML_FI_DEV_MEMORY_TEMP",), convert="field_value"
    ),
    "memory_temperature_max_c": _R(
        "nvmlDeviceGetTemperatureThreshold", ("NVML_TEMPERATURE_THRESHOLD_MEM_MAX",)
    ),
    "power_w": _R("nvmlDeviceGetPowerUsage", convert="milli"),
    "power_limit_w": _R("nvmlDeviceGetEnforcedPowerLimit", convert="milli"),
    "power_default_w": _R("nvmlDeviceGetPowerManagementDefaultLimit", convert="milli"),
    "power_min_w": _R("nvmlDeviceGetPowerManagementLimitConstraints", part=0, convert="milli"),
    "power_max_w": _R("nvmlDeviceGetPowerManagementLimitConstraints", part=1, convert="milli"),
    "energy_j": _R("nvmlDeviceGetTotalEnergyConsumption", convert="milli"),
    "clock_sm_mhz": _R("nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",)),
    "clock_sm_max_mhz": _R("nvmlDeviceGetMaxClockInfo", ("NVML_CLOCK_SM",)),
    "clock_mem_mhz": _R("nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM",)),
    "clock_mem_max_mhz": _R("nvmlDeviceGetMaxClockInfo", ("NVML_CLOCK_MEM",)),
    "memory_used_mib": _R("nvmlDeviceGetMemoryInfo", part="used", convert="mib"),
    "memory_total_mib": _R("nvmlDeviceGetMemoryInfo", part="total", convert="mib"),
    "utilization_gpu_pct": _R("nvmlDeviceGetUtilizationRates", part="gpu"),
    "utilization_memory_pct": _R("nvmlDeviceGetUtilizationRates", part="memory"),
    # NVML answers [utilization, sampling period in µs].
    "encoder_utilization_pct": _R("nvmlDeviceGetEncoderUtilization", part=0),
    "decoder_utilization_pct": _R("nvmlDeviceGetDecoderUtilization", part=0),
    "fans_pct": _R("nvmlDeviceGetFanSpeed_v2", per_fan=True),
    "fan_control": _R("nvmlDeviceGetFanControlPolicy_v2", convert="fan_policy", per_fan=True),
    "pstate": _R("nvmlDeviceGetPerformanceState", convert="pstate"),
    "throttle_reasons": _R("nvmlDeviceGetCurrentClocksEventReasons", convert="throttle"),
    "pcie.gen": _R("nvmlDeviceGetCurrPcieLinkGeneration", convert="int"),
    "pcie.width": _R("nvmlDeviceGetCurrPcieLinkWidth", convert="int"),
    "pcie.max_gen": _R("nvmlDeviceGetMaxPcieLinkGeneration", convert="int"),
    "pcie.max_width": _R("nvmlDeviceGetMaxPcieLinkWidth", convert="int"),
    "pcie.tx_kib_s": _R("nvmlDeviceGetPcieThroughput", ("NVML_PCIE_UTIL_TX_BYTES",)),
    "pcie.rx_kib_s": _R("nvmlDeviceGetPcieThroughput", ("NVML_PCIE_UTIL_RX_BYTES",)),
    "pcie.replay_errors": _R("nvmlDeviceGetPcieReplayCounter", convert="int"),
    "ecc_uncorrected": _R(
        "nvmlDeviceGetTotalEccErrors",
        ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
        convert="int",
    ),
    "persistence_mode": _R("nvmlDeviceGetPersistenceMode", convert="bool"),
    "processes": None,  # the backend's process code
    "minor_number": _R("nvmlDeviceGetMinorNumber", convert="int"),
    "remapped_rows.correctable": _R("nvmlDeviceGetRemappedRows", part=0, convert="int"),
    "remapped_rows.uncorrectable": _R("nvmlDeviceGetRemappedRows", part=1, convert="int"),
    "remapped_rows.pending": _R("nvmlDeviceGetRemappedRows", part=2, convert="bool"),
    "remapped_rows.failure": _R("nvmlDeviceGetRemappedRows", part=3, convert="bool"),
    "sm_active_pct": None,  # deep.GpmReader
    "sm_occupancy_pct": None,  # deep.GpmReader
    "tensor_active_pct": None,  # deep.GpmReader
    "dram_active_pct": None,  # deep.GpmReader
    "xid_events": None,  # deep.XidWatcher
    "nvlink": None,  # deep.NvLinkReader
    "nvlink_sum_mb_s": None,  # only a host read from Prometheus knows the sum alone
    "mig": None,  # deep.read_mig
    "unowned_memory_mib": None,  # the sampler
    "device_holders": None,  # the sampler
    "limit_drift": None,  # the control layer, from its journal
}


def converters(const: Callable[[str], int | None]) -> dict[str, Callable[[Any], Any]]:
    """The converters ``NvmlRead.convert`` names; ``const`` looks up a pynvml
    constant (None where this nvidia-ml-py lacks it)."""
    manual = const("NVML_FAN_POLICY_MANUAL")
    pstate_unknown = const("NVML_PSTATE_UNKNOWN")
    return {
        "float": float,
        "int": int,
        "milli": lambda v: v / 1000.0,  # mW -> W, mJ -> J
        "mib": lambda v: v / _MIB,  # bytes -> MiB
        "text": text,
        "throttle": lambda v: decode_throttle(int(v)),
        "pstate": lambda v: None if int(v) == pstate_unknown else int(v),
        "fan_policy": lambda v: "manual" if v == manual else "auto",
        "bool": lambda v: bool(int(v)),
        "field_value": float,  # the member of nvmlValue_t its type names, read by the backend
    }
