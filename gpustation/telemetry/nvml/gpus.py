"""What the NVML backend keeps per GPU, and the access to its GPUs that the
control half (``control.py``) is given: the backend's reading and control
code share these without importing each other."""

from __future__ import annotations

from typing import Any, Protocol

from gpustation.telemetry.nvml.query import Device


class Gpu(Device):
    """What the backend keeps per GPU between reads."""

    __slots__ = ("fan_max", "fan_min", "name", "num_fans", "slow", "static", "uuid")

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.uuid: str | None = None
        self.name: str | None = None
        self.num_fans = 0
        self.fan_min: int | None = None
        self.fan_max: int | None = None
        #: Static field values by key, read once.
        self.static: dict[str, Any] = {}
        #: Slow field values by key: the last read, reused between slow reads.
        self.slow: dict[str, Any] = {}


class GpuAccess(Protocol):
    """The GPUs of a backend, as its control sees them."""

    def gpu(self, index: int) -> Gpu:
        """The GPU at an index; UsageError for one the machine lacks."""

    def available(self, gpu: Gpu) -> bool:
        """True unless the GPU is lost (a lost one is tried again now and then)."""

    def mark_lost(self, gpu: Device, why: str) -> None: ...
