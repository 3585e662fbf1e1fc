"""The NVML backend: open the GPUs and read their fields.

Which fields there are, what each costs and how NVML reads it come from the
declarations in :mod:`gpustation.telemetry.model`; this module interprets
them. Identity and static fields are read when a GPU opens (static ones from
the :class:`StaticCache` when ``one_shot``), fast fields on every read, one
GPU after another, and slow fields only when asked (``slow=True``), each on a
thread of its own beside the fast reads: they are the slow driver calls
(PCIe throughput samples the bus for a while), and NVML drops the GIL.

Every call goes through :class:`~gpustation.telemetry.nvml.query.Query`, so
one failing field never hides the others. A GPU that falls off the bus is
reported with ``lost=True`` and retried at most every ``LOST_RETRY_S``
seconds; the other GPUs keep reporting. Control (the power limit, the fans)
is the :class:`~gpustation.telemetry.nvml.setters.NvmlControl` it owns
(``backend.control``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from gpustation.errors import NoDriverError, UsageError
from gpustation.paths import state_dir
from gpustation.telemetry.backend import Backend, OpenRequest
from gpustation.telemetry.model import (
    FAST,
    IDENTITY,
    SLOW,
    STATIC,
    GpuSample,
    NamedVersion,
    ProcessInfo,
    Topology,
    field_keys,
    put_field,
)
from gpustation.telemetry.nvml.deep import (
    GpmReader,
    NvLinkReader,
    ProcessUtilization,
    XidWatcher,
    read_mig,
)
from gpustation.telemetry.nvml.gpus import Gpu
from gpustation.telemetry.nvml.query import (
    MISSING,
    Device,
    GpuLost,
    Query,
    cuda_version,
    no_driver_message,
    start_nvml,
)
from gpustation.telemetry.nvml.reads import READS, NvmlRead, converters
from gpustation.telemetry.nvml.setters import NvmlControl
from gpustation.telemetry.nvml.static_cache import STATIC_CACHE_FILE, StaticCache
from gpustation.telemetry.nvml.topology import TopologyReader, text

#: A lost GPU's handle is tried again at most this often.
LOST_RETRY_S = 10.0

_MIB = 1024.0 * 1024.0
_FIELD_VALUES = "nvmlDeviceGetFieldValues"
#: NVML_VALUE_TYPE_<name> -> the member of nvmlValue_t that holds it.
_VALUE_MEMBERS = (
    ("DOUBLE", "dVal"),
    ("UNSIGNED_INT", "uiVal"),
    ("UNSIGNED_LONG", "ulVal"),
    ("UNSIGNED_LONG_LONG", "ullVal"),
    ("SIGNED_LONG_LONG", "sllVal"),
    ("SIGNED_INT", "siVal"),
    ("UNSIGNED_SHORT", "usVal"),
)
# NVML's "value not available" for unsigned long long fields (usedGpuMemory).
_NOT_AVAILABLE_ULL = (1 << 64) - 1


class Field(NamedTuple):
    """A declared field the backend reads: ``key`` is ``power_w`` or ``pcie.tx_kib_s``."""

    key: str
    record: str | None  # None: a GpuSample attribute; "pcie": one of PcieInfo...
    name: str
    cost: str
    read: NvmlRead


def _declared() -> tuple[Field, ...]:
    found = []
    for key, spec in field_keys().items():
        read = READS[key]
        if read is not None:
            record, dot, name = key.rpartition(".")
            found.append(Field(key, record if dot else None, name, spec.cost, read))
    return tuple(found)


FIELDS = _declared()
BY_COST = {
    cost: tuple(f for f in FIELDS if f.cost == cost) for cost in (IDENTITY, STATIC, FAST, SLOW)
}
_BY_KEY = {f.key: f for f in FIELDS}
#: Slow readings of the deep readers (``telemetry/nvml/deep.py``), by field.
DEEP_SLOW = ("nvlink", "mig")
#: What the static cache keeps of a GPU: its static fields, and the fan count the
#: per-fan reads need.
CACHED_KEYS = (*(f.key for f in BY_COST[STATIC]), "num_fans")


def _put(sample: GpuSample, f: Field, value: Any) -> None:
    setattr(sample if f.record is None else getattr(sample, f.record), f.name, value)


def _put_key(sample: GpuSample, key: str, value: Any) -> None:
    # a deep reading's list is the backend's own: the sample gets a copy
    put_field(sample, key, list(value) if key in DEEP_SLOW and isinstance(value, list) else value)


class NvmlBackend(Backend):
    """Reads and controls real GPUs through ``pynvml`` (or a module like it: a fake)."""

    simulated = False

    def __init__(
        self,
        nvml: Any = None,
        sysfs_pci_root: str = "/sys/bus/pci/devices",
        sysfs_node_root: str = "/sys/devices/system/node",
        one_shot: bool = False,
        static_cache: str | None = None,
    ) -> None:
        """``one_shot`` says the process reads once and exits (``gpustation
        snapshot``): static values then come from the :class:`StaticCache` in
        the state directory when it has them. ``static_cache`` names another
        file for that cache."""
        self.nvml = nvml = start_nvml(nvml)
        self.q = Query(nvml)
        self._closed = False
        # One read or write at a time: nvidia-ml-py hands some getters one shared
        # ctypes object (nvmlDeviceGetFanControlPolicy_v2).
        self._lock = threading.RLock()
        self.control = NvmlControl(self.q, self._lock, self)
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except self.q.error_type as err:
            self._shutdown()
            raise NoDriverError(no_driver_message(err)) from None
        self._args = {a: self._const(a) for f in FIELDS for a in f.read.args}
        self._convert = converters(self._const)
        self._success = self._const("NVML_SUCCESS") or 0
        self._field_refused = {
            c
            for c in (
                self._const("NVML_ERROR_NOT_SUPPORTED"),
                self._const("NVML_ERROR_INVALID_ARGUMENT"),
            )
            if c is not None
        }
        # A field value's type -> the member of its union that holds it.
        self._value_members = {
            c: member
            for name, member in _VALUE_MEMBERS
            if (c := self._const(f"NVML_VALUE_TYPE_{name}")) is not None
        }
        self._driver = text(self.q(None, "driver_version", "nvmlSystemGetDriverVersion"))
        self._nvml_version = text(self.q(None, "nvml_version", "nvmlSystemGetNVMLVersion"))
        cuda = self.q(None, "cuda_driver_version", "nvmlSystemGetCudaDriverVersion")
        self._cuda = cuda_version(int(cuda)) if cuda else None
        self._cache: StaticCache | None = None
        if one_shot or static_cache:
            if static_cache is None:
                static_cache = str(state_dir() / STATIC_CACHE_FILE)
            self._cache = StaticCache(static_cache, self._driver, CACHED_KEYS)
        self._gpus = [Gpu(i) for i in range(count)]
        self._topology = TopologyReader(
            self.q, self._gpus, self.mark_lost, sysfs_pci_root, sysfs_node_root
        )
        self._gpm = GpmReader(self.q)
        self._nvlink = NvLinkReader(self.q)
        self._process_util = ProcessUtilization(self.q)
        #: GPU -> (pid -> SM %, the pids listed then), from the last slow pass
        self._process_sm: dict[int, tuple[dict[int, float], frozenset[int]] | None] = {}
        self._xid: XidWatcher | None = None
        try:
            for gpu in self._gpus:
                self._open_gpu(gpu)
            if not one_shot:
                # Events come only from the moment of registration: a one-shot
                # read would never see one, so it does not watch.
                self._xid = XidWatcher(self.q, self._gpus)
        except BaseException:
            self.close()  # leave no NVML session behind
            raise

    def _const(self, name: str) -> int | None:
        try:
            return self.q.const(name)
        except (AttributeError, TypeError, ValueError):  # an nvidia-ml-py without it
            return None

    @property
    def errors(self) -> dict[tuple[int, str], str]:
        """(gpu index or -1 for system calls, field) -> last error text, for a debug view."""
        return self.q.errors

    @property
    def missing_functions(self) -> set[str]:
        """pynvml functions absent or unknown to the driver; never called again."""
        return MISSING

    # ---- reading one declared field -------------------------------------------

    def _read(self, gpu: Gpu, f: Field, memo: dict[tuple[Any, ...], Any]) -> Any:
        """One field's value, ``None`` when NVML cannot give it; raises GpuLost."""
        r = f.read
        args = tuple(self._args[a] for a in r.args)
        if None in args:
            return None
        convert = self._convert[r.convert]
        if r.per_fan:
            values = [self.q(gpu, f.key, r.function, *args, fan) for fan in range(gpu.num_fans)]
            return [convert(v) for v in values if v is not None]
        if r.function == _FIELD_VALUES:
            return self._field_value(gpu, f, args)
        call = (r.function, *args)
        if call in memo:  # one call answers several fields (memory used and total...)
            raw = memo[call]
        else:
            raw = memo[call] = self.q(gpu, f.key, r.function, *args, per_args=bool(args))
        if raw is not None and r.part is not None:
            raw = raw[r.part] if isinstance(r.part, int) else getattr(raw, r.part, None)
        return None if raw is None else convert(raw)

    def _field_value(self, gpu: Gpu, f: Field, ids: tuple[Any, ...]) -> Any:
        """A field value (``nvmlDeviceGetFieldValues``): the call succeeds while each
        value carries its own status, so a field the card lacks is remembered
        per GPU and not asked again."""
        tag = f"{_FIELD_VALUES}:{ids[0]}"
        if tag in gpu.unsupported:
            return None
        values = self.q(gpu, f.key, _FIELD_VALUES, list(ids))
        if not values:
            return None
        value = values[0]
        status = int(getattr(value, "nvmlReturn", 0))
        if status != self._success:
            if status in self._field_refused:
                gpu.unsupported.add(tag)
            else:
                self.q.error(gpu.index, f.key, f"{_FIELD_VALUES}({ids[0]}): NVML error {status}")
            return None
        member = self._value_members.get(int(getattr(value, "valueType", -1)))
        if member is None:
            return None
        return self._convert[f.read.convert](getattr(value.value, member))

    # ---- opening a GPU: handle, identity and static values --------------------

    def _open_gpu(self, gpu: Gpu) -> bool:
        """Get the handle and read the identity and static values; False if lost."""
        try:
            gpu.handle = self.nvml.nvmlDeviceGetHandleByIndex(gpu.index)
            memo: dict[tuple[Any, ...], Any] = {}
            ident = {f.key: self._read(gpu, f, memo) for f in BY_COST[IDENTITY]}
            gpu.uuid = ident["uuid"] or gpu.uuid
            gpu.name = ident["name"] or gpu.name
            gpu.pci_bus_id = ident["pci_bus_id"] or gpu.pci_bus_id
            if not gpu.static:
                self._read_static(gpu, memo)
        except self.q.error_type as err:  # from nvmlDeviceGetHandleByIndex
            self.mark_lost(gpu, f"nvmlDeviceGetHandleByIndex: {err}")
            return False
        except GpuLost as err:
            self.mark_lost(gpu, str(err))
            return False
        gpu.lost = False
        return True

    def _read_static(self, gpu: Gpu, memo: dict[tuple[Any, ...], Any]) -> None:
        cache = self._cache
        cached = cache.get(gpu.uuid, gpu.pci_bus_id) if cache is not None else None
        if cached is not None and _fan_count(cached.get("num_fans")) is not None:
            gpu.num_fans = _fan_count(cached.pop("num_fans")) or 0
            gpu.static = cached
            return
        errors_before = self.q.error_count
        gpu.num_fans = _fan_count(self.q(gpu, "fan_count", "nvmlDeviceGetNumFans")) or 0
        gpu.static = {f.key: self._read(gpu, f, memo) for f in BY_COST[STATIC]}
        if cache is not None and self.q.error_count == errors_before:
            # Kept only when every value was answered cleanly.
            cache.remember(gpu.uuid, gpu.pci_bus_id, {**gpu.static, "num_fans": gpu.num_fans})

    def mark_lost(self, gpu: Device, why: str) -> None:
        gpu.lost = True
        gpu.lost_at = time.monotonic()
        self.q.errors[(gpu.index, "lost")] = why

    def gpu(self, index: int) -> Gpu:
        if not 0 <= index < len(self._gpus):
            raise UsageError(f"no GPU {index} on this machine ({len(self._gpus)} GPUs)")
        return self._gpus[index]

    def available(self, gpu: Gpu) -> bool:
        """True unless the GPU is lost; a lost GPU is retried now and then."""
        if not gpu.lost:
            return True
        now = time.monotonic()
        if now - gpu.lost_at < LOST_RETRY_S:
            return False
        gpu.lost_at = now
        return self._open_gpu(gpu)

    # ---- Backend: reading -----------------------------------------------------

    def device_count(self) -> int:
        return len(self._gpus)

    def driver_version(self) -> str | None:
        return self._driver

    def library_version(self) -> NamedVersion | None:
        return None if self._nvml_version is None else NamedVersion("NVML", self._nvml_version)

    def compute_runtime_version(self) -> NamedVersion | None:
        return None if self._cuda is None else NamedVersion("CUDA", self._cuda)

    def read_gpus(self, indices: Sequence[int], slow: bool) -> list[GpuSample]:
        """Read the fast fields of each GPU; the slow ones too when ``slow``."""
        with self._lock:
            gpus = [self.gpu(i) for i in indices]
            live = [g for g in gpus if self.available(g)]
            if self.read_gpm:
                for gpu in live:
                    try:
                        self._gpm.begin([gpu])  # a first sample, before the other reads
                    except GpuLost as err:
                        self.mark_lost(gpu, str(err))
                live = [g for g in live if not g.lost]
            else:
                self._gpm.forget()
            slow_pass = self._start_slow(live) if slow else None
            samples: dict[int, GpuSample] = {}
            for gpu in live:
                try:
                    samples[gpu.index] = self._read_fast(gpu, slow)
                except GpuLost as err:
                    self.mark_lost(gpu, str(err))
            if slow_pass is not None:
                self._finish_slow(*slow_pass)
            result = []
            for gpu in gpus:
                sample = samples.get(gpu.index)
                if sample is None or gpu.lost:
                    # Its identity and nothing else: no stale numbers.
                    sample = GpuSample(
                        index=gpu.index,
                        uuid=gpu.uuid,
                        name=gpu.name,
                        pci_bus_id=gpu.pci_bus_id,
                        lost=True,
                    )
                else:
                    for key, value in gpu.slow.items():
                        _put_key(sample, key, value)
                    self._read_gpm(gpu, sample)
                result.append(sample)
            return result

    def _read_fast(self, gpu: Gpu, slow: bool = True) -> GpuSample:
        sample = GpuSample(index=gpu.index, uuid=gpu.uuid, name=gpu.name, pci_bus_id=gpu.pci_bus_id)
        for key, value in gpu.static.items():
            _put(sample, _BY_KEY[key], value)
        memo: dict[tuple[Any, ...], Any] = {}
        for f in BY_COST[FAST]:
            if f.key == "ecc_uncorrected" and not self.read_ecc:
                continue
            _put(sample, f, self._read(gpu, f, memo))
        sample.processes = self._processes(gpu)
        self._put_process_sm(gpu, sample.processes, slow)
        if self._xid is not None:
            sample.xid_events = self._xid.events(gpu.index)
        return sample

    def _put_process_sm(self, gpu: Gpu, processes: list[ProcessInfo], slow: bool) -> None:
        """Each process's SM share, read on slow passes: the driver walks its
        sample buffer for it, the dearest of the per-pass reads."""
        if slow:
            sm = self._process_util.read(gpu) if processes else {}
            self._process_sm[gpu.index] = (
                None if sm is None else (sm, frozenset(p.pid for p in processes))
            )
        last = self._process_sm.get(gpu.index)
        if last is None:
            return
        sm, listed = last
        for proc in processes:
            if proc.pid in listed:
                # No sample since the last read: the process did not run.
                proc.sm_pct = sm.get(proc.pid, 0.0)

    def _read_gpm(self, gpu: Gpu, sample: GpuSample) -> None:
        if not self.read_gpm:
            return
        try:
            values = self._gpm.read(gpu)
        except GpuLost as err:
            self.mark_lost(gpu, str(err))
            return
        for key, value in (values or {}).items():
            setattr(sample, key, value)

    def _processes(self, gpu: Device) -> list[ProcessInfo]:
        by_pid: dict[int, ProcessInfo] = {}
        for kind in ("compute", "graphics"):
            name = f"nvmlDeviceGet{kind.capitalize()}RunningProcesses"
            for proc in self.q(gpu, "processes", name) or ():
                pid = int(proc.pid)
                raw = getattr(proc, "usedGpuMemory", None)
                mib = None if raw is None or raw >= _NOT_AVAILABLE_ULL else raw / _MIB
                seen = by_pid.get(pid)
                if seen is None:
                    by_pid[pid] = ProcessInfo(pid=pid, gpu_memory_mib=mib, kind=kind)
                elif mib is not None:
                    # A process that is both compute and graphics: NVML reports
                    # the same allocation twice, so keep the larger, not the sum.
                    seen.gpu_memory_mib = max(seen.gpu_memory_mib or 0.0, mib)
        return list(by_pid.values())

    # ---- slow fields: each call on a thread of its own ------------------------

    def _slow_jobs(self, gpu: Gpu) -> list[tuple[tuple[str, ...], Callable[[], list[Any]]]]:
        """The slow reads of a GPU: one job per driver call (fields that share a
        call share its answer), and each deep reading."""
        groups: dict[tuple[Any, ...], list[Field]] = {}
        for f in BY_COST[SLOW]:
            if f.key == "energy_j" and not self.read_energy:
                continue
            groups.setdefault((f.read.function, *f.read.args), []).append(f)
        jobs: list[tuple[tuple[str, ...], Callable[[], list[Any]]]] = []
        for group in groups.values():

            def call(group: list[Field] = group) -> list[Any]:
                memo: dict[tuple[Any, ...], Any] = {}
                return [self._read(gpu, f, memo) for f in group]

            jobs.append((tuple(f.key for f in group), call))
        jobs.append((("nvlink",), lambda: [self._nvlink.read(gpu)]))
        jobs.append((("mig",), lambda: [read_mig(self.q, gpu, self._processes)]))
        return jobs

    def _start_slow(
        self, gpus: list[Gpu]
    ) -> tuple[list[tuple[Gpu, tuple[str, ...]]], list[Any], list[threading.Thread]]:
        jobs = [(gpu, keys, call) for gpu in gpus for keys, call in self._slow_jobs(gpu)]
        results: list[Any] = [None] * len(jobs)

        def run(i: int, call: Callable[[], list[Any]]) -> None:
            try:
                results[i] = call()
            except GpuLost as err:
                results[i] = err

        threads = [
            threading.Thread(target=run, args=(i, call), name="gpustation-nvml", daemon=True)
            for i, (_, _, call) in enumerate(jobs)
        ]
        for thread in threads:
            thread.start()
        return [(gpu, keys) for gpu, keys, _ in jobs], results, threads

    def _finish_slow(
        self,
        calls: list[tuple[Gpu, tuple[str, ...]]],
        results: list[Any],
        threads: list[threading.Thread],
    ) -> None:
        for thread in threads:
            thread.join()
        for (gpu, keys), values in zip(calls, results, strict=True):
            if isinstance(values, GpuLost):
                self.mark_lost(gpu, str(values))
            elif values is not None:
                gpu.slow.update(zip(keys, values, strict=True))
        if not self.read_energy:
            for gpu, _ in calls:
                gpu.slow.pop("energy_j", None)

    # ---- topology ----------------------------------------------------------------

    def topology(self, indices: Sequence[int]) -> Topology:
        """Links between each pair of GPUs and where each GPU sits (NUMA, CPUs)."""
        with self._lock:
            gpus = [self.gpu(i) for i in indices]
            return self._topology.read(gpus, [g for g in gpus if self.available(g)])

    # ---- closing --------------------------------------------------------------------

    def _shutdown(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # shutting down a half-broken library must not raise
            pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._cache is not None:
            self._cache.save()
        gpm = getattr(self, "_gpm", None)
        if gpm is not None:
            try:
                gpm.close()
            except Exception:  # closing must not raise
                pass
        xid = getattr(self, "_xid", None)
        if xid is None:
            self._shutdown()
            return
        # NVML is shut down once no XID wait uses it (by the watcher when one does)
        xid.close(then=self._shutdown)


#: more fans than any card has: a count above it is a damaged cache or driver answer
MAX_FANS = 32


def _fan_count(value: Any) -> int | None:
    """A fan count as a card can have one (0 to MAX_FANS), else None."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_FANS:
        return None
    return value


def open_request(request: OpenRequest) -> Backend:
    """The registry's way in (``telemetry/registry.py``)."""
    return NvmlBackend(one_shot=request.one_shot)
