"""Control of NVML GPUs: the power limit and the fans.

:class:`NvmlControl` is the ``control`` of an
:class:`~gpustation.telemetry.nvml.backend.NvmlBackend`: each setter goes to
the driver under the backend's lock, and a refusal (no permission, not
supported, a value out of range, a GPU fallen off the bus) becomes an error
that tells the user what to do.
"""

from __future__ import annotations

import os
import shlex
import sys
import threading
from typing import Any

from gpustation import privs
from gpustation.errors import GpustationError, NeedsRootError, NotSupportedError, UsageError
from gpustation.telemetry.backend import Control
from gpustation.telemetry.nvml.gpus import Gpu, GpuAccess
from gpustation.telemetry.nvml.query import GpuLost, Query


def _sudo_hint() -> str:
    """The command line to run again as root, when we can tell what it was."""
    argv0 = os.path.basename(sys.argv[0]) if sys.argv else ""
    if argv0 in ("gpustation", "__main__.py") and len(sys.argv) > 1:
        return "sudo gpustation " + shlex.join(sys.argv[1:])
    return "sudo gpustation ..."


class NvmlControl(Control):
    """The power limit and the fans of the GPUs of an NVML backend.

    ``lock`` is the backend's: one NVML call at a time; ``gpus`` gives the
    backend's GPUs (their handles, static values and fan count).
    """

    def __init__(self, q: Query, lock: threading.RLock, gpus: GpuAccess) -> None:
        self.q = q
        self._lock = lock
        self._gpus = gpus

    def _control_handle(self, index: int, what: str) -> Gpu:
        gpu = self._gpus.gpu(index)
        if gpu.lost and not self._gpus.available(gpu):
            raise GpustationError(
                f"cannot {what}: GPU {index} has fallen off the bus (NVML: GPU is lost). "
                "Check `nvidia-smi` and the kernel log; a reboot may be needed."
            )
        return gpu

    def _set(self, gpu: Gpu, name: str, what: str, value: str, *args: Any) -> None:
        """Call an NVML setter and turn its refusals into errors for the user."""
        fn = self.q.function(name)
        label = f"GPU {gpu.index}" + (f" ({gpu.name})" if gpu.name else "")
        if fn is None:
            raise NotSupportedError(
                f"cannot {what} on {label}: this NVML library has no {name}. "
                "Update the NVIDIA driver and nvidia-ml-py."
            )
        nvml = self.q.nvml
        try:
            # the one place a setter runs: root for it alone (under sudo)
            with self._lock, privs.as_root():
                fn(gpu.handle, *args)
        except self.q.error_type as err:
            code = getattr(err, "value", None)
            if code == nvml.NVML_ERROR_NO_PERMISSION:
                raise NeedsRootError(
                    f"cannot {what} on {label}: the driver refused ({err}); this needs root: "
                    f"run it as {_sudo_hint()}"
                ) from None
            if code in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                if code == nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    self.q.forget(name)
                raise NotSupportedError(f"{label} cannot {what} (NVML: {err}).") from None
            if code == nvml.NVML_ERROR_INVALID_ARGUMENT:
                raise GpustationError(
                    f"{label} rejected {value} when asked to {what} (NVML: {err})."
                ) from None
            if code == nvml.NVML_ERROR_GPU_IS_LOST:
                self._gpus.mark_lost(gpu, f"{name}: {err}")
                raise GpustationError(
                    f"cannot {what}: {label} has fallen off the bus (NVML: {err})."
                ) from None
            raise GpustationError(f"cannot {what} on {label}: NVML said {err}.") from None

    def set_power_limit(self, index: int, watts: float) -> None:
        """Set the power limit (the driver takes milliwatts)."""
        gpu = self._control_handle(index, "set the power limit")
        lo, hi = gpu.static.get("power_min_w"), gpu.static.get("power_max_w")
        accepted = f" (it accepts {lo:g}-{hi:g} W)" if lo is not None and hi is not None else ""
        self._set(
            gpu,
            "nvmlDeviceSetPowerManagementLimit",
            "set the power limit",
            f"a power limit of {watts:g} W{accepted}",
            round(watts * 1000),
        )

    def fan_count(self, index: int) -> int:
        return self._gpus.gpu(index).num_fans

    def _check_fan(self, gpu: Gpu, fan: int, what: str) -> None:
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
        gpu = self._gpus.gpu(index)
        self._check_fan(gpu, 0, "control")
        if gpu.fan_min is None and not gpu.lost:
            # Read when control first asks (no display shows it); asked again
            # after a passing error.
            with self._lock:
                try:
                    fan_range = self.q(gpu, "fan_range", "nvmlDeviceGetMinMaxFanSpeed")
                except GpuLost as err:
                    self._gpus.mark_lost(gpu, str(err))
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
