"""The simulated cards' control: power limits and fans, as the driver would
take them (the card's range, root when ``GPUSTATION_SIM_REQUIRE_ROOT=1``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from gpustation.errors import GpustationError, NeedsRootError, NotSupportedError, UsageError
from gpustation.privs import as_root
from gpustation.telemetry.backend import Control
from gpustation.telemetry.sim_cards import CardSpec

#: the cards' states, brought up to now, held under the machine's state lock
Changing = Callable[[], AbstractContextManager[list[dict[str, Any]]]]


def gpu_state(gpus: list[dict[str, Any]], index: int) -> dict[str, Any]:
    if not 0 <= index < len(gpus):
        raise UsageError(f"no GPU {index} (simulated GPUs: 0-{len(gpus) - 1})")
    return gpus[index]


class SimControl(Control):
    """Changes the simulated machine's shared state, as the NVML setters change a card."""

    def __init__(self, spec: CardSpec, changing: Changing) -> None:
        self.spec = spec
        self._changing = changing

    def _check_root(self, what: str) -> None:
        # the simulated driver call: as root under sudo, as a real setter is
        with as_root():
            euid = os.geteuid()
        if os.environ.get("GPUSTATION_SIM_REQUIRE_ROOT") == "1" and euid != 0:
            raise NeedsRootError(
                f"{what} needs root privileges: run it as sudo gpustation ... (simulated check)"
            )

    def set_power_limit(self, index: int, watts: float) -> None:
        self._check_root("setting the power limit")
        spec = self.spec
        if not spec.power_min_w <= watts <= spec.power_max_w:
            raise GpustationError(
                f"GPU {index}: {watts:g} W is outside the card's range "
                f"{spec.power_min_w:g}-{spec.power_max_w:g} W"
            )
        with self._changing() as gpus:
            gpu_state(gpus, index)["power_limit_w"] = float(watts)

    def fan_count(self, index: int) -> int:
        return self.spec.fans

    def fan_speed_range(self, index: int) -> tuple[int, int]:
        if not self.spec.fans:
            raise NotSupportedError(f"GPU {index} ({self.spec.name}) has no fans")
        return self.spec.fan_min_pct, self.spec.fan_max_pct

    def set_fan_speed(self, index: int, fan: int, pct: int) -> None:
        self._check_root("setting a fan speed")
        lo, hi = self.fan_speed_range(index)
        if not 0 <= fan < self.spec.fans:
            raise UsageError(f"GPU {index} has fans 0-{self.spec.fans - 1}, not {fan}")
        if not lo <= pct <= hi:
            raise GpustationError(f"GPU {index} fan {fan}: {pct} % is outside {lo}-{hi} %")
        with self._changing() as gpus:
            g = gpu_state(gpus, index)
            g["fan_mode"][fan] = "manual"
            g["fan_manual_pct"][fan] = float(pct)

    def set_fan_auto(self, index: int, fan: int) -> None:
        self._check_root("restoring automatic fan control")
        self.fan_speed_range(index)
        with self._changing() as gpus:
            gpu_state(gpus, index)["fan_mode"][fan] = "auto"
