"""The GPU during one phase of a run: its power, its utilisation, each workload's SM share.

:class:`GpuWatch` reads, every :data:`SAMPLE_S` on a thread of its own, each
GPU's power draw and utilisation and each process's share of the SMs
(``nvmlDeviceGetProcessUtilization``), through the one
:class:`~gpustation.telemetry.nvml.query.Query` and the telemetry's
:class:`~gpustation.telemetry.nvml.deep.ProcessUtilization` reader. A phase's
figures (:class:`PhaseGpu`) are those of the GPU the workloads' processes were
seen on (by pid), else of the GPU the run was given (``CUDA_VISIBLE_DEVICES``
in PCI order, as the launcher sets it).

A figure that cannot be known is ``None``, with the reason in words beside it
(no GPU, no NVML, a driver that does not report it), never a zero. This
module imports neither torch nor textual.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpustation.errors import NoDriverError
from gpustation.telemetry.nvml.deep import ProcessUtilization
from gpustation.telemetry.nvml.query import Device, GpuLost, Query, start_nvml

#: seconds between two readings while a phase runs
SAMPLE_S = 0.5

# Why a figure is missing, as the summary says it.
NO_GPU = "no GPU"
NO_POWER = "the driver does not report power draw"
NO_UTIL = "the driver does not report utilisation"
NO_PROCESS_UTIL = "the driver does not report per-process utilisation"
NO_PIDS = (
    "the driver reported no utilisation for the workloads' processes "
    "(process ids of another namespace, as in a container?)"
)
NOT_FOUND = "the GPU the run was given is not among those NVML sees"


@dataclass
class PhaseGpu:
    """What one phase did to its GPU; ``None`` where it is not known (the notes say why)."""

    power_w_mean: float | None = None
    power_w_peak: float | None = None
    util_pct_mean: float | None = None
    #: role (``train``, ``infer``) -> mean SM % over the phase
    sm_pct: dict[str, float | None] = field(default_factory=dict)
    #: why power or utilisation are missing
    gpu_note: str | None = None
    #: why the SM shares are missing
    sm_note: str | None = None
    samples: int = 0

    def fields(self, roles: tuple[str, ...]) -> dict[str, Any]:
        """The figures as metric keys: ``power_w_mean`` ... ``sm_pct_train``, and the notes."""
        out: dict[str, Any] = {
            "power_w_mean": _round(self.power_w_mean, 1),
            "power_w_peak": _round(self.power_w_peak, 1),
            "util_pct_mean": _round(self.util_pct_mean, 1),
        }
        for role in roles:
            out[f"sm_pct_{role}"] = _round(self.sm_pct.get(role), 1)
        if self.gpu_note:
            out["gpu_note"] = self.gpu_note
        if self.sm_note:
            out["sm_note"] = self.sm_note
        return out


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def visible_index(
    cuda_index: int, env: Mapping[str, str], uuids: Callable[[], list[str | None]]
) -> int | None:
    """The NVML index of CUDA device ``cuda_index`` under ``CUDA_VISIBLE_DEVICES``.

    Entries are NVML indices (the launcher sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
    NVML's order) or UUIDs (or their unique start, as CUDA takes them); ``uuids``
    gives each NVML device's UUID when one is needed. None: not to be told.
    """
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return cuda_index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not 0 <= cuda_index < len(entries):
        return None
    entry = entries[cuda_index]
    if entry.isdigit():
        return int(entry)
    found = [i for i, u in enumerate(uuids()) if u and u.startswith(entry)]
    return found[0] if len(found) == 1 else None


class _Tally:
    """One GPU's readings over a phase."""

    def __init__(self) -> None:
        self.power_w: list[float] = []
        self.util_pct: list[float] = []
        #: role -> SM % of each reading that answered
        self.sm: dict[str, list[float]] = {}
        #: readings the driver answered (with samples or without)
        self.sm_reads = 0
        #: readings in which a workload's pid had a sample
        self.ours = 0
        self.lost = False


class GpuWatch:
    """Samples the GPUs while a phase runs: ``start(pids)``, then ``stop()`` -> :class:`PhaseGpu`.

    ``cuda_index`` is the run's CUDA device (None: it runs on the CPU). ``nvml``
    stands in for ``pynvml`` (a fake in tests).
    """

    def __init__(
        self,
        cuda_index: int | None,
        nvml: Any = None,
        env: Mapping[str, str] | None = None,
        interval: float = SAMPLE_S,
    ) -> None:
        self.interval = interval
        #: why nothing can be read (None: NVML answers)
        self.reason: str | None = None
        self._nvml: Any = None
        self._devices: list[Device] = []
        self._preferred: int | None = None
        self._pids: dict[str, int] = {}
        self._tallies: dict[int, _Tally] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if cuda_index is None:
            self.reason = NO_GPU
            return
        try:
            self._nvml = start_nvml(nvml)
        except NoDriverError as err:
            self.reason = str(err)
            return
        self.q = Query(self._nvml)
        self._util = ProcessUtilization(self.q)
        count = self.q(None, "count", "nvmlDeviceGetCount")
        for index in range(int(count or 0)):
            device = Device(index)
            device.handle = self.q(None, "handle", "nvmlDeviceGetHandleByIndex", index)
            if device.handle is not None:
                self._devices.append(device)
        if not self._devices:
            self.reason = NO_GPU
            return
        self._preferred = visible_index(cuda_index, env if env is not None else os.environ,
                                        self._uuids)  # fmt: skip

    def _uuids(self) -> list[str | None]:
        by_index = {d.index: d for d in self._devices}
        top = max(by_index) + 1 if by_index else 0
        out: list[str | None] = []
        for i in range(top):
            device = by_index.get(i)
            uuid = self.q(device, "uuid", "nvmlDeviceGetUUID") if device else None
            out.append(uuid.decode() if isinstance(uuid, bytes) else uuid)
        return out

    # -- a phase ---------------------------------------------------------------------------

    def start(self, pids: Mapping[str, int]) -> None:
        """Begin a phase whose workloads run as ``pids`` (role -> pid)."""
        self._halt()  # a phase that ended by an error left its thread going
        self._pids = dict(pids)
        self._tallies = {d.index: _Tally() for d in self._devices}
        if self.reason is not None:
            return
        for device in self._devices:
            try:
                self._util.read(device)  # from now on: what came before is another phase's
            except GpuLost:
                self._tallies[device.index].lost = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpuwatch", daemon=True)
        self._thread.start()

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        """One reading of every GPU (the thread's pass; tests call it directly)."""
        for device in self._devices:
            tally = self._tallies.get(device.index)
            if tally is None or tally.lost:
                continue
            try:
                self._read(device, tally)
            except GpuLost:
                tally.lost = True
            except Exception:  # a broken binding must not end the run
                tally.lost = True

    def _read(self, device: Device, tally: _Tally) -> None:
        q = self.q
        milliwatts = q(device, "power_w", "nvmlDeviceGetPowerUsage")
        if milliwatts is not None:
            tally.power_w.append(float(milliwatts) / 1000.0)
        rates = q(device, "utilization_gpu_pct", "nvmlDeviceGetUtilizationRates")
        if rates is not None and getattr(rates, "gpu", None) is not None:
            tally.util_pct.append(float(rates.gpu))
        shares = self._util.read(device)
        if shares is None:  # NotSupported (not asked again), or the call failed
            return
        tally.sm_reads += 1
        if any(pid in shares for pid in self._pids.values()):
            tally.ours += 1
        for role, pid in self._pids.items():
            # No sample since the last reading: the process did not run on the SMs.
            tally.sm.setdefault(role, []).append(shares.get(pid, 0.0))

    def stop(self) -> PhaseGpu:
        """End the phase: its GPU's figures, or the reasons they are missing."""
        if self.reason is not None:
            return PhaseGpu(gpu_note=self.reason, sm_note=self.reason)
        self._halt()
        self.sample()  # a phase shorter than the interval still has a reading
        return self.figures()

    def figures(self) -> PhaseGpu:
        """The phase's figures from the readings so far."""
        if self.reason is not None:
            return PhaseGpu(gpu_note=self.reason, sm_note=self.reason)
        index = self._gpu_index()
        tally = self._tallies.get(index) if index is not None else None
        if tally is None:
            return PhaseGpu(gpu_note=NOT_FOUND, sm_note=NOT_FOUND)
        out = PhaseGpu(
            power_w_mean=_mean(tally.power_w),
            power_w_peak=max(tally.power_w, default=None),
            util_pct_mean=_mean(tally.util_pct),
            samples=max(len(tally.power_w), len(tally.util_pct), tally.sm_reads),
        )
        missing = [why for why, values in ((NO_POWER, tally.power_w), (NO_UTIL, tally.util_pct))
                   if not values]  # fmt: skip
        out.gpu_note = "; ".join(missing) or None
        if not tally.sm_reads:
            out.sm_note = NO_PROCESS_UTIL
        elif not tally.ours:
            out.sm_note = NO_PIDS
        else:
            out.sm_pct = {role: _mean(tally.sm.get(role, [])) for role in self._pids}
        return out

    def _gpu_index(self) -> int | None:
        """The GPU the workloads ran on: where their pids were seen most, else the run's."""
        seen = {i: t.ours for i, t in self._tallies.items() if t.ours}
        if seen:
            return max(seen, key=lambda i: seen[i])
        if self._preferred in self._tallies:
            return self._preferred
        return None

    def close(self) -> None:
        """Stop sampling and end the NVML session."""
        self._halt()
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # closing must not raise
                pass
            self._nvml = None

    def __enter__(self) -> GpuWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
