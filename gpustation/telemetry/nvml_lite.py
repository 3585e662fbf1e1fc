"""A lean ctypes binding to NVML: the part of ``pynvml`` the NVML backend uses.

``import pynvml`` (nvidia-ml-py 13) costs 50-80 ms because it defines hundreds
of ctypes Structure classes when imported; ``gpustation snapshot`` is meant to
answer as fast as ``nvidia-smi``. This module offers the same functions, under
the same names, with the same arguments, return values and errors as
nvidia-ml-py, but only the ones :mod:`gpustation.telemetry.nvml` calls.

What it keeps from pynvml, on purpose, so either module can back the backend:

* ``nvmlInit()`` loads ``libnvidia-ml.so.1`` on first use; before that nothing
  touches ctypes (even ``import ctypes`` costs ~2 ms), so importing this module
  is nearly free.
* Function pointers are looked up once and cached; a lock guards only that
  cache. A symbol the library lacks raises ``NVMLError`` with
  ``NVML_ERROR_FUNCTION_NOT_FOUND``.
* ``NVMLError.value`` is NVML's return code; ``str()`` gives pynvml's text.
* Strings come back as ``str``; structs are ctypes Structures with pynvml's
  field names (byte-string fields read as ``str``); process lists are objects
  with ``pid``/``usedGpuMemory``/``gpuInstanceId``/``computeInstanceId`` and
  ``usedGpuMemory=None`` when NVML cannot tell; pairs such as the power-limit
  constraints come back as two-item lists, as pynvml returns them.
* Constants have pynvml's values, including its quirks (``NVML_P2P_CAPS_INDEX_READ``
  is the 1-tuple ``(0,)`` there, so it is here).

The one deliberate difference: pynvml's ``nvmlDeviceGetMinMaxFanSpeed`` and
``nvmlDeviceGetFanControlPolicy_v2`` fill a ctypes object shared by every call
(a mutable default argument); here each call gets its own.
"""

from __future__ import annotations

import _thread
import os
import sys

# Neither typing nor threading is imported at run time: together they cost more
# than the rest of this module (annotations are strings here, see __future__).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

# ---- constants (values as in nvml.h and nvidia-ml-py) ------------------------

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
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_FAN_POLICY_MANUAL = 1
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
# pynvml defines this one with a stray trailing comma; kept identical so code
# written against pynvml (which must unwrap it) sees the same value here.
NVML_P2P_CAPS_INDEX_READ = (0,)
NVML_P2P_CAPS_INDEX_WRITE = 1
NVML_P2P_STATUS_OK = 0
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVML_PSTATE_UNKNOWN = 32

NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96
NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96
NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80
NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE = 80
NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32
NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16

#: Version word of ``nvmlMemory_v2_t``: its size (40) | 2 << 24.
nvmlMemory_v2 = 0x02000028

# usedGpuMemory when NVML cannot tell (unsigned long long -1).
_VALUE_NOT_AVAILABLE_ULL = (1 << 64) - 1

# Where the library is looked for, in order. The soname first (what pynvml
# loads: the dynamic linker's cache and LD_LIBRARY_PATH), then the places
# drivers are installed when the linker cache does not list them.
if sys.platform.startswith("win"):
    _LIBRARY_NAMES: tuple[str, ...] = (
        os.path.join(os.getenv("WINDIR", "C:/Windows"), "System32/nvml.dll"),
        os.path.join(
            os.getenv("PROGRAMFILES", "C:/Program Files"), "NVIDIA Corporation/NVSMI/nvml.dll"
        ),
    )
else:
    _LIBRARY_NAMES = (
        "libnvidia-ml.so.1",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib64/libnvidia-ml.so.1",
        "/usr/lib/libnvidia-ml.so.1",
        "/usr/local/nvidia/lib64/libnvidia-ml.so.1",  # NVIDIA container toolkit
        "/usr/lib/wsl/lib/libnvidia-ml.so.1",  # WSL 2
        "/run/opengl-driver/lib/libnvidia-ml.so.1",  # NixOS
    )

# ---- library state -------------------------------------------------------------

_lib: Any = None  # the loaded CDLL
_c: Any = None  # the ctypes module, imported when the library is first loaded
_t: Any = None  # namespace of the Structure classes, made at the same time
_lock = _thread.allocate_lock()  # guards _lib, _fns and _refcount, as pynvml's libLoadLock
_init_lock = _thread.allocate_lock()  # held while the library's init runs
_early: Any = None  # held while start_early()'s thread runs
_types_lock = _thread.allocate_lock()
_fns: dict[str, Any] = {}  # function pointers, cached; read without the lock
_refcount = 0

# The Structure classes, served by the module __getattr__ once ctypes is loaded.
_TYPE_NAMES = frozenset(
    {
        "struct_c_nvmlDevice_t",
        "c_nvmlDevice_t",
        "c_nvmlMemory_t",
        "c_nvmlMemory_v2_t",
        "c_nvmlUtilization_t",
        "nvmlPciInfo_t",
        "c_nvmlProcessInfo_v2_t",
        "c_nvmlProcessInfo_v3_t",
        "c_nvmlProcessInfo_t",
    }
)


class NVMLError(Exception):
    """An NVML call failed; ``value`` is NVML's return code (``NVML_ERROR_*``)."""

    # pynvml's texts, so messages read the same whichever binding is in use.
    _errcode_to_string: ClassVar[dict[int, str]] = {
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
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        # Known codes use the table; others ask the library once (as pynvml does).
        text = NVMLError._errcode_to_string.get(self.value)
        if text is not None:
            return text
        try:
            text = nvmlErrorString(self.value)
        except NVMLError:
            return f"NVML Error with code {self.value}"
        NVMLError._errcode_to_string[self.value] = text
        return text

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NVMLError):
            return NotImplemented
        return self.value == other.value

    def __hash__(self) -> int:
        return hash((NVMLError, self.value))


def _check(ret: int) -> None:
    if ret != NVML_SUCCESS:
        raise NVMLError(ret)


class nvmlFriendlyObject:
    """A plain object holding one struct's fields (what pynvml returns for processes)."""

    def __init__(self, dictionary: dict[str, Any]) -> None:
        for key, value in dictionary.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        return str(self.__dict__)


def nvmlStructToFriendlyObject(struct: Any) -> nvmlFriendlyObject:
    """Copy a Structure's fields into a plain object, byte strings decoded."""
    d = {}
    for key, *_ in struct._fields_:
        value = getattr(struct, key)
        d[key] = value.decode() if isinstance(value, bytes) else value
    return nvmlFriendlyObject(d)


# ---- ctypes, loaded on demand ------------------------------------------------------


def _define_types(ct: Any) -> Any:
    """The few Structures NVML's answers need, laid out as in nvml.h / pynvml."""
    from types import SimpleNamespace

    c_uint, c_ulonglong, c_char = ct.c_uint, ct.c_ulonglong, ct.c_char

    class _PrintableStructure(ct.Structure):
        """A Structure whose byte-string fields read as str (as in pynvml)."""

        def __getattribute__(self, name: str) -> Any:
            res = super().__getattribute__(name)
            return res.decode() if isinstance(res, bytes) else res

        def __setattr__(self, name: str, value: Any) -> None:
            if isinstance(value, str):
                value = value.encode()
            super().__setattr__(name, value)

        def __str__(self) -> str:
            fields = ", ".join(f"{k}: {getattr(self, k)}" for k, *_ in self._fields_)
            return f"{type(self).__name__}({fields})"

    class struct_c_nvmlDevice_t(ct.Structure):
        pass  # opaque handle

    class c_nvmlMemory_t(_PrintableStructure):
        _fields_ = (("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong))

    class c_nvmlMemory_v2_t(_PrintableStructure):
        _fields_ = (
            ("version", c_uint),
            ("total", c_ulonglong),
            ("reserved", c_ulonglong),
            ("free", c_ulonglong),
            ("used", c_ulonglong),
        )

    class c_nvmlUtilization_t(_PrintableStructure):
        _fields_ = (("gpu", c_uint), ("memory", c_uint))

    class nvmlPciInfo_t(_PrintableStructure):
        _fields_ = (
            ("busIdLegacy", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
            ("domain", c_uint),
            ("bus", c_uint),
            ("device", c_uint),
            ("pciDeviceId", c_uint),
            ("pciSubSystemId", c_uint),
            ("busId", c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
        )

    # nvmlProcessInfo_v2_t and the v3 functions' nvmlProcessInfo_t share one layout.
    class c_nvmlProcessInfo_v2_t(_PrintableStructure):
        _fields_ = (
            ("pid", c_uint),
            ("usedGpuMemory", c_ulonglong),
            ("gpuInstanceId", c_uint),
            ("computeInstanceId", c_uint),
        )

    return SimpleNamespace(
        struct_c_nvmlDevice_t=struct_c_nvmlDevice_t,
        c_nvmlDevice_t=ct.POINTER(struct_c_nvmlDevice_t),
        c_nvmlMemory_t=c_nvmlMemory_t,
        c_nvmlMemory_v2_t=c_nvmlMemory_v2_t,
        c_nvmlUtilization_t=c_nvmlUtilization_t,
        nvmlPciInfo_t=nvmlPciInfo_t,
        c_nvmlProcessInfo_v2_t=c_nvmlProcessInfo_v2_t,
        c_nvmlProcessInfo_v3_t=c_nvmlProcessInfo_v2_t,
        c_nvmlProcessInfo_t=c_nvmlProcessInfo_v2_t,
    )


def _ensure_ctypes() -> Any:
    """Import ctypes and define the Structures, once."""
    global _c, _t
    if _c is None:
        with _types_lock:
            if _c is None:
                import ctypes

                _t = _define_types(ctypes)
                _c = ctypes  # set last: readers test _c without the lock
    return _c


def __getattr__(name: str) -> Any:
    # The Structure classes exist only once ctypes is loaded (see module docstring).
    if name in _TYPE_NAMES:
        _ensure_ctypes()
        return getattr(_t, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _load_library() -> None:
    """Load the NVML library if it is not loaded yet (pynvml's _LoadNvmlLibrary)."""
    global _lib
    if _lib is not None:
        return
    ct = _ensure_ctypes()
    with _lock:
        if _lib is not None:
            return
        for name in _LIBRARY_NAMES:
            try:
                _lib = ct.CDLL(name)
                return
            except OSError:
                continue
    raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)


def _fn(name: str) -> Any:
    """The library's function ``name``, looked up once (pynvml's _nvmlGetFunctionPointer)."""
    fn = _fns.get(name)
    if fn is not None:
        return fn
    with _lock:
        if _lib is None:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        try:
            fn = getattr(_lib, name)
        except AttributeError:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND) from None
        if name == "nvmlErrorString":
            fn.restype = _c.c_char_p  # every other function returns an int
        _fns[name] = fn
        return fn


# ---- library and system -----------------------------------------------------------


def nvmlInitWithFlags(flags: int) -> None:
    """Load the library if needed and start NVML."""
    global _refcount
    _load_library()
    with _init_lock:  # one start at a time: a second waits for the first, see start_early()
        _check(_fn("nvmlInitWithFlags")(flags))
    with _lock:
        _refcount += 1


def nvmlInit() -> None:
    """Load the library if needed and start NVML."""
    nvmlInitWithFlags(0)


def start_early() -> None:
    """Start NVML on a thread of its own and return at once.

    The driver takes 15-20 ms to start (on an H200 machine); ``gpustation
    snapshot`` calls this before it imports the rest of itself and parses its
    arguments, so that the two overlap. The backend's own :func:`nvmlInit`
    then waits for this one and counts one more user; a start that fails here
    fails there again and reports its error. Call :func:`wait_early` before
    the process exits.
    """
    global _early
    # The library is loaded here, not on the thread: that is Python work
    # (ctypes, the dlopen, the function lookup), and a thread doing Python
    # work beside a main thread busy with imports gets the interpreter lock
    # only every few milliseconds. On an H200 machine a start done wholly on
    # the thread took twice the driver's 11 ms. The thread then makes one
    # call, which runs without the lock.
    try:
        _load_library()
        _fn("nvmlInitWithFlags")
    except NVMLError:
        return  # the caller's own nvmlInit() reports it
    done = _thread.allocate_lock()
    done.acquire()
    running = _thread.allocate_lock()
    running.acquire()

    def run() -> None:
        try:
            running.release()
            nvmlInit()
        except Exception:  # reported by the caller's own nvmlInit()
            pass
        finally:
            done.release()

    _early = done
    _thread.start_new_thread(run, ())
    # Hand the thread the interpreter lock until it is in the driver's call;
    # otherwise it waits for this thread's next switch (5 ms) to begin.
    running.acquire()


def wait_early(timeout_s: float = 10.0) -> None:
    """Wait for :func:`start_early`'s thread to finish.

    A process that exits (a usage error, say) while the driver is still
    starting on that thread would tear the library down under it.
    """
    done = _early
    if done is not None and done.acquire(timeout=timeout_s):
        done.release()


def nvmlShutdown() -> None:
    """Stop NVML; the library stays loaded."""
    global _refcount
    _check(_fn("nvmlShutdown")())
    with _lock:
        if _refcount > 0:
            _refcount -= 1


def nvmlErrorString(result: int) -> str:
    """NVML's own text for a return code."""
    text = _fn("nvmlErrorString")(result)
    return text.decode() if isinstance(text, bytes) else text


def _string(name: str, size: int, *handle: Any) -> str:
    fn = _fn(name)
    buf = _c.create_string_buffer(size)
    _check(fn(*handle, buf, _c.c_uint(size)))
    return buf.value.decode()


def nvmlSystemGetDriverVersion() -> str:
    """The driver version, e.g. ``"580.95.05"``."""
    return _string("nvmlSystemGetDriverVersion", NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE)


def nvmlSystemGetNVMLVersion() -> str:
    """The NVML library version, e.g. ``"13.580.95.05"``."""
    return _string("nvmlSystemGetNVMLVersion", NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE)


def _int_out(fn: Any, *args: Any, kind: str = "c_uint") -> int:
    """Call ``fn(*args, &out)`` and return ``out`` (the common getter shape).

    Callers pass ``_fn(name)`` first, so an uninitialised library raises
    NVML's UNINITIALIZED before any ctypes argument is built.
    """
    out = getattr(_c, kind)()
    _check(fn(*args, _c.byref(out)))
    return out.value


def nvmlSystemGetCudaDriverVersion() -> int:
    """The CUDA version the driver supports, e.g. 12080 for 12.8."""
    return _int_out(_fn("nvmlSystemGetCudaDriverVersion"), kind="c_int")


def nvmlSystemGetCudaDriverVersion_v2() -> int:
    """The CUDA version the driver supports, e.g. 12080 for 12.8."""
    return _int_out(_fn("nvmlSystemGetCudaDriverVersion_v2"), kind="c_int")


# ---- devices ---------------------------------------------------------------------


def nvmlDeviceGetCount() -> int:
    """How many GPUs NVML sees."""
    return _int_out(_fn("nvmlDeviceGetCount_v2"))


def nvmlDeviceGetHandleByIndex(index: int) -> Any:
    """The handle of GPU ``index`` (a ``c_nvmlDevice_t``)."""
    fn = _fn("nvmlDeviceGetHandleByIndex_v2")
    device = _t.c_nvmlDevice_t()
    _check(fn(_c.c_uint(index), _c.byref(device)))
    return device


def nvmlDeviceGetName(handle: Any) -> str:
    """The product name, e.g. ``"NVIDIA H200"``."""
    return _string("nvmlDeviceGetName", NVML_DEVICE_NAME_V2_BUFFER_SIZE, handle)


def nvmlDeviceGetUUID(handle: Any) -> str:
    """The GPU's UUID, ``"GPU-..."``."""
    return _string("nvmlDeviceGetUUID", NVML_DEVICE_UUID_V2_BUFFER_SIZE, handle)


def nvmlDeviceGetPciInfo_v3(handle: Any) -> Any:
    """PCI information (``busId`` and the rest) as an ``nvmlPciInfo_t``."""
    fn = _fn("nvmlDeviceGetPciInfo_v3")
    info = _t.nvmlPciInfo_t()
    _check(fn(handle, _c.byref(info)))
    return info


def nvmlDeviceGetPciInfo(handle: Any) -> Any:
    """PCI information (pynvml calls the v3 function under this name too)."""
    return nvmlDeviceGetPciInfo_v3(handle)


def nvmlDeviceGetClockInfo(handle: Any, type: int) -> int:
    """The current clock of one domain (``NVML_CLOCK_*``), MHz."""
    return _int_out(_fn("nvmlDeviceGetClockInfo"), handle, _c.c_uint(type))


def nvmlDeviceGetMaxClockInfo(handle: Any, type: int) -> int:
    """The maximum clock of one domain (``NVML_CLOCK_*``), MHz."""
    return _int_out(_fn("nvmlDeviceGetMaxClockInfo"), handle, _c.c_uint(type))


def nvmlDeviceGetMemoryInfo(handle: Any, version: int | None = None) -> Any:
    """Frame-buffer memory: ``c_nvmlMemory_t``, or ``c_nvmlMemory_v2_t`` given ``version``."""
    if not version:
        fn = _fn("nvmlDeviceGetMemoryInfo")
        memory = _t.c_nvmlMemory_t()
    else:
        fn = _fn("nvmlDeviceGetMemoryInfo_v2")
        memory = _t.c_nvmlMemory_v2_t()
        memory.version = version
    _check(fn(handle, _c.byref(memory)))
    return memory


def nvmlDeviceGetUtilizationRates(handle: Any) -> Any:
    """GPU and memory utilisation (``.gpu``, ``.memory``), percent."""
    fn = _fn("nvmlDeviceGetUtilizationRates")
    util = _t.c_nvmlUtilization_t()
    _check(fn(handle, _c.byref(util)))
    return util


def nvmlDeviceGetNumFans(device: Any) -> int:
    """How many fans NVML can read on this GPU."""
    return _int_out(_fn("nvmlDeviceGetNumFans"), device)


def nvmlDeviceGetFanSpeed_v2(handle: Any, fan: int) -> int:
    """One fan's speed, percent of its maximum."""
    return _int_out(_fn("nvmlDeviceGetFanSpeed_v2"), handle, fan)


def nvmlDeviceGetMinMaxFanSpeed(handle: Any, minSpeed: Any = None, maxSpeed: Any = None) -> Any:
    """``[min, max]`` fan speed a manual setting accepts, percent.

    Given ctypes references (pynvml's other calling form), fills them and
    returns ``NVML_SUCCESS``.
    """
    fn = _fn("nvmlDeviceGetMinMaxFanSpeed")
    c_uint = _c.c_uint
    if minSpeed is None:
        minSpeed = c_uint()
    if maxSpeed is None:
        maxSpeed = c_uint()
    is_reference = type(minSpeed) is not c_uint or type(maxSpeed) is not c_uint
    min_ref = minSpeed if is_reference else _c.byref(minSpeed)
    max_ref = maxSpeed if is_reference else _c.byref(maxSpeed)
    _check(fn(handle, min_ref, max_ref))
    return NVML_SUCCESS if is_reference else [minSpeed.value, maxSpeed.value]


def nvmlDeviceGetFanControlPolicy_v2(handle: Any, fan: int, fanControlPolicy: Any = None) -> Any:
    """One fan's control policy (``NVML_FAN_POLICY_*``).

    Given a ctypes reference (pynvml's other calling form), fills it and
    returns ``NVML_SUCCESS``.
    """
    fn = _fn("nvmlDeviceGetFanControlPolicy_v2")
    if fanControlPolicy is None:
        fanControlPolicy = _c.c_uint()
    is_reference = type(fanControlPolicy) is not _c.c_uint
    ref = fanControlPolicy if is_reference else _c.byref(fanControlPolicy)
    _check(fn(handle, fan, ref))
    return NVML_SUCCESS if is_reference else fanControlPolicy.value


def nvmlDeviceGetTemperature(handle: Any, sensor: int) -> int:
    """Temperature of one sensor (``NVML_TEMPERATURE_GPU``), degrees C."""
    return _int_out(_fn("nvmlDeviceGetTemperature"), handle, _c.c_uint(sensor))


def nvmlDeviceGetTemperatureThreshold(handle: Any, threshold: int) -> int:
    """A temperature threshold (``NVML_TEMPERATURE_THRESHOLD_*``), degrees C."""
    return _int_out(_fn("nvmlDeviceGetTemperatureThreshold"), handle, _c.c_uint(threshold))


def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    """Power draw, milliwatts."""
    return _int_out(_fn("nvmlDeviceGetPowerUsage"), handle)


def nvmlDeviceGetEnforcedPowerLimit(handle: Any) -> int:
    """The power limit in force, milliwatts."""
    return _int_out(_fn("nvmlDeviceGetEnforcedPowerLimit"), handle)


def nvmlDeviceGetPowerManagementLimit(handle: Any) -> int:
    """The power limit set, milliwatts."""
    return _int_out(_fn("nvmlDeviceGetPowerManagementLimit"), handle)


def nvmlDeviceGetPowerManagementDefaultLimit(handle: Any) -> int:
    """The power limit the card starts with, milliwatts."""
    return _int_out(_fn("nvmlDeviceGetPowerManagementDefaultLimit"), handle)


def nvmlDeviceGetPowerManagementLimitConstraints(handle: Any) -> list[int]:
    """``[min, max]`` power limit the card accepts, milliwatts."""
    fn = _fn("nvmlDeviceGetPowerManagementLimitConstraints")
    low, high = _c.c_uint(), _c.c_uint()
    _check(fn(handle, _c.byref(low), _c.byref(high)))
    return [low.value, high.value]


def nvmlDeviceGetPerformanceState(handle: Any) -> int:
    """The performance state, 0 (P0, fastest) to 15, or ``NVML_PSTATE_UNKNOWN``."""
    return _int_out(_fn("nvmlDeviceGetPerformanceState"), handle)


def nvmlDeviceGetCurrentClocksEventReasons(handle: Any) -> int:
    """Bit mask of why clocks are held down now."""
    return _int_out(_fn("nvmlDeviceGetCurrentClocksEventReasons"), handle, kind="c_ulonglong")


def nvmlDeviceGetCurrentClocksThrottleReasons(handle: Any) -> int:
    """Bit mask of why clocks are held down now (name of drivers before 535)."""
    return _int_out(_fn("nvmlDeviceGetCurrentClocksThrottleReasons"), handle, kind="c_ulonglong")


def nvmlDeviceGetCurrPcieLinkGeneration(handle: Any) -> int:
    """The PCIe generation the link runs at now."""
    return _int_out(_fn("nvmlDeviceGetCurrPcieLinkGeneration"), handle)


def nvmlDeviceGetCurrPcieLinkWidth(handle: Any) -> int:
    """The PCIe lanes in use now."""
    return _int_out(_fn("nvmlDeviceGetCurrPcieLinkWidth"), handle)


def nvmlDeviceGetMaxPcieLinkGeneration(handle: Any) -> int:
    """The highest PCIe generation the GPU and its slot allow."""
    return _int_out(_fn("nvmlDeviceGetMaxPcieLinkGeneration"), handle)


def nvmlDeviceGetMaxPcieLinkWidth(handle: Any) -> int:
    """The widest PCIe link the GPU and its slot allow."""
    return _int_out(_fn("nvmlDeviceGetMaxPcieLinkWidth"), handle)


def nvmlDeviceGetTotalEccErrors(handle: Any, errorType: int, counterType: int) -> int:
    """ECC error count of one type (``NVML_MEMORY_ERROR_TYPE_*``) and counter."""
    return _int_out(
        _fn("nvmlDeviceGetTotalEccErrors"),
        handle,
        _c.c_uint(errorType),
        _c.c_uint(counterType),
        kind="c_ulonglong",
    )


def nvmlDeviceGetPcieThroughput(device: Any, counter: int) -> int:
    """PCIe throughput of one direction (``NVML_PCIE_UTIL_*``), KiB/s."""
    return _int_out(_fn("nvmlDeviceGetPcieThroughput"), device, _c.c_uint(counter))


def nvmlDeviceGetTotalEnergyConsumption(handle: Any) -> int:
    """Energy used since the driver loaded, millijoules."""
    return _int_out(_fn("nvmlDeviceGetTotalEnergyConsumption"), handle, kind="c_uint64")


def nvmlDeviceGetPcieReplayCounter(handle: Any) -> int:
    """PCIe replays since the driver loaded."""
    return _int_out(_fn("nvmlDeviceGetPcieReplayCounter"), handle)


# ---- processes ---------------------------------------------------------------------


def _processes(name: str, handle: Any) -> list[nvmlFriendlyObject]:
    """NVML's two-call list protocol, as pynvml does it.

    Ask with room for none: SUCCESS means no processes, INSUFFICIENT_SIZE
    gives the count. Ask again with room for twice that plus five, in case
    processes started in between.
    """
    fn = _fn(name)
    c_count = _c.c_uint(0)
    ret = fn(handle, _c.byref(c_count), None)
    if ret == NVML_SUCCESS:
        return []
    if ret != NVML_ERROR_INSUFFICIENT_SIZE:
        raise NVMLError(ret)
    c_count.value = c_count.value * 2 + 5
    procs = (_t.c_nvmlProcessInfo_v2_t * c_count.value)()
    _check(fn(handle, _c.byref(c_count), procs))
    result = []
    for i in range(c_count.value):
        obj = nvmlStructToFriendlyObject(procs[i])
        if obj.usedGpuMemory == _VALUE_NOT_AVAILABLE_ULL:  # type: ignore[attr-defined]
            obj.usedGpuMemory = None  # type: ignore[attr-defined]
        result.append(obj)
    return result


def nvmlDeviceGetComputeRunningProcesses_v3(handle: Any) -> list[nvmlFriendlyObject]:
    """Compute processes on the GPU: ``pid``, ``usedGpuMemory`` (bytes or None)..."""
    return _processes("nvmlDeviceGetComputeRunningProcesses_v3", handle)


def nvmlDeviceGetComputeRunningProcesses_v2(handle: Any) -> list[nvmlFriendlyObject]:
    """Compute processes, through the function drivers before 510 offer."""
    return _processes("nvmlDeviceGetComputeRunningProcesses_v2", handle)


def nvmlDeviceGetComputeRunningProcesses(handle: Any) -> list[nvmlFriendlyObject]:
    """Compute processes (pynvml calls the v3 function under this name)."""
    return nvmlDeviceGetComputeRunningProcesses_v3(handle)


def nvmlDeviceGetGraphicsRunningProcesses_v3(handle: Any) -> list[nvmlFriendlyObject]:
    """Graphics processes on the GPU: ``pid``, ``usedGpuMemory`` (bytes or None)..."""
    return _processes("nvmlDeviceGetGraphicsRunningProcesses_v3", handle)


def nvmlDeviceGetGraphicsRunningProcesses_v2(handle: Any) -> list[nvmlFriendlyObject]:
    """Graphics processes, through the function drivers before 510 offer."""
    return _processes("nvmlDeviceGetGraphicsRunningProcesses_v2", handle)


def nvmlDeviceGetGraphicsRunningProcesses(handle: Any) -> list[nvmlFriendlyObject]:
    """Graphics processes (pynvml calls the v3 function under this name)."""
    return nvmlDeviceGetGraphicsRunningProcesses_v3(handle)


# ---- topology ------------------------------------------------------------------------


def nvmlDeviceGetNvLinkState(device: Any, link: int) -> int:
    """1 if NVLink ``link`` is active."""
    return _int_out(_fn("nvmlDeviceGetNvLinkState"), device, link)


def nvmlDeviceGetNvLinkRemoteDeviceType(handle: Any, link: int) -> int:
    """What is at the far end of a link (``NVML_NVLINK_DEVICE_TYPE_*``)."""
    return _int_out(_fn("nvmlDeviceGetNvLinkRemoteDeviceType"), handle, link)


def nvmlDeviceGetNvLinkRemotePciInfo(device: Any, link: int) -> Any:
    """PCI information of the device at the far end of a link (the v2 function)."""
    fn = _fn("nvmlDeviceGetNvLinkRemotePciInfo_v2")
    info = _t.nvmlPciInfo_t()
    _check(fn(device, link, _c.byref(info)))
    return info


def nvmlDeviceGetTopologyCommonAncestor(device1: Any, device2: Any) -> int:
    """How two GPUs are connected (``NVML_TOPOLOGY_*`` level)."""
    return _int_out(_fn("nvmlDeviceGetTopologyCommonAncestor"), device1, device2)


def nvmlDeviceGetP2PStatus(device1: Any, device2: Any, p2pIndex: int) -> int:
    """Whether peer-to-peer access of one kind works (``NVML_P2P_STATUS_OK`` = 0)."""
    return _int_out(_fn("nvmlDeviceGetP2PStatus"), device1, device2, p2pIndex)


def nvmlDeviceGetNumaNodeId(handle: Any) -> int:
    """The NUMA node the GPU is attached to (-1 if none)."""
    return _int_out(_fn("nvmlDeviceGetNumaNodeId"), handle, kind="c_int")


def nvmlDeviceGetCpuAffinity(handle: Any, cpuSetSize: int) -> Any:
    """The CPUs close to the GPU: ``cpuSetSize`` 64-bit mask words (a ctypes array)."""
    fn = _fn("nvmlDeviceGetCpuAffinity")
    affinity = (_c.c_ulonglong * cpuSetSize)()
    _check(fn(handle, cpuSetSize, _c.byref(affinity)))
    return affinity


# ---- setters (used only through gpustation.control) ---------------------------------


def nvmlDeviceSetPowerManagementLimit(handle: Any, limit: int) -> None:
    """Set the power limit, milliwatts (needs root)."""
    fn = _fn("nvmlDeviceSetPowerManagementLimit")
    _check(fn(handle, _c.c_uint(limit)))


def nvmlDeviceSetFanSpeed_v2(handle: Any, index: int, speed: int) -> int:
    """Set one fan to a fixed speed, percent (needs root)."""
    _check(_fn("nvmlDeviceSetFanSpeed_v2")(handle, index, speed))
    return NVML_SUCCESS


def nvmlDeviceSetDefaultFanSpeed_v2(handle: Any, index: int) -> int:
    """Give one fan back to the driver's automatic control (needs root)."""
    _check(_fn("nvmlDeviceSetDefaultFanSpeed_v2")(handle, index))
    return NVML_SUCCESS
