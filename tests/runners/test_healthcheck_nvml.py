"""The healthcheck's NVML checks on the fake pynvml, through the query helper."""

from __future__ import annotations

import sys
from types import ModuleType

import pytest

from gpustation.runners.healthcheck import FAIL, PASS, nvml_checks


def test_the_driver_check_reads_the_versions_through_the_query_helper(
    fake_nvml: ModuleType,
) -> None:
    (check,), facts = nvml_checks(fake_nvml)
    assert check.status == PASS, check.detail
    assert facts == {
        "driver_version": "580.159.04",
        "nvml_version": "13.580.159.04",
        "driver_cuda_version": "13.0",
        "nvml_gpu_count": 2,
    }
    assert "driver 580.159.04 (supports CUDA up to 13.0)" in check.detail
    assert fake_nvml.DRIVER.initialized == 0  # the session is ended


def test_a_version_the_driver_will_not_give_fails_the_check_with_its_error(
    fake_nvml: ModuleType,
) -> None:
    fake_nvml.fail(None, "nvmlSystemGetNVMLVersion", fake_nvml.NVML_ERROR_UNKNOWN)
    (check,), facts = nvml_checks(fake_nvml)
    assert check.status == FAIL and check.fix
    assert "NVML n/a" in check.detail
    assert "nvml_version: nvmlSystemGetNVMLVersion: Unknown Error" in check.detail
    assert facts["driver_version"] == "580.159.04"  # the other readings still answer


def test_no_driver_and_no_binding_fail_with_their_fixes(
    fake_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml.reset(no_driver=True)
    (check,), _ = nvml_checks(fake_nvml)
    assert (check.name, check.status) == ("NVIDIA driver", FAIL)
    assert "Driver Not Loaded" in check.detail and "NVIDIA driver" in check.fix
    monkeypatch.setitem(sys.modules, "pynvml", None)  # ``import pynvml`` fails
    (check,), _ = nvml_checks()
    assert (check.name, check.status) == ("NVML library", FAIL)
    assert check.fix == "pip install nvidia-ml-py"
