"""Fixtures for the NVML backend tests: the fake ``pynvml`` in tests/fake_nvml."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

FAKE_NVML_DIR = Path(__file__).resolve().parent.parent / "fake_nvml"


def _load_fake() -> ModuleType:
    # Loaded from its file under its own name, so a real nvidia-ml-py imported
    # earlier in the session can never be picked up by mistake.
    name = "gpustation_tests_fake_pynvml"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, FAKE_NVML_DIR / "pynvml.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The fake pynvml, reset to its default RTX 4090 + H200 machine.

    It is also what ``import pynvml`` gives for the length of the test, so
    code that opens the backend itself (``open_backend()``, commands run
    in-process) meets the fake too, never a real GPU.
    """
    monkeypatch.delenv("FAKE_NVML_SCENARIO", raising=False)
    monkeypatch.syspath_prepend(str(FAKE_NVML_DIR))
    fake = _load_fake()
    fake.reset()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    yield fake
    fake.reset()
