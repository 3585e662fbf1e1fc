"""The lite NVML binding and nvidia-ml-py read the same real GPUs alike (read-only)."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from gpustation.telemetry import nvml_lite
from gpustation.telemetry.nvml import NvmlBackend
from gpustation.telemetry.sampler import Sampler

# Values that do not change while the machine runs (no one changing settings).
STATIC = (
    "index",
    "uuid",
    "name",
    "pci_bus_id",
    "lost",
    "temperature_slowdown_c",
    "temperature_shutdown_c",
    "power_limit_w",
    "power_default_w",
    "power_min_w",
    "power_max_w",
    "clock_sm_max_mhz",
    "clock_mem_max_mhz",
    "memory_total_mib",
    "fan_control",
)
STATIC_PCIE = ("max_gen", "max_width")


def _read(backend: NvmlBackend) -> dict[str, Any]:
    snap = Sampler(backend, with_host=False).sample(slow=True).to_dict()
    snap["missing_functions"] = sorted(backend.missing_functions)
    snap["error_fields"] = sorted(str(key) for key in backend.errors)
    return snap


def test_lite_and_pynvml_snapshots_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSTATION_NVML", raising=False)
    with NvmlBackend() as backend:
        assert backend.nvml is nvml_lite  # the default really is the lite binding
        lite = _read(backend)
    with NvmlBackend(nvml=pynvml) as backend:
        theirs = _read(backend)

    for key in ("driver_version", "nvml_version", "cuda_driver_version", "topology"):
        assert lite[key] == theirs[key], key
    assert lite["missing_functions"] == theirs["missing_functions"]
    assert lite["error_fields"] == theirs["error_fields"]
    assert len(lite["gpus"]) == len(theirs["gpus"]) > 0
    for ours, other in zip(lite["gpus"], theirs["gpus"], strict=True):
        for key in STATIC:
            assert ours[key] == other[key], (ours["index"], key)
        for key in STATIC_PCIE:
            assert ours["pcie"][key] == other["pcie"][key], (ours["index"], key)
        assert len(ours["fans_pct"]) == len(other["fans_pct"])
        # Everything else changes from one read to the next, but what one
        # binding can read the other can too.
        for key, value in ours.items():
            if key not in STATIC and not isinstance(value, (dict, list)):
                assert (value is None) == (other[key] is None), (ours["index"], key)
        for key, value in ours["pcie"].items():
            assert (value is None) == (other["pcie"][key] is None), (ours["index"], key)
