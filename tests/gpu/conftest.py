"""Tests under tests/gpu need a real NVIDIA GPU; elsewhere they are skipped.

They only read: nothing here changes a card's settings.
"""

from __future__ import annotations

import pytest


def _nvml_ok() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        count: int = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return count > 0
    except Exception:
        return False


HAVE_GPU = _nvml_ok()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not HAVE_GPU:
                item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU with a driver"))
