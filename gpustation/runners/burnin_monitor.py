"""The burn-in's NVML monitor: one GPU's temperature, power, clocks, throttle
reasons, PCIe link and XID events, sampled in a thread while the load runs,
and its ECC, remapped-row and violation counters read before and after.

Every reading may be missing: without pynvml, a driver or a GPU the monitor
says why and the burn-in reports the NVML checks as not available.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

# Throttle ("clocks event") reason bits as NVML defines them, in words.
THROTTLE_REASONS = {
    0x1: "idle",
    0x2: "application clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}


@dataclass
class Monitor:
    """NVML readings of one GPU, sampled in a thread; every reading may be missing."""

    device: torch.device
    interval: float = 0.5
    available: bool = False
    reason: str = ""
    static: dict[str, Any] = field(default_factory=dict)
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    phase: str = "setup"
    samples: int = 0
    peak: dict[str, float] = field(default_factory=dict)
    throttled_s: dict[str, float] = field(default_factory=dict)
    pcie_under_load: list[tuple[int, int]] = field(default_factory=list)
    xids: list[int] = field(default_factory=list)
    last: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._events: Any = None
        self._lock = threading.Lock()
        if self.device.type != "cuda":
            self.reason = "no GPU (running on the CPU)"
            return
        try:
            # guarded: a machine without NVML still runs the burn-in
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handle = self._handle()
        except Exception as exc:  # no pynvml, no driver, no handle
            self.reason = f"NVML not available ({type(exc).__name__}: {exc})"
            return
        self.available = True
        nv, h = self.nv, self.handle
        q = self._q
        self.static = {
            "name": q(nv.nvmlDeviceGetName, h),
            "power_limit_w": _milli(q(nv.nvmlDeviceGetEnforcedPowerLimit, h)),
            "slowdown_temp_c": q(
                nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            ),
            "max_sm_clock_mhz": q(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
            "max_mem_clock_mhz": q(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM),
            "pcie_gen_max": q(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
            "pcie_width_max": q(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
            "ecc_enabled": _ecc_on(q(nv.nvmlDeviceGetEccMode, h)),
        }
        try:
            self._events = nv.nvmlEventSetCreate()
            nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._events)
        except Exception:
            self._events = None
        self.static["xid_events_supported"] = self._events is not None

    def thermal_s(self) -> float:
        """Seconds slowed by heat: the thermal and slowdown reasons, summed."""
        return sum(v for k, v in self.throttled_s.items() if "thermal" in k or "slowdown" in k)

    def _handle(self) -> Any:
        props = torch.cuda.get_device_properties(self.device)
        uuid = getattr(props, "uuid", None)
        if uuid is not None:
            try:
                return self.nv.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            except Exception:
                pass
        bus = getattr(props, "pci_bus_id", None)
        if bus is not None:
            dom = getattr(props, "pci_domain_id", 0)
            dev = getattr(props, "pci_device_id", 0)
            return self.nv.nvmlDeviceGetHandleByPciBusId(f"{dom:08x}:{bus:02x}:{dev:02x}.0")
        return self.nv.nvmlDeviceGetHandleByIndex(self.device.index or 0)

    def _q(self, fn: Any, *a: Any) -> Any:
        try:
            return fn(*a)
        except Exception:
            return None

    def counters(self) -> dict[str, Any]:
        """ECC, remapped rows and throttle-violation counters (read before and after)."""
        if not self.available:
            return {}
        nv, h, q = self.nv, self.handle, self._q
        out: dict[str, Any] = {
            "ecc_corrected": q(nv.nvmlDeviceGetTotalEccErrors, h,
                               nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
            "ecc_uncorrected": q(nv.nvmlDeviceGetTotalEccErrors, h,
                                 nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
        }  # fmt: skip
        rows = q(nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            out.update(remapped_corrected=rows[0], remapped_uncorrected=rows[1],
                       remap_pending=bool(rows[2]), remap_failure=bool(rows[3]))  # fmt: skip
        for name, policy in (("power", "NVML_PERF_POLICY_POWER"),
                             ("thermal", "NVML_PERF_POLICY_THERMAL")):  # fmt: skip
            v = q(nv.nvmlDeviceGetViolationStatus, h, getattr(nv, policy, -1))
            out[f"violation_{name}_ns"] = getattr(v, "violationTime", None)
        return out

    def sample(self) -> dict[str, Any]:
        nv, h, q = self.nv, self.handle, self._q
        reasons = q(getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                    or nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)  # fmt: skip
        util = q(nv.nvmlDeviceGetUtilizationRates, h)
        return {
            "temp_c": q(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
            "power_w": _milli(q(nv.nvmlDeviceGetPowerUsage, h)),
            "sm_clock_mhz": q(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": q(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
            "throttle": reasons,
            "pcie_gen": q(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
            "pcie_width": q(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
            "util_pct": getattr(util, "gpu", None),
        }

    def start(self) -> None:
        self.before = self.counters()
        if self.available:
            self._thread = threading.Thread(target=self._run, name="burnin-nvml", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.after = self.counters()
        if self._events is not None:
            try:
                self.nv.nvmlEventSetFree(self._events)
            except Exception:
                pass

    def _run(self) -> None:
        prev = time.monotonic()
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            dt, prev = now - prev, now
            s = self.sample()
            self._poll_xids()
            with self._lock:
                self._add(s, dt)

    def _add(self, s: dict[str, Any], dt: float) -> None:
        self.samples += 1
        self.last = s
        for key in ("temp_c", "power_w", "sm_clock_mhz", "mem_clock_mhz"):
            v = s.get(key)
            if v is not None:
                self.peak[key] = max(self.peak.get(key, v), v)
        bits = s.get("throttle") or 0
        for bit, name in THROTTLE_REASONS.items():
            if bits & bit and bit not in (0x1,):
                self.throttled_s[name] = self.throttled_s.get(name, 0.0) + dt
        if self.phase == "pcie" and s.get("pcie_gen") and s.get("pcie_width"):
            self.pcie_under_load.append((s["pcie_gen"], s["pcie_width"]))

    def _poll_xids(self) -> None:
        if self._events is None:
            return
        for _ in range(16):
            try:
                data = self.nv.nvmlEventSetWait_v2(self._events, 0)
            except Exception:
                return
            self.xids.append(int(getattr(data, "eventData", 0)))


def _milli(v: Any) -> float | None:
    return None if v is None else round(v / 1000.0, 1)


def _ecc_on(mode: Any) -> bool | None:
    if mode is None:
        return None
    current = mode[0] if isinstance(mode, (list, tuple)) else mode
    return bool(current)
