"""Backends are opened through the registry, each only when it is tried."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpustation.errors import NoDriverError
from gpustation.telemetry import registry
from gpustation.telemetry.backend import Backend, OpenRequest, Registration
from gpustation.telemetry.nvml import NvmlBackend
from gpustation.telemetry.registry import open_backend
from gpustation.telemetry.sim import SimBackend
from tests.conftest import child_env

#: what the test backend below was asked, by this module's open_request
ASKED: list[OpenRequest] = []


def open_request(request: OpenRequest) -> Backend:
    """A backend of this test module: simulated cards, or absent when asked for 0."""
    ASKED.append(request)
    if request.simulate == 0:
        raise NoDriverError("the test vendor's library is not installed.")
    return SimBackend(count=1, card="h200", state_path=None)


def test_simulated_gpus_open_the_simulator_and_real_ones_nvml(
    gpustation_dirs: dict[str, Path], fake_nvml: ModuleType
) -> None:
    with open_backend(simulate=3, sim_card="h200") as sim:
        assert isinstance(sim, SimBackend) and sim.device_count() == 3
    with open_backend(one_shot=True) as real:
        assert isinstance(real, NvmlBackend) and real.device_count() == 2


def test_without_a_driver_the_simulator_stands_in_and_says_why(
    gpustation_dirs: dict[str, Path], fake_nvml: ModuleType
) -> None:
    fake_nvml.reset(no_driver=True)
    with open_backend(fallback_to_sim=True) as backend:
        assert isinstance(backend, SimBackend)
        assert backend.note is not None
        assert "Driver Not Loaded" in backend.note and "Showing simulated GPUs" in backend.note


def test_backends_are_tried_by_priority(
    gpustation_dirs: dict[str, Path], fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "_REGISTERED", list(registry._REGISTERED))
    ASKED.clear()
    registry.register(
        Registration(name="vendor2", priority=1, wanted=lambda r: True, module=__name__)
    )
    assert [r.name for r in registry.registrations()] == ["vendor2", "sim", "nvml"]
    with open_backend() as backend:  # the first in priority that serves the request
        assert isinstance(backend, SimBackend) and backend.spec.key == "h200"
    assert [OpenRequest(simulate=None, sim_card=None, one_shot=False)] == ASKED


def test_an_absent_backend_gives_way_to_the_next(
    gpustation_dirs: dict[str, Path], fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    absent = Registration(name="absent", priority=1, wanted=lambda r: True, module=__name__)
    nvml = next(r for r in registry._REGISTERED if r.name == "nvml")
    real = Registration(
        name=nvml.name, priority=nvml.priority, wanted=lambda r: True, module=nvml.module
    )
    monkeypatch.setattr(registry, "_REGISTERED", [absent, real])
    with open_backend(simulate=0) as backend:
        assert isinstance(backend, NvmlBackend)
    fake_nvml.reset(no_driver=True)
    with pytest.raises(NoDriverError, match="test vendor"):  # the first reason is told
        open_backend(simulate=0)
    monkeypatch.setattr(registry, "_REGISTERED", [])
    with pytest.raises(NoDriverError, match="no GPU backend serves"):
        open_backend()


def test_the_interface_and_the_registry_load_no_backend() -> None:
    code = (
        "import sys\n"
        "import gpustation.telemetry.registry\n"
        "print(sorted(m for m in sys.modules if m.startswith(('gpustation.telemetry.nvml',"
        " 'gpustation.telemetry.sim'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
