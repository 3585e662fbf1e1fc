"""Every NVML call goes through :class:`Query`: what an answer or an error means.

In the manner of nvitop's ``nvmlQuery``:

* NotSupported (or a refused argument version) -> ``None``, and that function
  is not asked again for that GPU;
* FunctionNotFound, or a function this nvidia-ml-py lacks -> ``None``,
  remembered once per process (and logged once);
* GPU is lost -> :class:`GpuLost`, the one exception a read lets through;
* any other NVML error -> ``None``, kept in :attr:`Query.errors` for a debug view.

:func:`start_nvml` imports nvidia-ml-py and starts NVML, or says why it cannot.

Versioned functions are tried newest first from :data:`FALLBACKS`, the one
table of version differences.
"""

from __future__ import annotations

import logging
from typing import Any

from gpustation.errors import NoDriverError

log = logging.getLogger(__name__)

#: A function name -> the functions to try for it, newest first.
FALLBACKS: dict[str, tuple[str, ...]] = {
    "nvmlDeviceGetComputeRunningProcesses": (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses",
    ),
    "nvmlDeviceGetGraphicsRunningProcesses": (
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses",
    ),
    "nvmlDeviceGetCurrentClocksEventReasons": (
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ),
    "nvmlDeviceGetEnforcedPowerLimit": (
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPowerManagementLimit",
    ),
    "nvmlDeviceGetPciInfo": ("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo"),
    "nvmlDeviceGetNvLinkRemotePciInfo": (
        "nvmlDeviceGetNvLinkRemotePciInfo_v2",
        "nvmlDeviceGetNvLinkRemotePciInfo",
    ),
    "nvmlSystemGetCudaDriverVersion": (
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlSystemGetCudaDriverVersion",
    ),
    "nvmlEventSetWait_v2": ("nvmlEventSetWait_v2", "nvmlEventSetWait"),
    # v2 leaves the driver's reservation out of ``used``.
    "nvmlDeviceGetMemoryInfo": ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo"),
}

#: Versions nvidia-ml-py reaches through a keyword of the plain function:
#: name -> (the function, the keyword, the pynvml constant it takes).
VERSION_KEYWORDS: dict[str, tuple[str, str, str]] = {
    "nvmlDeviceGetMemoryInfo_v2": ("nvmlDeviceGetMemoryInfo", "version", "nvmlMemory_v2"),
}

#: Functions this process found missing; never called again.
MISSING: set[str] = set()

#: What a call gives back when asked for ``failed=FAILED``: it could not be read
#: (as against a function that answers ``None`` when it succeeds).
FAILED: Any = object()


def no_driver_message(err: BaseException) -> str:
    code = getattr(err, "value", None)
    kind = type(err).__name__ + (f", code {code}" if code is not None else "")
    return (
        f"NVML could not start: {err} ({kind}). Is the NVIDIA driver installed and "
        "loaded? To try gpustation without a GPU, use --simulate."
    )


def cuda_version(code: int) -> str:
    """NVML's CUDA version number (13000) as people write it (13.0)."""
    return f"{code // 1000}.{code % 1000 // 10}"


class NoBindingError(NoDriverError):
    """The pynvml module (nvidia-ml-py) is not installed."""


def start_nvml(nvml: Any = None) -> Any:
    """``nvmlInit()`` on ``nvml`` (default: ``import pynvml``); return that module.

    A missing module, library or driver is a :class:`NoDriverError`.
    """
    if nvml is None:
        try:
            # start-up time: pynvml, only for real GPUs
            import pynvml
        except ImportError as err:
            raise NoBindingError(
                f"NVML could not start: the pynvml module is missing ({err}). "
                "Install nvidia-ml-py. To try gpustation without a GPU, use --simulate."
            ) from None
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except getattr(nvml, "NVMLError", Exception) as err:
        raise NoDriverError(no_driver_message(err)) from None
    except (OSError, AttributeError) as err:
        raise NoDriverError(
            f"NVML could not start: {err} ({type(err).__name__}). Is the NVIDIA driver "
            "installed and loaded? To try gpustation without a GPU, use --simulate."
        ) from None
    return nvml


class GpuLost(Exception):
    """NVML says the GPU has fallen off the bus."""


class Device:
    """A GPU as the queries know it: handle, bus id, lost or not, what it does not support."""

    __slots__ = ("handle", "index", "lost", "lost_at", "pci_bus_id", "unsupported")

    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: Any = None
        self.pci_bus_id: str | None = None
        self.lost = False
        self.lost_at = 0.0
        #: Functions this GPU answered NotSupported: not asked again.
        self.unsupported: set[str] = set()


class Query:
    """Calls pynvml functions by name for one field at a time."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.error_type: type[BaseException] = nvml.NVMLError
        #: (gpu index or -1 for system calls, field) -> last error text.
        self.errors: dict[tuple[int, str], str] = {}
        self.error_count = 0  # errors ever noted, repeats included
        self._system = Device(-1)

    def const(self, name: str) -> int:
        """A pynvml constant (nvidia-ml-py writes NVML_P2P_CAPS_INDEX_READ as a 1-tuple)."""
        value = getattr(self.nvml, name)
        return int(value[0] if isinstance(value, tuple) else value)

    def function(self, name: str) -> Any:
        """The pynvml function, or ``None`` once it is known to be missing."""
        if name in MISSING:
            return None
        fn = getattr(self.nvml, name, None)
        if fn is None:
            self.forget(name)
        return fn

    def available(self, gpu: Device | None, name: str) -> bool:
        """Whether a call of ``name`` (or a version of it) would still be made."""
        device = self._system if gpu is None else gpu
        return any(
            v not in MISSING and v not in device.unsupported and hasattr(self.nvml, v)
            for v in FALLBACKS.get(name, (name,))
        )

    def forget(self, name: str) -> None:
        """Remember (once per process) that ``name`` is missing."""
        if name not in MISSING:
            MISSING.add(name)
            log.info("NVML has no %s (old driver or nvidia-ml-py); not asked again", name)

    def error(self, index: int, field: str, text: str) -> None:
        self.errors[(index, field)] = text
        self.error_count += 1

    def __call__(
        self,
        gpu: Device | None,
        field: str,
        name: str,
        *args: Any,
        expected: tuple[str, ...] = (),
        failed: Any = None,
        per_args: bool = False,
    ) -> Any:
        """``name(handle, *args)`` (no handle for ``gpu=None``) for ``field``; ``failed``
        (default ``None``) when it cannot be read. Raises :class:`GpuLost`.

        ``expected`` names NVML error codes (``NVML_ERROR_TIMEOUT``...) that are
        an answer, not a failure ("nothing happened", "no samples"): they give
        ``None``, are not recorded and do not mark the function unsupported.
        ``per_args``: NotSupported is remembered for these arguments only (a
        temperature threshold one sensor lacks says nothing of the others).
        """
        device = self._system if gpu is None else gpu
        lead = () if gpu is None else (gpu.handle,)
        for version in FALLBACKS.get(name, (name,)):
            mark = f"{version}{args!r}" if per_args else version
            if mark in device.unsupported or version in MISSING:
                continue
            keywords: dict[str, Any] = {}
            plain = VERSION_KEYWORDS.get(version)
            if plain is not None:
                fn = self.function(plain[0])
                keywords[plain[1]] = self.const(plain[2])
            else:
                fn = self.function(version)
            if fn is None:
                continue
            try:
                return fn(*lead, *args, **keywords)
            except self.error_type as err:
                if expected and getattr(err, "value", None) in self._codes(expected):
                    return None
                self._failed(device, field, version, err, mark)
            except TypeError as err:
                if keywords:  # an old nvidia-ml-py without the keyword
                    device.unsupported.add(version)
                else:
                    self.error(device.index, field, f"{version}: TypeError: {err}")
            except Exception as err:  # a broken binding must not hide the other fields
                self.error(device.index, field, f"{version}: {type(err).__name__}: {err}")
        return failed

    def _codes(self, names: tuple[str, ...]) -> set[int]:
        return {
            int(code) for code in (getattr(self.nvml, n, None) for n in names) if code is not None
        }

    def _failed(self, device: Device, field: str, name: str, err: BaseException, mark: str) -> None:
        code = getattr(err, "value", None)
        nvml = self.nvml
        if code == nvml.NVML_ERROR_GPU_IS_LOST:
            raise GpuLost(f"{name}: {err}") from None
        if code == nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            self.forget(name)
        elif code in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH):
            device.unsupported.add(mark)
        else:
            self.error(device.index, field, f"{name}: {err}")

    def quiet(self, gpu: Device, name: str, *args: Any) -> Any:
        """Like a call, but any NVML error but GPU-lost is just ``None`` (probing)."""
        fn = self.function(name)
        if fn is None or name in gpu.unsupported:
            return None
        try:
            return fn(gpu.handle, *args)
        except self.error_type as err:
            code = getattr(err, "value", None)
            if code == self.nvml.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(f"{name}: {err}") from None
            if code == self.nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                self.forget(name)
        except Exception:
            pass
        return None
