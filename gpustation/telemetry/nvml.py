"""The NVML backend: real NVIDIA GPUs read through ``pynvml`` (nvidia-ml-py).

How it stays robust and cheap:

* Handles and static values (name, UUID, bus id, limits, max clocks, fan
  count...) are read once, when the backend opens.
* Every field is read on its own through :meth:`NvmlBackend._call`: a field
  the card does not support becomes ``None`` and is not asked for again; a
  function the library or driver lacks is remembered in
  ``missing_functions`` and never called again; any other error becomes
  ``None`` and is kept in ``errors`` for a debug view. One failing field never
  hides the others.
* Versioned functions are probed newest first (running processes v3 -> v2 ->
  v1, memory info v2 -> v1, clocks-event reasons -> throttle reasons).
* A GPU that falls off the bus (``GPU_IS_LOST``) is reported with
  ``lost=True`` and retried at most every ``LOST_RETRY_S`` seconds; the other
  GPUs keep reporting.
* Slow getters (PCIe throughput ~21 ms a call, energy ~4 ms on an H200) are
  read only when ``slow=True``, in worker threads while the fast fields are
  read, so a one-shot snapshot pays for about one slow call.

NVML is read and written through nvidia-ml-py (``pynvml``) alone.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time

from gpustation.errors import (
    GpustationError,
    NeedsRootError,
    NoDriverError,
    NotSupportedError,
    UsageError,
)
from gpustation.telemetry.backend import Backend
from gpustation.telemetry.model import (
    GpuLink,
    GpuPlacement,
    GpuSample,
    PcieInfo,
    ProcessInfo,
    Topology,
    decode_throttle,
)

# typing and concurrent.futures are not imported at run time: with what they
# pull in, they cost a one-shot snapshot ~10 ms on an H200 machine.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

#: A lost GPU's handle is tried again at most this often.
LOST_RETRY_S = 10.0
#: Slow values read when a GPU was opened serve the first slow read this long.
PREFETCH_FRESH_S = 2.0

_MIB = 1024.0 * 1024.0
# NVML's "value not available" for unsigned long long fields (usedGpuMemory).
_NOT_AVAILABLE_ULL = (1 << 64) - 1

# NVML error codes, as in nvml.h (the values never change between versions).
_ERR_INVALID_ARGUMENT = 2
_ERR_NOT_SUPPORTED = 3
_ERR_NO_PERMISSION = 4
_ERR_FUNCTION_NOT_FOUND = 13
_ERR_GPU_IS_LOST = 15
_ERR_ARGUMENT_VERSION_MISMATCH = 25

# NVML topology levels -> the names ``nvidia-smi topo -m`` prints.
_TOPOLOGY_LEVELS = {
    0: "PIX",  # INTERNAL: two GPUs on one board
    10: "PIX",  # SINGLE: one PCIe switch
    20: "PXB",  # MULTIPLE: several PCIe switches
    30: "PHB",  # HOSTBRIDGE
    40: "NODE",  # NODE (CPU): same NUMA node, across host bridges
    50: "SYS",  # SYSTEM: across the SMP interconnect
}

_MISSING: Any = object()

_COMPUTE_PROCS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
_GRAPHICS_PROCS = (
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses",
)
_THROTTLE = (
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
)
_POWER_LIMIT = ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit")
_PCI_INFO = ("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo")
_REMOTE_PCI = ("nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetNvLinkRemotePciInfo")
_CUDA_VERSION = ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion")


class _GpuLost(Exception):
    """Raised inside a read when NVML says the GPU has fallen off the bus."""


def _text(value: Any) -> str | None:
    """NVML strings arrive as str or, from older pynvml, as bytes."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def normalize_bus_id(bus_id: str | None) -> str | None:
    """``00000000:01:00.0`` -> ``0000:01:00.0`` (lower case, 4-digit domain).

    NVML prints an 8-digit domain; sysfs and ``lspci`` use 4 digits.
    """
    if not bus_id:
        return None
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep or not rest:
        return text
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


def cpu_mask_to_ranges(words: Sequence[int]) -> str | None:
    """NVML CPU-affinity words (64 CPUs each, word 0 first) -> ``"0-15,32-47"``."""
    return cpus_to_ranges(_mask_cpus(words))


def _mask_cpus(words: Sequence[int]) -> set[int]:
    return {
        w * 64 + bit for w, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1
    }


def cpus_to_ranges(cpu_set: set[int]) -> str | None:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"``."""
    cpus = sorted(cpu_set)
    if not cpus:
        return None
    parts: list[str] = []
    start = prev = cpus[0]
    for cpu in cpus[1:]:
        if cpu == prev + 1:
            prev = cpu
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = cpu
    parts.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(parts)


def parse_cpu_list(text: str) -> set[int]:
    """``0-3,8,10-11`` (the kernel's cpulist format) as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as err:
        raise NoDriverError(
            f"NVML could not start: the pynvml module is missing ({err}). "
            "Install nvidia-ml-py. To try gpustation without a GPU, use --simulate."
        ) from None
    return pynvml


def _start_nvml(nvml: Any) -> None:
    """``nvmlInit()``; a library or driver that cannot start is a :class:`NoDriverError`."""
    try:
        nvml.nvmlInit()
    except getattr(nvml, "NVMLError", Exception) as err:
        raise NoDriverError(NvmlBackend._no_driver_message(err)) from None
    except (OSError, AttributeError) as err:
        raise NoDriverError(
            f"NVML could not start: {err} ({type(err).__name__}). Is the NVIDIA driver "
            "installed and loaded? To try gpustation without a GPU, use --simulate."
        ) from None


def _sudo_hint() -> str:
    """The command line to run again as root, when we can tell what it was."""
    argv0 = os.path.basename(sys.argv[0]) if sys.argv else ""
    if argv0 in ("gpustation", "__main__.py") and len(sys.argv) > 1:
        import shlex

        return "sudo gpustation " + shlex.join(sys.argv[1:])
    return "sudo gpustation ..."


#: The file, in the state directory, that keeps static values between one-shot runs.
STATIC_CACHE_FILE = "nvml-static.marshal"
# The _Gpu attributes kept there: values fixed while the machine is up.
_STATIC_ATTRS = (
    "temp_slowdown",
    "temp_shutdown",
    "power_default_w",
    "power_min_w",
    "power_max_w",
    "clock_sm_max",
    "clock_mem_max",
    "memory_total_mib",
    "num_fans",
    "fan_min",
    "fan_max",
    "pcie_max_gen",
    "pcie_max_width",
)


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


class StaticCache:
    """Static values of each GPU, kept between one-shot runs.

    Temperature thresholds, power limits' range, maximum clocks and the like
    cost the driver 1-4 ms a call the first time a process asks (about 12 ms
    per GPU on an H200 machine), and they cannot change while the machine is
    up with the same driver. The file is keyed by the boot and the driver
    version, each entry by the GPU's UUID and bus id; anything that does not
    match, or does not look right, is read from the driver instead. Only
    display paths use it: control always asks the driver. It is written with
    :mod:`marshal`, which is built in: importing :mod:`json` would cost the
    table more than reading the file does.
    """

    def __init__(self, path: str, driver: str | None, boot_id: str | None = None) -> None:
        self.path = path
        boot = boot_id if boot_id is not None else _boot_id()
        self.key = f"{boot}/{driver}" if boot and driver else None
        self._entries: dict[str, Any] = {}
        self._changed = False
        if self.key is None:
            return
        import marshal

        try:
            with open(path, "rb") as f:
                doc = marshal.load(f)
        except (OSError, ValueError, EOFError, TypeError):  # missing, damaged, other Python
            return
        if isinstance(doc, dict) and doc.get("key") == self.key:
            gpus = doc.get("gpus")
            if isinstance(gpus, dict):
                self._entries = gpus

    def fill(self, gpu: _Gpu) -> bool:
        """Set the GPU's static values from the file; False when it has none for it."""
        entry = self._entries.get(gpu.uuid or "")
        if not isinstance(entry, dict) or entry.get("pci_bus_id") != gpu.pci_bus_id:
            return False
        values = [entry.get(attr, _MISSING) for attr in _STATIC_ATTRS]
        for value in values:
            if value is None:
                continue
            if value is _MISSING or isinstance(value, bool) or not isinstance(value, (int, float)):
                return False
        for attr, value in zip(_STATIC_ATTRS, values, strict=True):
            setattr(gpu, attr, value)
        gpu.num_fans = int(gpu.num_fans or 0)
        return True

    def remember(self, gpu: _Gpu) -> None:
        if self.key is None or not gpu.uuid:
            return
        entry = {attr: getattr(gpu, attr) for attr in _STATIC_ATTRS}
        entry["pci_bus_id"] = gpu.pci_bus_id
        self._entries[gpu.uuid] = entry
        self._changed = True

    def save(self) -> None:
        """Write the file if something new was learnt (atomically; errors ignored)."""
        if not self._changed or self.key is None:
            return
        import marshal

        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(tmp, "wb") as f:
                marshal.dump({"key": self.key, "gpus": self._entries}, f)
            os.replace(tmp, self.path)
            self._changed = False
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass


class _Job:
    """One call on a thread of its own; :meth:`result` waits for its answer.

    NVML calls drop the GIL, so slow getters run side by side this way. A
    thread per call (a few per GPU every few seconds) costs less than
    importing a thread pool does.
    """

    __slots__ = ("_error", "_thread", "_value")

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(fn, args), name="gpustation-nvml", daemon=True
        )
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            self._value = fn(*args)
        except BaseException as err:  # handed to whoever waits in result()
            self._error = err

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


class _Gpu:
    """What the backend keeps per GPU between reads."""

    __slots__ = (
        "clock_mem_max",
        "clock_sm_max",
        "energy_j",
        "fan_max",
        "fan_min",
        "handle",
        "index",
        "lost",
        "lost_at",
        "memory_total_mib",
        "memory_v2",
        "name",
        "num_fans",
        "pci_bus_id",
        "pcie_max_gen",
        "pcie_max_width",
        "power_default_w",
        "power_max_w",
        "power_min_w",
        "prefetch",
        "prefetch_at",
        "replay",
        "rx",
        "static_read",
        "temp_shutdown",
        "temp_slowdown",
        "tx",
        "unsupported",
        "uuid",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: Any = None
        self.lost = False
        self.lost_at = 0.0
        self.static_read = False
        # Functions this card answered NotSupported: not asked again.
        self.unsupported: set[str] = set()
        self.uuid: str | None = None
        self.name: str | None = None
        self.pci_bus_id: str | None = None
        self.temp_slowdown: float | None = None
        self.temp_shutdown: float | None = None
        self.power_default_w: float | None = None
        self.power_min_w: float | None = None
        self.power_max_w: float | None = None
        self.clock_sm_max: float | None = None
        self.clock_mem_max: float | None = None
        self.memory_total_mib: float | None = None
        self.memory_v2: bool | None = None  # None: not tried yet
        self.num_fans = 0
        self.fan_min: int | None = None
        self.fan_max: int | None = None
        self.pcie_max_gen: int | None = None
        self.pcie_max_width: int | None = None
        # Slow getters started when the GPU was opened, so that the first slow
        # read (a one-shot snapshot's) overlaps them with the static reads.
        self.prefetch: list[tuple[_Gpu, str, _Job]] = []
        self.prefetch_at = 0.0
        # Slow fields: the last values read, reused between slow reads.
        self.tx: float | None = None
        self.rx: float | None = None
        self.energy_j: float | None = None
        self.replay: int | None = None


class NvmlBackend(Backend):
    """Reads real GPUs through NVML.

    ``nvml`` is a module with pynvml's functions (pynvml or a
    fake); when it is not given, the environment picks one (see
    :func:`_start_default_nvml`).
    """

    simulated = False

    def __init__(
        self,
        nvml: Any = None,
        sysfs_pci_root: str = "/sys/bus/pci/devices",
        prefetch_slow: bool = False,
        sysfs_node_root: str = "/sys/devices/system/node",
        one_shot: bool = False,
        static_cache: str | None = None,
    ) -> None:
        """``prefetch_slow`` starts the slow getters as each GPU is opened, for a
        one-shot read: they then run beside the static reads instead of after.

        ``one_shot`` says the process reads once and exits (``gpustation
        snapshot``): static values come from the :class:`StaticCache` in the
        state directory when it has them, and :meth:`close` leaves NVML's
        teardown to the process exit. ``static_cache`` names another file for
        that cache.
        """
        self._prefetch_slow = prefetch_slow
        self._one_shot = one_shot
        self._static_cache: StaticCache | None = None
        if nvml is None:
            nvml = _import_pynvml()
        self.nvml = nvml
        self._error_type: type[BaseException] = getattr(nvml, "NVMLError", Exception)
        # nvidia-ml-py hands some getters a ctypes object shared between calls
        # (nvmlDeviceGetFanControlPolicy_v2): its GPUs are never read side by side.
        self._reads_in_parallel = getattr(nvml, "__name__", "") != "pynvml"
        self._sysfs_pci_root = sysfs_pci_root
        self._sysfs_node_root = sysfs_node_root
        #: pynvml functions that are absent or that the driver lacks; never called again.
        self.missing_functions: set[str] = set()
        #: (gpu index or -1 for system calls, field) -> last error text, for a debug view.
        self.errors: dict[tuple[int, str], str] = {}
        self._error_count = 0  # errors ever noted, repeats included
        self._fns: dict[str, Callable[..., Any] | None] = {}
        # Calls running on threads of their own; close() waits for them.
        self._jobs: list[_Job] = []
        self._jobs_lock = threading.Lock()
        self._topology_prefetch: tuple[tuple[int, ...], _Job] | None = None
        # One read at a time: some pynvml getters pass a shared default ctypes
        # object (e.g. nvmlDeviceGetFanControlPolicy_v2), so two threads reading
        # the fast fields at once could see each other's answers.
        self._lock = threading.RLock()
        self._closed = False

        _start_nvml(nvml)
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except self._error_type as err:
            self._shutdown()
            raise NoDriverError(self._no_driver_message(err)) from None

        c = self._const
        self._TEMP_GPU = c("NVML_TEMPERATURE_GPU", 0)
        self._THRESH_SLOWDOWN = c("NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1)
        self._THRESH_SHUTDOWN = c("NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", 0)
        self._CLOCK_SM = c("NVML_CLOCK_SM", 1)
        self._CLOCK_MEM = c("NVML_CLOCK_MEM", 2)
        self._MEMORY_V2 = c("nvmlMemory_v2", 0x02000028)
        self._FAN_MANUAL = c("NVML_FAN_POLICY_MANUAL", 1)
        self._ECC_UNCORRECTED = c("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        self._ECC_VOLATILE = c("NVML_VOLATILE_ECC", 0)
        self._PCIE_TX = c("NVML_PCIE_UTIL_TX_BYTES", 0)
        self._PCIE_RX = c("NVML_PCIE_UTIL_RX_BYTES", 1)
        self._P2P_READ = c("NVML_P2P_CAPS_INDEX_READ", 0)
        self._P2P_WRITE = c("NVML_P2P_CAPS_INDEX_WRITE", 1)
        self._P2P_OK = c("NVML_P2P_STATUS_OK", 0)
        self._NVLINK_MAX = c("NVML_NVLINK_MAX_LINKS", 18)
        self._NVLINK_SWITCH = c("NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
        self._PSTATE_UNKNOWN = c("NVML_PSTATE_UNKNOWN", 32)

        self._driver = _text(self._sys_call("driver_version", "nvmlSystemGetDriverVersion"))
        self._nvml_version = _text(self._sys_call("nvml_version", "nvmlSystemGetNVMLVersion"))
        cuda = None
        for name in _CUDA_VERSION:
            cuda = self._sys_call("cuda_driver_version", name)
            if cuda is not None:
                break
        self._cuda = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}" if cuda else None
        if one_shot or static_cache:
            if static_cache is None:
                from gpustation.paths import state_dir_name

                static_cache = os.path.join(state_dir_name(), STATIC_CACHE_FILE)
            self._static_cache = StaticCache(static_cache, self._driver)

        self._gpus = [_Gpu(i) for i in range(count)]
        # Static values cost up to a few ms per call on first use; read the
        # GPUs side by side so opening an 8-GPU node stays quick.
        try:
            if count > 1:
                for job in [self._job(self._open_gpu, gpu) for gpu in self._gpus]:
                    job.result()
            else:
                for gpu in self._gpus:
                    self._open_gpu(gpu)
        except BaseException:
            self.close()  # leave no worker threads or NVML session behind
            raise

    # ---- plumbing -----------------------------------------------------------

    def _const(self, name: str, default: int) -> int:
        value = getattr(self.nvml, name, default)
        # Some pynvml releases define a constant as a 1-tuple (a stray comma).
        if isinstance(value, tuple):
            value = value[0] if value else default
        try:
            return int(value)
        except (TypeError, ValueError):
            return default

    @staticmethod
    def _no_driver_message(err: BaseException) -> str:
        code = getattr(err, "value", None)
        kind = type(err).__name__ + (f", code {code}" if code is not None else "")
        return (
            f"NVML could not start: {err} ({kind}). Is the NVIDIA driver installed and "
            "loaded? To try gpustation without a GPU, use --simulate."
        )

    def _resolve(self, name: str) -> Callable[..., Any] | None:
        fn = self._fns.get(name, _MISSING)
        if fn is _MISSING:
            fn = getattr(self.nvml, name, None)
            if fn is None:
                self.missing_functions.add(name)
            self._fns[name] = fn
        return fn  # type: ignore[no-any-return]

    def _forget(self, name: str) -> None:
        self._fns[name] = None
        self.missing_functions.add(name)

    def _job(self, fn: Callable[..., Any], *args: Any) -> _Job:
        """Start ``fn(*args)`` on a thread of its own."""
        job = _Job(fn, *args)
        with self._jobs_lock:
            self._jobs = [j for j in self._jobs if not j.done()]
            self._jobs.append(job)
        return job

    def _call(self, gpu: _Gpu, field: str, name: str, *args: Any) -> Any:
        """Call ``name(handle, *args)`` for one field; ``None`` when it cannot be read.

        Raises :class:`_GpuLost` when NVML says the GPU has fallen off the bus.
        """
        fn = self._fns.get(name, _MISSING)
        if fn is _MISSING:
            fn = self._resolve(name)
        if fn is None or name in gpu.unsupported:
            return None
        try:
            return fn(gpu.handle, *args)
        except self._error_type as err:
            self._failed(gpu, field, name, err)
        except Exception as err:  # a broken binding must not hide the other fields
            self._error(gpu.index, field, f"{name}: {type(err).__name__}: {err}")
        return None

    def _call_first(self, gpu: _Gpu, field: str, names: Sequence[str], *args: Any) -> Any:
        """Try versioned functions newest first; the first that answers wins.

        A version the driver refuses (missing, NotSupported, version mismatch)
        is skipped from then on, so the fallback costs nothing after the first read.
        """
        for name in names:
            fn = self._fns.get(name, _MISSING)
            if fn is _MISSING:
                fn = self._resolve(name)
            if fn is None or name in gpu.unsupported:
                continue
            try:
                return fn(gpu.handle, *args)
            except self._error_type as err:
                self._failed(gpu, field, name, err)
            except Exception as err:
                self._error(gpu.index, field, f"{name}: {type(err).__name__}: {err}")
        return None

    def _failed(self, gpu: _Gpu, field: str, name: str, err: BaseException) -> None:
        code = getattr(err, "value", None)
        if code == _ERR_GPU_IS_LOST:
            raise _GpuLost(str(err))
        if code == _ERR_FUNCTION_NOT_FOUND:
            self._forget(name)
        elif code in (_ERR_NOT_SUPPORTED, _ERR_ARGUMENT_VERSION_MISMATCH):
            gpu.unsupported.add(name)
        else:
            self._error(gpu.index, field, f"{name}: {err}")

    def _error(self, index: int, field: str, text: str) -> None:
        self.errors[(index, field)] = text
        self._error_count += 1

    def _sys_call(self, field: str, name: str, *args: Any) -> Any:
        """Like :meth:`_call` for functions that take no device handle."""
        fn = self._resolve(name)
        if fn is None:
            return None
        try:
            return fn(*args)
        except self._error_type as err:
            if getattr(err, "value", None) == _ERR_FUNCTION_NOT_FOUND:
                self._forget(name)
            elif getattr(err, "value", None) != _ERR_NOT_SUPPORTED:
                self.errors[(-1, field)] = f"{name}: {err}"
        except Exception as err:
            self.errors[(-1, field)] = f"{name}: {type(err).__name__}: {err}"
        return None

    # ---- opening a GPU: handle and static values ----------------------------

    def _open_gpu(self, gpu: _Gpu) -> bool:
        """Get the handle and read the static values; False if the GPU is lost."""
        try:
            gpu.handle = self.nvml.nvmlDeviceGetHandleByIndex(gpu.index)
        except self._error_type as err:
            self._mark_lost(gpu, f"nvmlDeviceGetHandleByIndex: {err}")
            return False
        if self._prefetch_slow and not gpu.static_read and not gpu.prefetch:
            # PCIe throughput takes ~21 ms a call: start it now, beside the static reads.
            gpu.prefetch = self._start_slow([gpu])
            gpu.prefetch_at = time.monotonic()
        try:
            self._read_static(gpu)
        except _GpuLost as err:
            self._mark_lost(gpu, str(err))
            return False
        gpu.lost = False
        return True

    def _mark_lost(self, gpu: _Gpu, why: str) -> None:
        gpu.lost = True
        gpu.lost_at = time.monotonic()
        self.errors[(gpu.index, "lost")] = why

    def _read_static(self, gpu: _Gpu) -> None:
        call = self._call
        gpu.uuid = _text(call(gpu, "uuid", "nvmlDeviceGetUUID")) or gpu.uuid
        gpu.name = _text(call(gpu, "name", "nvmlDeviceGetName")) or gpu.name
        pci = self._call_first(gpu, "pci_bus_id", _PCI_INFO)
        if pci is not None:
            gpu.pci_bus_id = _text(getattr(pci, "busId", None)) or gpu.pci_bus_id
        cache = self._static_cache
        if cache is not None and cache.fill(gpu):
            gpu.static_read = True
            return
        errors_before = self._error_count
        gpu.temp_slowdown = _float(
            call(
                gpu,
                "temperature_slowdown_c",
                "nvmlDeviceGetTemperatureThreshold",
                self._THRESH_SLOWDOWN,
            )
        )
        gpu.temp_shutdown = _float(
            call(
                gpu,
                "temperature_shutdown_c",
                "nvmlDeviceGetTemperatureThreshold",
                self._THRESH_SHUTDOWN,
            )
        )
        gpu.power_default_w = _milli(
            call(gpu, "power_default_w", "nvmlDeviceGetPowerManagementDefaultLimit")
        )
        limits = call(gpu, "power_min_max_w", "nvmlDeviceGetPowerManagementLimitConstraints")
        if limits is not None:
            gpu.power_min_w, gpu.power_max_w = _milli(limits[0]), _milli(limits[1])
        gpu.clock_sm_max = _float(
            call(gpu, "clock_sm_max_mhz", "nvmlDeviceGetMaxClockInfo", self._CLOCK_SM)
        )
        gpu.clock_mem_max = _float(
            call(gpu, "clock_mem_max_mhz", "nvmlDeviceGetMaxClockInfo", self._CLOCK_MEM)
        )
        mem = call(gpu, "memory_total_mib", "nvmlDeviceGetMemoryInfo")
        if mem is not None:
            gpu.memory_total_mib = mem.total / _MIB
        gpu.num_fans = int(call(gpu, "fan_count", "nvmlDeviceGetNumFans") or 0)
        if gpu.num_fans:
            # pynvml fills a shared default ctypes object here, and GPUs are
            # opened side by side: one at a time for this call.
            with self._lock:
                fan_range = call(gpu, "fan_range", "nvmlDeviceGetMinMaxFanSpeed")
            if fan_range is not None:
                gpu.fan_min, gpu.fan_max = int(fan_range[0]), int(fan_range[1])
        gpu.pcie_max_gen = _int_or_none(
            call(gpu, "pcie_max_gen", "nvmlDeviceGetMaxPcieLinkGeneration")
        )
        gpu.pcie_max_width = _int_or_none(
            call(gpu, "pcie_max_width", "nvmlDeviceGetMaxPcieLinkWidth")
        )
        gpu.static_read = True
        if cache is not None and self._error_count == errors_before:
            # Kept only when every value was answered cleanly (an error on
            # another GPU opened beside this one also holds it back).
            cache.remember(gpu)

    # ---- Backend: reading ---------------------------------------------------

    def device_count(self) -> int:
        return len(self._gpus)

    def driver_version(self) -> str | None:
        return self._driver

    def nvml_version(self) -> str | None:
        return self._nvml_version

    def cuda_driver_version(self) -> str | None:
        return self._cuda

    def _gpu(self, index: int) -> _Gpu:
        if not 0 <= index < len(self._gpus):
            raise UsageError(f"no GPU {index} on this machine ({len(self._gpus)} GPUs)")
        return self._gpus[index]

    def _available(self, gpu: _Gpu) -> bool:
        """True unless the GPU is lost; a lost GPU is retried now and then."""
        if not gpu.lost:
            return True
        now = time.monotonic()
        if now - gpu.lost_at < LOST_RETRY_S:
            return False
        gpu.lost_at = now
        return self._open_gpu(gpu)

    def read_gpus(self, indices: Sequence[int], slow: bool) -> list[GpuSample]:
        """Read the fast fields of each GPU; the slow ones too when ``slow``."""
        with self._lock:
            return self._read_gpus(indices, slow)

    def _read_gpus(self, indices: Sequence[int], slow: bool) -> list[GpuSample]:
        gpus = [self._gpu(i) for i in indices]
        live = [g for g in gpus if self._available(g)]
        pending: list[tuple[_Gpu, str, _Job]] = []
        if slow and live:
            fresh = time.monotonic() - PREFETCH_FRESH_S
            cold = [g for g in live if not (g.prefetch and g.prefetch_at >= fresh)]
            for g in live:
                if g.prefetch and g.prefetch_at >= fresh:
                    pending += g.prefetch
            pending += self._start_slow(cold) if cold else []
        for g in live:
            g.prefetch = []
        samples: dict[int, GpuSample] = {}
        if self._one_shot and len(live) > 1 and self._reads_in_parallel:
            # The driver's first answer to each getter costs 0.3-2 ms per GPU
            # (8 ms a GPU on an H200 machine); a one-shot read pays it once,
            # so the GPUs are read side by side.
            jobs = [(gpu, self._job(self._read_fast, gpu)) for gpu in live]
        else:
            jobs = [(gpu, None) for gpu in live]
        for gpu, job in jobs:
            try:
                samples[gpu.index] = self._read_fast(gpu) if job is None else job.result()
            except _GpuLost as err:
                self._mark_lost(gpu, str(err))
        if pending:
            self._finish_slow(pending)
        result: list[GpuSample] = []
        for gpu in gpus:
            sample = samples.get(gpu.index)
            if sample is None or gpu.lost:
                result.append(
                    GpuSample(
                        index=gpu.index,
                        uuid=gpu.uuid,
                        name=gpu.name,
                        pci_bus_id=gpu.pci_bus_id,
                        lost=True,
                    )
                )
                continue
            sample.energy_j = gpu.energy_j
            pcie = sample.pcie
            pcie.tx_kib_s = gpu.tx
            pcie.rx_kib_s = gpu.rx
            pcie.replay_errors = gpu.replay
            result.append(sample)
        return result

    def _read_fast(self, gpu: _Gpu) -> GpuSample:
        call = self._call
        first = self._call_first
        temp = call(gpu, "temperature_c", "nvmlDeviceGetTemperature", self._TEMP_GPU)
        power = call(gpu, "power_w", "nvmlDeviceGetPowerUsage")
        limit = first(gpu, "power_limit_w", _POWER_LIMIT)
        sm = call(gpu, "clock_sm_mhz", "nvmlDeviceGetClockInfo", self._CLOCK_SM)
        mem_clock = call(gpu, "clock_mem_mhz", "nvmlDeviceGetClockInfo", self._CLOCK_MEM)

        used = None
        total = gpu.memory_total_mib
        mem = self._memory(gpu)
        if mem is not None:
            used = mem.used / _MIB
            total = mem.total / _MIB

        util = call(gpu, "utilization", "nvmlDeviceGetUtilizationRates")
        fans: list[float] = []
        control: list[str] = []
        for fan in range(gpu.num_fans):
            speed = call(gpu, "fans_pct", "nvmlDeviceGetFanSpeed_v2", fan)
            if speed is not None:
                fans.append(float(speed))
            policy = call(gpu, "fan_control", "nvmlDeviceGetFanControlPolicy_v2", fan)
            if policy is not None:
                control.append("manual" if policy == self._FAN_MANUAL else "auto")
        pstate = call(gpu, "pstate", "nvmlDeviceGetPerformanceState")
        if pstate is not None and int(pstate) == self._PSTATE_UNKNOWN:
            pstate = None
        reasons = first(gpu, "throttle_reasons", _THROTTLE)
        gen = call(gpu, "pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration")
        width = call(gpu, "pcie_width", "nvmlDeviceGetCurrPcieLinkWidth")
        ecc = None
        if self.read_ecc:
            ecc = call(
                gpu,
                "ecc_uncorrected",
                "nvmlDeviceGetTotalEccErrors",
                self._ECC_UNCORRECTED,
                self._ECC_VOLATILE,
            )
        return GpuSample(
            index=gpu.index,
            uuid=gpu.uuid,
            name=gpu.name,
            pci_bus_id=gpu.pci_bus_id,
            temperature_c=_float(temp),
            temperature_slowdown_c=gpu.temp_slowdown,
            temperature_shutdown_c=gpu.temp_shutdown,
            power_w=_milli(power),
            power_limit_w=_milli(limit),
            power_default_w=gpu.power_default_w,
            power_min_w=gpu.power_min_w,
            power_max_w=gpu.power_max_w,
            clock_sm_mhz=_float(sm),
            clock_sm_max_mhz=gpu.clock_sm_max,
            clock_mem_mhz=_float(mem_clock),
            clock_mem_max_mhz=gpu.clock_mem_max,
            memory_used_mib=used,
            memory_total_mib=total,
            utilization_gpu_pct=None if util is None else float(util.gpu),
            utilization_memory_pct=None if util is None else float(util.memory),
            fans_pct=fans,
            fan_control=control,
            pstate=_int_or_none(pstate),
            throttle_reasons=None if reasons is None else decode_throttle(int(reasons)),
            pcie=PcieInfo(
                gen=_int_or_none(gen),
                width=_int_or_none(width),
                max_gen=gpu.pcie_max_gen,
                max_width=gpu.pcie_max_width,
            ),
            ecc_uncorrected=_int_or_none(ecc),
            processes=self._processes(gpu),
        )

    def _memory(self, gpu: _Gpu) -> Any:
        """Memory info v2 (``used`` without the driver's reservation), else v1.

        v2 and v1 share one Python name (``version=`` picks the C function), so
        this keeps its own note of whether v2 works instead of the shared sets.
        """
        if gpu.memory_v2 is not False:
            fn = self._resolve("nvmlDeviceGetMemoryInfo")
            if fn is None:
                return None
            try:
                mem = fn(gpu.handle, version=self._MEMORY_V2)
                gpu.memory_v2 = True
                return mem
            except self._error_type as err:
                code = getattr(err, "value", None)
                if code == _ERR_GPU_IS_LOST:
                    raise _GpuLost(str(err)) from None
                if code in (
                    _ERR_NOT_SUPPORTED,
                    _ERR_FUNCTION_NOT_FOUND,
                    _ERR_ARGUMENT_VERSION_MISMATCH,
                ):
                    gpu.memory_v2 = False
                else:
                    self.errors[(gpu.index, "memory_v2")] = f"nvmlDeviceGetMemoryInfo_v2: {err}"
            except TypeError:
                # An old pynvml whose nvmlDeviceGetMemoryInfo takes no version.
                gpu.memory_v2 = False
        return self._call(gpu, "memory_used_mib", "nvmlDeviceGetMemoryInfo")

    def _processes(self, gpu: _Gpu) -> list[ProcessInfo]:
        by_pid: dict[int, ProcessInfo] = {}
        for kind, names in (("compute", _COMPUTE_PROCS), ("graphics", _GRAPHICS_PROCS)):
            procs = self._call_first(gpu, "processes", names)
            for proc in procs or ():
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

    # ---- slow fields ----------------------------------------------------------

    def _start_slow(self, gpus: list[_Gpu]) -> list[tuple[_Gpu, str, _Job]]:
        """Start every slow getter of every GPU in parallel (ctypes drops the GIL)."""
        getters = (
            ("tx", "pcie_tx_kib_s", "nvmlDeviceGetPcieThroughput", (self._PCIE_TX,)),
            ("rx", "pcie_rx_kib_s", "nvmlDeviceGetPcieThroughput", (self._PCIE_RX,)),
            ("energy", "energy_j", "nvmlDeviceGetTotalEnergyConsumption", ()),
            ("replay", "pcie_replay_errors", "nvmlDeviceGetPcieReplayCounter", ()),
        )
        return [
            (gpu, what, self._job(self._call, gpu, field, name, *args))
            for gpu in gpus
            for what, field, name, args in getters
            if what != "energy" or self.read_energy
        ]

    def _finish_slow(self, jobs: list[tuple[_Gpu, str, _Job]]) -> None:
        for gpu, what, job in jobs:
            try:
                value = job.result()
            except _GpuLost as err:
                self._mark_lost(gpu, str(err))
                continue
            if what == "tx":
                gpu.tx = _float(value)
            elif what == "rx":
                gpu.rx = _float(value)
            elif what == "energy":
                gpu.energy_j = _milli(value)
            else:
                gpu.replay = _int_or_none(value)

    # ---- topology -------------------------------------------------------------

    def prefetch_topology(self, indices: Sequence[int]) -> None:
        # The driver takes ~20 ms for two H200s' topology (the common-ancestor
        # query alone 14 ms): asked beside the first read, that overlaps the
        # PCIe throughput's 20 ms sample. One GPU has no links; its placement
        # comes from sysfs. Not with nvidia-ml-py, whose reads must not overlap.
        if len(indices) > 1 and self._reads_in_parallel and not self._closed:
            key = tuple(indices)
            self._topology_prefetch = (key, self._job(self._topology, key))

    def topology(self, indices: Sequence[int]) -> Topology:
        """Links between each pair of GPUs and where each GPU sits (NUMA, CPUs)."""
        prefetched, self._topology_prefetch = self._topology_prefetch, None
        if prefetched is not None and prefetched[0] == tuple(indices):
            return prefetched[1].result()  # type: ignore[no-any-return]
        with self._lock:
            return self._topology(indices)

    def _topology(self, indices: Sequence[int]) -> Topology:
        gpus = [self._gpu(i) for i in indices]
        live = [g for g in gpus if self._available(g)]
        by_bus = {normalize_bus_id(g.pci_bus_id): g.index for g in self._gpus if g.pci_bus_id}
        nvlinks: dict[tuple[int, int], int] = {}
        switch_links: dict[int, int] = {}
        for gpu in live:
            try:
                peers, to_switches = self._nvlink_peers(gpu, by_bus)
            except _GpuLost as err:
                self._mark_lost(gpu, str(err))
                continue
            switch_links[gpu.index] = to_switches
            for remote, count in peers.items():
                key = (min(gpu.index, remote), max(gpu.index, remote))
                nvlinks[key] = max(nvlinks.get(key, 0), count)
        # On NVSwitch systems (HGX) every GPU's links go to the switches, and any
        # two GPUs talk over as many links as the lesser of them has, which is
        # what ``nvidia-smi topo -m`` prints as NV18 on an 8-GPU H100/H200 box.
        for i, a in enumerate(live):
            for b in live[i + 1 :]:
                via_switch = min(switch_links.get(a.index, 0), switch_links.get(b.index, 0))
                key = (min(a.index, b.index), max(a.index, b.index))
                if via_switch > nvlinks.get(key, 0):
                    nvlinks[key] = via_switch
        topo = Topology()
        for i, a in enumerate(gpus):
            for b in gpus[i + 1 :]:
                topo.links.append(self._link(a, b, nvlinks))
        for gpu in gpus:
            topo.gpus.append(self._placement(gpu))
        return topo

    def _nvlink_peers(self, gpu: _Gpu, by_bus: dict[str | None, int]) -> tuple[dict[int, int], int]:
        """Active NVLinks of one GPU: counted per peer GPU index, and to NVSwitches."""
        peers: dict[int, int] = {}
        to_switches = 0
        state_fn = self._resolve("nvmlDeviceGetNvLinkState")
        if state_fn is None or "nvmlDeviceGetNvLinkState" in gpu.unsupported:
            return peers, to_switches
        for link in range(self._NVLINK_MAX):
            try:
                active = state_fn(gpu.handle, link)
            except self._error_type as err:
                code = getattr(err, "value", None)
                if code == _ERR_GPU_IS_LOST:
                    raise _GpuLost(str(err)) from None
                if code == _ERR_FUNCTION_NOT_FOUND:
                    self._forget("nvmlDeviceGetNvLinkState")
                elif code == _ERR_NOT_SUPPORTED and link == 0:
                    gpu.unsupported.add("nvmlDeviceGetNvLinkState")
                # NotSupported or InvalidArgument past the last link: no more links.
                break
            except Exception:
                break
            if not active:
                continue
            kind = self._call(
                gpu, "nvlink_remote_type", "nvmlDeviceGetNvLinkRemoteDeviceType", link
            )
            if kind is not None and int(kind) == self._NVLINK_SWITCH:
                to_switches += 1
                continue
            info = self._call_first(gpu, "nvlink_remote", _REMOTE_PCI, link)
            remote = by_bus.get(normalize_bus_id(_text(getattr(info, "busId", None))))
            if remote is not None and remote != gpu.index:
                peers[remote] = peers.get(remote, 0) + 1
        return peers, to_switches

    def _link(self, a: _Gpu, b: _Gpu, nvlinks: dict[tuple[int, int], int]) -> GpuLink:
        link = GpuLink(gpu_a=a.index, gpu_b=b.index)
        if a.lost or b.lost:
            return link
        link.nvlink_count = nvlinks.get((min(a.index, b.index), max(a.index, b.index)), 0)
        try:
            level = self._call(a, "topology_level", "nvmlDeviceGetTopologyCommonAncestor", b.handle)
            read = self._call(a, "p2p_read", "nvmlDeviceGetP2PStatus", b.handle, self._P2P_READ)
            write = self._call(a, "p2p_write", "nvmlDeviceGetP2PStatus", b.handle, self._P2P_WRITE)
        except _GpuLost as err:
            # Either end may be the one that fell off; the next read will tell.
            self._mark_lost(a, str(err))
            return link
        if link.nvlink_count:
            link.level = f"NV{link.nvlink_count}"
        elif level is not None:
            link.level = _TOPOLOGY_LEVELS.get(int(level))
        link.p2p_read = None if read is None else int(read) == self._P2P_OK
        link.p2p_write = None if write is None else int(write) == self._P2P_OK
        return link

    def _placement(self, gpu: _Gpu) -> GpuPlacement:
        place = GpuPlacement(index=gpu.index)
        if gpu.lost:
            return place
        # The kernel's list of the CPUs near the device is what NVML reports
        # too, but nvmlDeviceGetCpuAffinity takes 12-15 ms on an H200 machine.
        cpus = self._sysfs_local_cpus(gpu.pci_bus_id)
        try:
            node = self._call(gpu, "numa_node", "nvmlDeviceGetNumaNodeId")
            if cpus is None:
                words = self._call(
                    gpu,
                    "cpu_affinity",
                    "nvmlDeviceGetCpuAffinity",
                    math.ceil((os.cpu_count() or 1) / 64),
                )
                cpus = None if words is None else _mask_cpus(list(words))
        except _GpuLost as err:
            self._mark_lost(gpu, str(err))
            return place
        if node is None:
            node = self._sysfs_numa_node(gpu.pci_bus_id)
        place.numa_node = None if node is None or int(node) < 0 else int(node)
        if cpus:
            place.cpu_affinity = cpus_to_ranges(cpus)
            if place.numa_node is None:
                # As nvidia-smi's "NUMA Affinity": the one node whose CPUs the GPU is close to.
                place.numa_node = self._node_of_cpus(cpus)
        return place

    def _sysfs_local_cpus(self, bus_id: str | None) -> set[int] | None:
        bus = normalize_bus_id(bus_id)
        if bus is None:
            return None
        try:
            with open(os.path.join(self._sysfs_pci_root, bus, "local_cpulist")) as f:
                return parse_cpu_list(f.read()) or None
        except (OSError, ValueError):
            return None

    def _node_of_cpus(self, cpus: set[int]) -> int | None:
        """The NUMA node holding every CPU of an affinity mask, if exactly one does."""
        if not cpus:
            return None
        nodes = []
        try:
            entries = os.listdir(self._sysfs_node_root)
        except OSError:
            return None
        for entry in entries:
            if not (entry.startswith("node") and entry[4:].isdigit()):
                continue
            try:
                with open(os.path.join(self._sysfs_node_root, entry, "cpulist")) as f:
                    node_cpus = parse_cpu_list(f.read())
            except (OSError, ValueError):
                continue
            if cpus & node_cpus:
                nodes.append(int(entry[4:]))
        return nodes[0] if len(nodes) == 1 else None

    def _sysfs_numa_node(self, bus_id: str | None) -> int | None:
        """Older drivers lack nvmlDeviceGetNumaNodeId; the kernel knows too."""
        bus = normalize_bus_id(bus_id)
        if bus is None:
            return None
        try:
            with open(os.path.join(self._sysfs_pci_root, bus, "numa_node")) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    # ---- control ----------------------------------------------------------------

    def _control_handle(self, index: int, what: str) -> _Gpu:
        gpu = self._gpu(index)
        if gpu.lost and not self._available(gpu):
            raise GpustationError(
                f"cannot {what}: GPU {index} has fallen off the bus (NVML: GPU is lost). "
                "Check `nvidia-smi` and the kernel log; a reboot may be needed."
            )
        return gpu

    def _set(self, gpu: _Gpu, name: str, what: str, value: str, *args: Any) -> None:
        """Call an NVML setter and turn its refusals into errors for the user."""
        fn = self._resolve(name)
        label = f"GPU {gpu.index}" + (f" ({gpu.name})" if gpu.name else "")
        if fn is None:
            raise NotSupportedError(
                f"cannot {what} on {label}: this NVML library has no {name}. "
                "Update the NVIDIA driver and nvidia-ml-py."
            )
        try:
            with self._lock:
                fn(gpu.handle, *args)
        except self._error_type as err:
            code = getattr(err, "value", None)
            if code == _ERR_NO_PERMISSION:
                raise NeedsRootError(
                    f"cannot {what} on {label}: the driver refused ({err}); this needs root: "
                    f"run it as {_sudo_hint()}"
                ) from None
            if code in (_ERR_NOT_SUPPORTED, _ERR_FUNCTION_NOT_FOUND):
                if code == _ERR_FUNCTION_NOT_FOUND:
                    self._forget(name)
                raise NotSupportedError(f"{label} cannot {what} (NVML: {err}).") from None
            if code == _ERR_INVALID_ARGUMENT:
                raise GpustationError(
                    f"{label} rejected {value} when asked to {what} (NVML: {err})."
                ) from None
            if code == _ERR_GPU_IS_LOST:
                self._mark_lost(gpu, f"{name}: {err}")
                raise GpustationError(
                    f"cannot {what}: {label} has fallen off the bus (NVML: {err})."
                ) from None
            raise GpustationError(f"cannot {what} on {label}: NVML said {err}.") from None

    def set_power_limit(self, index: int, watts: float) -> None:
        """Set the power limit (the driver takes milliwatts)."""
        gpu = self._control_handle(index, "set the power limit")
        accepted = ""
        if gpu.power_min_w is not None and gpu.power_max_w is not None:
            accepted = f" (it accepts {gpu.power_min_w:g}-{gpu.power_max_w:g} W)"
        self._set(
            gpu,
            "nvmlDeviceSetPowerManagementLimit",
            "set the power limit",
            f"a power limit of {watts:g} W{accepted}",
            round(watts * 1000),
        )

    def fan_count(self, index: int) -> int:
        return self._gpu(index).num_fans

    def _check_fan(self, gpu: _Gpu, fan: int, what: str) -> None:
        if gpu.num_fans == 0:
            raise NotSupportedError(
                f"GPU {gpu.index} ({gpu.name or 'unknown'}) has no fans NVML can {what}; "
                "datacenter cards are cooled by the chassis."
            )
        if not 0 <= fan < gpu.num_fans:
            raise UsageError(
                f"GPU {gpu.index} has fans 0-{gpu.num_fans - 1}; there is no fan {fan}"
            )

    def fan_speed_range(self, index: int) -> tuple[int, int]:
        gpu = self._gpu(index)
        self._check_fan(gpu, 0, "control")
        if gpu.fan_min is None and not gpu.lost:
            # Not read when the backend opened (a passing error): ask again.
            with self._lock:
                try:
                    fan_range = self._call(gpu, "fan_range", "nvmlDeviceGetMinMaxFanSpeed")
                except _GpuLost as err:
                    self._mark_lost(gpu, str(err))
                    fan_range = None
            if fan_range is not None:
                gpu.fan_min, gpu.fan_max = int(fan_range[0]), int(fan_range[1])
        if gpu.fan_min is None or gpu.fan_max is None:
            raise NotSupportedError(
                f"GPU {index} does not report the fan speeds it accepts "
                "(nvmlDeviceGetMinMaxFanSpeed); manual fan control is not available."
            )
        return gpu.fan_min, gpu.fan_max

    def set_fan_speed(self, index: int, fan: int, pct: int) -> None:
        gpu = self._control_handle(index, "set a fan speed")
        self._check_fan(gpu, fan, "control")
        accepted = ""
        if gpu.fan_min is not None and gpu.fan_max is not None:
            accepted = f" (it accepts {gpu.fan_min}-{gpu.fan_max}%)"
        self._set(
            gpu,
            "nvmlDeviceSetFanSpeed_v2",
            f"set fan {fan} speed",
            f"a fan speed of {pct}%{accepted}",
            fan,
            int(pct),
        )

    def set_fan_auto(self, index: int, fan: int) -> None:
        gpu = self._control_handle(index, "return a fan to automatic control")
        self._check_fan(gpu, fan, "control")
        self._set(
            gpu,
            "nvmlDeviceSetDefaultFanSpeed_v2",
            f"return fan {fan} to automatic control",
            f"fan {fan}",
            fan,
        )

    # ---- closing ----------------------------------------------------------------

    def _shutdown(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # shutting down a half-broken library must not raise
            pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._static_cache is not None:
            self._static_cache.save()
        with self._jobs_lock:
            jobs, self._jobs = self._jobs, []
        for job in jobs:  # no nvmlShutdown under a call in flight
            job.wait()
        if not self._one_shot:
            # A one-shot process exits next, and the exit releases what
            # nvmlShutdown would (~4 ms on an H200 machine).
            self._shutdown()


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _milli(value: Any) -> float | None:
    """mW -> W, mJ -> J."""
    return None if value is None else value / 1000.0
