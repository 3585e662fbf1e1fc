"""The burn-in's NVML monitor: one GPU's temperature, power, clocks, throttle
reasons, PCIe link and XID events, sampled in a thread while the load runs,
and its ECC, remapped-row and violation counters read before and after.

Every call goes through the telemetry's
:class:`~gpustation.telemetry.nvml.query.Query`: a reading the driver does not
support is missing (``None``), and any other error is kept and reported
(:meth:`Monitor.errors`), never swallowed. Throttle reasons are the
telemetry's names (``sw_power_cap``, ``hw_thermal``...). Without pynvml, a
driver or a GPU the monitor says why and the burn-in reports the NVML checks
as not available.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from gpustation.errors import NoDriverError
from gpustation.telemetry.model import THERMAL_REASONS, decode_throttle
from gpustation.telemetry.nvml.query import FAILED, Device, GpuLost, Query, start_nvml

#: Reasons that mean heat (or the hardware's own slowdown) held the clocks back.
SLOWDOWN_REASONS = THERMAL_REASONS | {"hw_slowdown"}
#: Reasons that are no slowdown at all.
BENIGN_REASONS = frozenset({"gpu_idle"})
#: How many XID events one pass of the sampling thread takes at most.
XID_BATCH = 16


@dataclass(frozen=True)
class Card:
    """How the monitor finds its GPU in NVML: by UUID, bus id, else index."""

    uuid: str | None = None
    pci_bus_id: str | None = None
    index: int = 0


def cuda_card(device: torch.device) -> Card:
    """Where a CUDA device sits, from torch's view of it."""
    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    bus = getattr(props, "pci_bus_id", None)
    bus_id = None
    if bus is not None:
        dom = getattr(props, "pci_domain_id", 0)
        dev = getattr(props, "pci_device_id", 0)
        bus_id = f"{dom:08x}:{bus:02x}:{dev:02x}.0"
    return Card(None if uuid is None else f"GPU-{uuid}", bus_id, device.index or 0)


@dataclass
class Monitor:
    """NVML readings of one GPU, sampled in a thread; every reading may be missing.

    ``nvml`` stands in for ``pynvml`` (a fake in tests) and ``card`` for the
    CUDA device's place (then no CUDA device is needed).
    """

    device: torch.device
    interval: float = 0.5
    nvml: Any = None
    card: Card | None = None
    available: bool = False
    reason: str = ""
    static: dict[str, Any] = field(default_factory=dict)
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    phase: str = "setup"
    samples: int = 0
    peak: dict[str, float] = field(default_factory=dict)
    #: reason (the telemetry's name) -> seconds the clocks were held back by it
    throttled_s: dict[str, float] = field(default_factory=dict)
    pcie_under_load: list[tuple[int, int]] = field(default_factory=list)
    xids: list[int] = field(default_factory=list)
    last: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._events: Any = None
        self._lock = threading.Lock()
        self._lost: str | None = None
        if self.card is None and self.device.type != "cuda":
            self.reason = "no GPU (running on the CPU)"
            return
        try:
            self.nv = start_nvml(self.nvml)
        except NoDriverError as exc:
            self.reason = f"NVML not available ({exc})"
            return
        self.q = Query(self.nv)
        self.gpu = Device(self.card.index if self.card is not None else self.device.index or 0)
        try:
            self.gpu.handle = self._handle(self.card or cuda_card(self.device))
        except Exception as exc:  # torch could not describe the device
            self.reason = f"NVML not available (the GPU's place: {type(exc).__name__}: {exc})"
            return
        if self.gpu.handle is None:
            self.reason = "NVML not available (no NVML handle for this GPU)" + self._why()
            return
        self.available = True
        try:
            self._read_static()
        except GpuLost as err:
            self._gone(err)
        self.static["xid_events_supported"] = self._events is not None

    def _why(self) -> str:
        errors = self.errors()
        return f": {'; '.join(errors)}" if errors else ""

    def _handle(self, card: Card) -> Any:
        q = self.q
        for name, key in (
            ("nvmlDeviceGetHandleByUUID", card.uuid),
            ("nvmlDeviceGetHandleByPciBusId", card.pci_bus_id),
        ):
            if key is not None and q.available(None, name):
                handle = q(None, "handle", name, key)
                if handle is not None:
                    return handle
        return q(None, "handle", "nvmlDeviceGetHandleByIndex", card.index)

    def _const(self, name: str) -> Any:
        try:
            return self.q.const(name)
        except (AttributeError, TypeError, ValueError):  # an nvidia-ml-py without it
            return None

    def _call(self, key: str, name: str, *consts: str) -> Any:
        """One reading: ``name(handle, *consts)``; None where it cannot be read."""
        args = [self._const(c) for c in consts]
        if None in args:
            return None
        return self.q(self.gpu, key, name, *args)

    def _read_static(self) -> None:
        c = self._call
        self.static = {
            "name": _text(c("name", "nvmlDeviceGetName")),
            "power_limit_w": _milli(c("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit")),
            "slowdown_temp_c": c("slowdown_temp_c", "nvmlDeviceGetTemperatureThreshold",
                                 "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
            "max_sm_clock_mhz": c("max_sm_clock_mhz", "nvmlDeviceGetMaxClockInfo",
                                  "NVML_CLOCK_SM"),
            "max_mem_clock_mhz": c("max_mem_clock_mhz", "nvmlDeviceGetMaxClockInfo",
                                   "NVML_CLOCK_MEM"),
            "pcie_gen_max": c("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
            "pcie_width_max": c("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth"),
            "ecc_enabled": _ecc_on(c("ecc_enabled", "nvmlDeviceGetEccMode")),
            # HBM cards only: GDDR cards have neither the threshold nor the reading
            "memory_max_c": c("memory_max_c", "nvmlDeviceGetTemperatureThreshold",
                              "NVML_TEMPERATURE_THRESHOLD_MEM_MAX"),
        }  # fmt: skip
        xid_type = self._const("nvmlEventTypeXidCriticalError")
        if xid_type is None:
            return
        events = self.q(None, "xid_events", "nvmlEventSetCreate", failed=FAILED)
        if events is FAILED:
            return
        done = self.q(self.gpu, "xid_events", "nvmlDeviceRegisterEvents", xid_type, events,
                      failed=FAILED)  # fmt: skip
        if done is FAILED:
            self.q(None, "xid_events", "nvmlEventSetFree", events)
            return
        self._events = events

    def errors(self) -> list[str]:
        """Every NVML error met so far (not NotSupported: that is an answer), in words."""
        q: Query | None = getattr(self, "q", None)  # none without NVML
        found = q.errors if q is not None else {}
        out = [f"{key}: {text}" for (_, key), text in sorted(found.items())]
        return out + ([f"the GPU was lost: {self._lost}"] if self._lost else [])

    def thermal_s(self) -> float:
        """Seconds slowed by heat: the thermal and hardware-slowdown reasons, summed."""
        return sum(v for k, v in self.throttled_s.items() if k in SLOWDOWN_REASONS)

    def counters(self) -> dict[str, Any]:
        """ECC, remapped rows and throttle-violation counters (read before and after)."""
        if not self.available or self._lost:
            return {}
        c = self._call
        try:
            out: dict[str, Any] = {
                "ecc_corrected": c("ecc_corrected", "nvmlDeviceGetTotalEccErrors",
                                   "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
                "ecc_uncorrected": c("ecc_uncorrected", "nvmlDeviceGetTotalEccErrors",
                                     "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
            }  # fmt: skip
            rows = c("remapped_rows", "nvmlDeviceGetRemappedRows")
            if rows is not None:
                out.update(remapped_corrected=rows[0], remapped_uncorrected=rows[1],
                           remap_pending=bool(rows[2]), remap_failure=bool(rows[3]))  # fmt: skip
            for name, policy in (("power", "NVML_PERF_POLICY_POWER"),
                                 ("thermal", "NVML_PERF_POLICY_THERMAL")):  # fmt: skip
                v = c(f"violation_{name}", "nvmlDeviceGetViolationStatus", policy)
                out[f"violation_{name}_ns"] = getattr(v, "violationTime", None)
        except GpuLost as err:
            self._gone(err)
            return {}
        return out

    def sample(self) -> dict[str, Any]:
        """One reading of the fast values; raises GpuLost."""
        c = self._call
        reasons = c("throttle", "nvmlDeviceGetCurrentClocksEventReasons")
        util = c("util_pct", "nvmlDeviceGetUtilizationRates")
        return {
            "temp_c": c("temp_c", "nvmlDeviceGetTemperature", "NVML_TEMPERATURE_GPU"),
            "memory_temp_c": self._memory_temp(),
            "power_w": _milli(c("power_w", "nvmlDeviceGetPowerUsage")),
            "sm_clock_mhz": c("sm_clock_mhz", "nvmlDeviceGetClockInfo", "NVML_CLOCK_SM"),
            "mem_clock_mhz": c("mem_clock_mhz", "nvmlDeviceGetClockInfo", "NVML_CLOCK_MEM"),
            "throttle": None if reasons is None else decode_throttle(int(reasons)),
            "pcie_gen": c("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
            "pcie_width": c("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
            "util_pct": getattr(util, "gpu", None),
        }

    def _memory_temp(self) -> float | None:
        """HBM temperature (a field value with its own status); None where the card has none."""
        field = self._const("NVML_FI_DEV_MEMORY_TEMP")
        if field is None or self.static.get("memory_max_c") is None:
            return None
        values = self.q(self.gpu, "memory_temp_c", "nvmlDeviceGetFieldValues", [field])
        if not values or int(getattr(values[0], "nvmlReturn", 1)) != 0:
            return None
        return float(values[0].value.uiVal)

    def start(self) -> None:
        self.before = self.counters()
        if self.available and not self._lost:
            self._thread = threading.Thread(target=self._run, name="burnin-nvml", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.after = self.counters()
        if self._events is not None:
            self.q(None, "xid_events", "nvmlEventSetFree", self._events)
            self._events = None

    def _gone(self, err: GpuLost) -> None:
        self._lost = str(err)

    def _run(self) -> None:
        prev = time.monotonic()
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            dt, prev = now - prev, now
            try:
                s = self.sample()
                self._poll_xids()
            except GpuLost as err:
                self._gone(err)
                return
            with self._lock:
                self._add(s, dt)

    def _add(self, s: dict[str, Any], dt: float) -> None:
        self.samples += 1
        self.last = s
        for key in ("temp_c", "memory_temp_c", "power_w", "sm_clock_mhz", "mem_clock_mhz"):
            v = s.get(key)
            if v is not None:
                self.peak[key] = max(self.peak.get(key, v), v)
        for reason in s.get("throttle") or ():
            if reason not in BENIGN_REASONS:
                self.throttled_s[reason] = self.throttled_s.get(reason, 0.0) + dt
        if self.phase == "pcie" and s.get("pcie_gen") and s.get("pcie_width"):
            self.pcie_under_load.append((s["pcie_gen"], s["pcie_width"]))

    def _poll_xids(self) -> None:
        if self._events is None:
            return
        for _ in range(XID_BATCH):
            data = self.q(None, "xid_events", "nvmlEventSetWait_v2", self._events, 0,
                          expected=("NVML_ERROR_TIMEOUT",))  # fmt: skip
            if data is None:
                return
            self.xids.append(int(getattr(data, "eventData", 0)))


def _text(v: Any) -> str | None:
    return v.decode() if isinstance(v, bytes) else v


def _milli(v: Any) -> float | None:
    return None if v is None else round(v / 1000.0, 1)


def _ecc_on(mode: Any) -> bool | None:
    if mode is None:
        return None
    current = mode[0] if isinstance(mode, (list, tuple)) else mode
    return bool(current)
