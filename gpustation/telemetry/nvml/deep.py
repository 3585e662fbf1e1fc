"""The NVML readings the generic field reader cannot do: events, GPM, NVLink, MIG.

Each has a reader of its own here, and every call goes through the one
:class:`~gpustation.telemetry.nvml.query.Query`, so a reading the driver
refuses is ``None`` and never hides the others:

* :class:`XidWatcher`: XID errors from NVML events, waited for on a thread of
  its own (long waits in the driver, so an idle watcher costs nothing), so no
  read ever blocks on them;
* :class:`GpmReader`: profiling metrics (SM activity, occupancy, tensor and
  DRAM activity) from two GPM samples, only while a reader asks for them;
* :class:`NvLinkReader`: each link's state, data throughput (from the
  driver's counters between two reads) and error counters;
* :func:`read_mig`: MIG mode and each MIG device (read only: nothing here, or
  anywhere in gpustation, changes MIG mode);
* :class:`ProcessUtilization`: each process's share of the SMs.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from gpustation.telemetry.model import (
    MigInfo,
    MigInstance,
    NvLinkInfo,
    ProcessInfo,
    XidEvent,
    xid_meaning,
)
from gpustation.telemetry.nvml.query import FAILED, Device, GpuLost, Query

_MIB = 1024.0 * 1024.0

# ---- XID events ------------------------------------------------------------------------

#: How long one wait for an event lasts in the driver: the watcher wakes only
#: this often when no XID comes.
XID_WAIT_MS = 10_000
#: How long closing waits for a wait in progress to end before leaving the
#: rest of the closing to the watcher's thread.
XID_CLOSE_GRACE_S = 0.1
#: The pause after a wait the driver failed, before the next one.
XID_RETRY_MS = 200
#: XIDs kept per GPU.
XID_KEEP = 16


class XidWatcher:
    """Registers the GPUs for XID events and gathers them on a thread.

    A GPU whose registration the driver refuses (NotSupported) has no list:
    :meth:`events` gives ``None`` for it, never ``[]``. ``wait_ms`` is how long
    one wait in the driver lasts (:data:`XID_WAIT_MS` when not given).
    """

    def __init__(
        self,
        q: Query,
        gpus: Sequence[Device],
        clock: Callable[[], float] = time.time,
        wait_ms: int | None = None,
    ) -> None:
        self.q = q
        self._clock = clock
        self.wait_ms = XID_WAIT_MS if wait_ms is None else wait_ms
        self._lock = threading.Lock()
        self._finish_lock = threading.Lock()
        self._finished = False
        self._then: Callable[[], None] | None = None
        self._events: dict[int, deque[XidEvent]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set: Any = None
        #: every event received (tests and debug views wait on it)
        self.received = 0
        xid_type = _const(q, "nvmlEventTypeXidCriticalError")
        if xid_type is None:
            return
        event_set = q(None, "xid_events", "nvmlEventSetCreate", failed=FAILED)
        if event_set is FAILED:
            return
        self._set = event_set
        for gpu in gpus:
            if gpu.lost or gpu.handle is None:
                continue
            try:
                done = q(
                    gpu,
                    "xid_events",
                    "nvmlDeviceRegisterEvents",
                    xid_type,
                    event_set,
                    failed=FAILED,
                )
            except GpuLost:
                continue
            if done is not FAILED:
                self._events[gpu.index] = deque(maxlen=XID_KEEP)
        if not self._events:
            self._free()
            return
        self._thread = threading.Thread(target=self._run, name="gpustation-xid", daemon=True)
        self._thread.start()

    @property
    def watching(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def events(self, index: int) -> list[XidEvent] | None:
        """The last XIDs of GPU ``index``, oldest first; None when not watched."""
        with self._lock:
            found = self._events.get(index)
            return None if found is None or not self.watching else list(found)

    def _run(self) -> None:
        try:
            self._watch()
        finally:
            if self._stop.is_set():  # closed while waiting: the closing is done here
                self._finish()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.q(
                    None,
                    "xid_events",
                    "nvmlEventSetWait_v2",
                    self._set,
                    self.wait_ms,
                    expected=("NVML_ERROR_TIMEOUT",),
                    failed=FAILED,
                )
            except GpuLost:
                data = FAILED
            if data is FAILED:
                if self._gone():
                    return
                # never spin on a broken wait
                self._stop.wait(min(self.wait_ms, XID_RETRY_MS) / 1000.0)
                continue
            if data is not None and not self._stop.is_set():
                self._received(data)

    def _gone(self) -> bool:
        """True when no wait function is left to call (missing or NotSupported)."""
        return not self.q.available(None, "nvmlEventSetWait_v2")

    def _received(self, data: Any) -> None:
        xid_type = _const(self.q, "nvmlEventTypeXidCriticalError")
        if xid_type is not None and not int(getattr(data, "eventType", xid_type)) & xid_type:
            return
        index = self._index_of(getattr(data, "device", None))
        if index is None:
            return
        code = int(getattr(data, "eventData", 0))
        event = XidEvent(time=self._clock(), code=code, meaning=xid_meaning(code))
        with self._lock:
            found = self._events.get(index)
            if found is not None:
                found.append(event)
            self.received += 1

    def _index_of(self, handle: Any) -> int | None:
        if len(self._events) == 1:
            return next(iter(self._events))
        if handle is None:
            return None
        try:
            index = self.q(None, "xid_events", "nvmlDeviceGetIndex", handle)
        except GpuLost:
            return None
        return None if index is None else int(index)

    def _free(self) -> None:
        if self._set is not None:
            self.q(None, "xid_events", "nvmlEventSetFree", self._set)
            self._set = None

    def close(self, then: Callable[[], None] | None = None) -> None:
        """Stop watching, free the event set, then call ``then`` (the NVML shutdown).

        Returns within :data:`XID_CLOSE_GRACE_S`. The driver's wait cannot be
        cut short, and neither the set nor NVML may go while a wait uses them:
        when one is still in progress, the watcher's thread does the freeing
        and calls ``then`` as soon as that wait returns.
        """
        self._then = then
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=XID_CLOSE_GRACE_S)
            if thread.is_alive():
                return
        self._finish()

    def _finish(self) -> None:
        with self._finish_lock:
            if self._finished:
                return
            self._finished = True
        try:
            self._free()
        finally:
            if self._then is not None:
                self._then()


def _const(q: Query, name: str) -> int | None:
    try:
        return q.const(name)
    except (AttributeError, TypeError, ValueError):
        return None


# ---- GPM ---------------------------------------------------------------------------------

#: (model field, the GPM metric behind it)
GPM_METRICS: tuple[tuple[str, str], ...] = (
    ("sm_active_pct", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor_active_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("dram_active_pct", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)
#: The shortest time between the two samples of one reading.
GPM_MIN_WINDOW_S = 0.1


class _GpmState:
    __slots__ = ("last", "prev", "prev_at", "samples", "supported")

    def __init__(self) -> None:
        self.supported: bool | None = None
        self.samples: list[Any] = []
        self.prev: Any = None  # the sample taken last
        self.prev_at = 0.0
        self.last: dict[str, float | None] | None = None


class GpmReader:
    """GPM metrics of each GPU from the sample taken now and the one before.

    The first reading of a GPU takes a sample, waits :data:`GPM_MIN_WINDOW_S`
    (less the time the other reads took, see :meth:`begin`) and takes the
    second; afterwards each reading pairs its sample with the previous read's.
    """

    def __init__(self, q: Query, wait: Callable[[float], None] = time.sleep) -> None:
        self.q = q
        self._wait = wait
        self._state: dict[int, _GpmState] = {}
        self._ids = [(key, _const(q, const)) for key, const in GPM_METRICS]

    def _gpu(self, gpu: Device) -> _GpmState | None:
        state = self._state.setdefault(gpu.index, _GpmState())
        if state.supported is None:
            support = self.q(gpu, "gpm", "nvmlGpmQueryDeviceSupport")
            state.supported = bool(support is not None and getattr(support, "isSupportedDevice", 0))
            if state.supported and not self._alloc(state):
                state.supported = False
        return state if state.supported else None

    def _alloc(self, state: _GpmState) -> bool:
        if getattr(self.q.nvml, "c_nvmlGpmMetricsGet_t", None) is None:
            return False
        for _ in range(2):
            sample = self.q(None, "gpm", "nvmlGpmSampleAlloc")
            if sample is None:
                return False
            state.samples.append(sample)
        return True

    def _take(self, gpu: Device, state: _GpmState) -> Any:
        spare = state.samples[1] if state.prev is state.samples[0] else state.samples[0]
        got = self.q(gpu, "gpm", "nvmlGpmSampleGet", spare, failed=FAILED)
        return None if got is FAILED else spare

    def begin(self, gpus: Sequence[Device]) -> None:
        """Take the first sample of GPUs that have none, before the other reads."""
        for gpu in gpus:
            state = self._gpu(gpu)
            if state is not None and state.prev is None:
                state.prev = self._take(gpu, state)
                state.prev_at = time.monotonic()

    def read(self, gpu: Device) -> dict[str, float | None] | None:
        """The metrics by model field; None when the GPU has no GPM."""
        state = self._gpu(gpu)
        if state is None:
            return None
        if state.prev is None:
            self.begin([gpu])
            if state.prev is None:
                return None
        gap = time.monotonic() - state.prev_at
        if gap < GPM_MIN_WINDOW_S:
            if state.last is not None:
                return state.last  # read again too soon: the last values stand
            self._wait(GPM_MIN_WINDOW_S - gap)
        cur = self._take(gpu, state)
        if cur is None:
            return None
        values = self._metrics(state.prev, cur)
        state.prev, state.prev_at = cur, time.monotonic()
        state.last = values
        return values

    def _metrics(self, first: Any, second: Any) -> dict[str, float | None]:
        nvml = self.q.nvml
        wanted = [(key, mid) for key, mid in self._ids if mid is not None]
        out: dict[str, float | None] = {key: None for key, _ in self._ids}
        get = nvml.c_nvmlGpmMetricsGet_t()
        get.version = getattr(nvml, "NVML_GPM_METRICS_GET_VERSION", 1)
        get.numMetrics = len(wanted)
        get.sample1 = first
        get.sample2 = second
        for i, (_, mid) in enumerate(wanted):
            get.metrics[i].metricId = mid
        answer = self.q(None, "gpm", "nvmlGpmMetricsGet", get)
        if answer is None:
            return out
        ok = getattr(nvml, "NVML_SUCCESS", 0)
        for i, (key, _) in enumerate(wanted):
            metric = answer.metrics[i]
            if int(getattr(metric, "nvmlReturn", ok)) == ok:
                out[key] = max(0.0, min(100.0, float(metric.value)))
        return out

    def forget(self) -> None:
        """Drop the previous samples (GPM not asked for): the next reading starts afresh."""
        for state in self._state.values():
            state.prev, state.last = None, None

    def close(self) -> None:
        for state in self._state.values():
            for sample in state.samples:
                self.q(None, "gpm", "nvmlGpmSampleFree", sample)
            state.samples.clear()
            state.prev = None


# ---- NVLink ------------------------------------------------------------------------------

_ERROR_COUNTERS = (
    ("replay_errors", ("NVML_NVLINK_ERROR_DL_REPLAY",)),
    ("recovery_errors", ("NVML_NVLINK_ERROR_DL_RECOVERY",)),
    ("crc_errors", ("NVML_NVLINK_ERROR_DL_CRC_FLIT", "NVML_NVLINK_ERROR_DL_CRC_DATA")),
)


class NvLinkReader:
    """Each NVLink of a GPU; throughput is the change of the data counters between reads."""

    def __init__(self, q: Query) -> None:
        self.q = q
        self._max = _const(q, "NVML_NVLINK_MAX_LINKS") or 18
        self._tx = _const(q, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX")
        self._rx = _const(q, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX")
        self._counters = [
            (key, [c for c in (_const(q, n) for n in names) if c is not None])
            for key, names in _ERROR_COUNTERS
        ]
        #: (gpu, field id, link) -> (timestamp in µs, KiB so far)
        self._last: dict[tuple[int, int, int], tuple[int, int]] = {}

    def read(self, gpu: Device) -> list[NvLinkInfo] | None:
        """[] when the GPU has no NVLink (NotSupported), None when it cannot say."""
        if "nvmlDeviceGetNvLinkState" in gpu.unsupported:
            return []
        links: list[NvLinkInfo] = []
        for link in range(self._max):
            # Past its last link a GPU answers InvalidArgument (or NotSupported on
            # some drivers): the end of the list, not a GPU without NVLink.
            past = ("NVML_ERROR_INVALID_ARGUMENT",) + (
                ("NVML_ERROR_NOT_SUPPORTED",) if link else ()
            )
            state = self.q(
                gpu, "nvlink", "nvmlDeviceGetNvLinkState", link, expected=past, failed=FAILED
            )
            if state is FAILED:
                if link == 0:
                    return [] if "nvmlDeviceGetNvLinkState" in gpu.unsupported else None
                break
            if state is None:  # past the links this GPU has
                break
            info = NvLinkInfo(link=link, active=bool(state))
            if info.active:
                for key, counters in self._counters:
                    total: int | None = 0
                    for counter in counters:
                        value = self.q(
                            gpu, "nvlink", "nvmlDeviceGetNvLinkErrorCounter", link, counter
                        )
                        if value is None:
                            total = None
                            break
                        total = (total or 0) + int(value)
                    setattr(info, key, None if not counters else total)
            links.append(info)
        self._throughput(gpu, [x for x in links if x.active])
        return links

    def _throughput(self, gpu: Device, links: list[NvLinkInfo]) -> None:
        if not links or self._tx is None or self._rx is None:
            return
        ids = [(fid, x.link) for x in links for fid in (self._tx, self._rx)]
        values = self.q(gpu, "nvlink", "nvmlDeviceGetFieldValues", ids)
        if values is None:
            return
        ok = getattr(self.q.nvml, "NVML_SUCCESS", 0)
        by_link = {x.link: x for x in links}
        for v in values:
            if int(getattr(v, "nvmlReturn", ok)) != ok:
                continue
            fid, link = int(v.fieldId), int(v.scopeId)
            now = (int(v.timestamp), int(v.value.ullVal))
            before = self._last.get((gpu.index, fid, link))
            self._last[(gpu.index, fid, link)] = now
            info = by_link.get(link)
            if before is None or info is None or now[0] <= before[0] or now[1] < before[1]:
                continue
            rate = (now[1] - before[1]) / ((now[0] - before[0]) / 1e6)
            if fid == self._tx:
                info.tx_kib_s = rate
            else:
                info.rx_kib_s = rate


# ---- MIG (read only) -----------------------------------------------------------------

ProcessReader = Callable[[Device], list[ProcessInfo]]


def read_mig(q: Query, gpu: Device, processes: ProcessReader) -> MigInfo | None:
    """MIG mode and each MIG device; None where the GPU has no MIG."""
    mode = q(gpu, "mig", "nvmlDeviceGetMigMode")
    if mode is None:
        return None
    enabled = _const(q, "NVML_DEVICE_MIG_ENABLE") or 1
    info = MigInfo(enabled=int(mode[0]) == enabled, pending=int(mode[1]) == enabled)
    if not info.enabled:
        return info
    count = q(gpu, "mig", "nvmlDeviceGetMaxMigDeviceCount")
    for i in range(int(count or 0)):
        handle = q(
            gpu,
            "mig",
            "nvmlDeviceGetMigDeviceHandleByIndex",
            i,
            expected=("NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT"),
        )
        if handle is None:
            continue
        dev = Device(gpu.index)
        dev.handle = handle
        inst = MigInstance(index=i)
        gi = q(dev, "mig", "nvmlDeviceGetGpuInstanceId")
        ci = q(dev, "mig", "nvmlDeviceGetComputeInstanceId")
        inst.gpu_instance_id = None if gi is None else int(gi)
        inst.compute_instance_id = None if ci is None else int(ci)
        inst.uuid = _text(q(dev, "mig", "nvmlDeviceGetUUID"))
        name = _text(q(dev, "mig", "nvmlDeviceGetName"))
        if name and "MIG " in name:
            inst.profile = name.rsplit("MIG ", 1)[1].strip() or None
        memory = q(dev, "mig", "nvmlDeviceGetMemoryInfo")
        if memory is not None:
            inst.memory_used_mib = getattr(memory, "used", 0) / _MIB
            inst.memory_total_mib = getattr(memory, "total", 0) / _MIB
        inst.processes = processes(dev)
        info.instances.append(inst)
    return info


def _text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


# ---- per-process SM utilisation ----------------------------------------------------------


class ProcessUtilization:
    """Each process's SM share since the last read (``nvmlDeviceGetProcessUtilization``)."""

    def __init__(self, q: Query) -> None:
        self.q = q
        self._seen: dict[int, int] = {}  # gpu index -> the newest sample's timestamp (µs)

    def read(self, gpu: Device) -> dict[int, float] | None:
        """pid -> SM %; {} when no process ran since the last read; None if unknown."""
        samples = self.q(
            gpu,
            "processes.sm_pct",
            "nvmlDeviceGetProcessUtilization",
            self._seen.get(gpu.index, 0),
            expected=("NVML_ERROR_NOT_FOUND", "NVML_SUCCESS"),
            failed=FAILED,
        )
        if samples is FAILED:
            return None
        newest: dict[int, tuple[int, float]] = {}
        for s in samples or ():
            stamp = int(getattr(s, "timeStamp", 0))
            pid = int(s.pid)
            if pid not in newest or stamp >= newest[pid][0]:
                newest[pid] = (stamp, float(s.smUtil))
            self._seen[gpu.index] = max(self._seen.get(gpu.index, 0), stamp)
        return {pid: sm for pid, (_, sm) in newest.items()}
