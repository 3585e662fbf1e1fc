"""The burn-in runner's tiny CPU run, and its verdicts on faults it cannot cause here."""

from __future__ import annotations

import argparse
from types import ModuleType
from typing import Any

import torch

from gpustation.runners import burnin
from gpustation.runners.lib import burnin_monitor
from tests.runners.conftest import RunInprocess, RunRunner


def test_tiny_cpu_burnin_passes_and_says_nvml_is_not_available(run_runner: RunRunner) -> None:
    r = run_runner("burnin", "--device", "cpu", "--minutes", "0.02")
    assert r.returncode == 0, r.stderr[-3000:]
    s = r.summary
    assert s["result"] == "pass" and s["nvml"] is False
    assert s["matmul_products"] > 0 and s["matmul_mismatches"] == 0
    assert s["memory_tested_mib"] > 0 and s["memory_errors"] == 0
    assert s["copy_errors"] == 0 and s["h2d_gbs"] > 0 and s["d2h_gbs"] > 0
    by_name = {c["name"]: c for c in s["checks"]}
    for name in ("matmul results", "memory patterns", "PCIe copies"):
        assert by_name[name]["status"] == "pass", by_name[name]
    for name in ("PCIe link under load", "ECC errors", "XID errors", "thermal", "power"):
        assert by_name[name]["status"] == "n/a" and "CPU" in by_name[name]["detail"]
    assert s["peak_temp_c"] is None and s["xid_events"] is None
    phases = [e["phase"] for e in r.steps]
    assert phases[0] == "matmul" and set(phases) <= {"matmul", "memory", "pcie"}
    assert all(e["total_steps"] == 100 for e in r.steps)
    assert "burn-in passed" in r.stdout


def _results(
    mismatches: int = 0, mem_errors: int = 0
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    mm = {"mismatches": mismatches, "reference_ok": True, "products": 10, "precision": "bf16",
          "matrix_size": 64, "tflops": 1.0, "reference_rel_err_vs_cpu": 0.0}  # fmt: skip
    mem = {"errors": mem_errors, "tested_mib": 1024.0, "passes": 1,
           "errors_by_pattern": {"0xAA": mem_errors}}  # fmt: skip
    pcie = {"errors": 0, "rounds": 3, "buffer_mib": 4, "h2d_gbs": 50.0, "d2h_gbs": 50.0}
    return mm, mem, pcie


def test_wrong_results_and_memory_errors_fail() -> None:
    mon = burnin_monitor.Monitor(torch.device("cpu"))
    checks = {c["name"]: c for c in burnin.verdicts(*_results(3, 5), mon)}
    assert checks["matmul results"]["status"] == "fail"
    assert "3 elements differed" in checks["matmul results"]["detail"]
    assert (
        checks["memory patterns"]["status"] == "fail"
        and "5 wrong" in (checks["memory patterns"]["detail"])
    )


def test_nvml_readings_become_throttle_seconds_link_and_ecc_verdicts() -> None:
    mon = burnin_monitor.Monitor(torch.device("cpu"))
    mon.available = True
    mon.static = {"pcie_gen_max": 5, "pcie_width_max": 16, "ecc_enabled": True,
                  "xid_events_supported": True, "slowdown_temp_c": 87,
                  "power_limit_w": 700.0}  # fmt: skip
    mon.before = {"ecc_corrected": 1, "ecc_uncorrected": 0}
    mon.after = {"ecc_corrected": 4, "ecc_uncorrected": 0}
    mon.phase = "pcie"
    for _ in range(4):  # power-capped and thermally slowed, link trained down to Gen4 x8
        mon._add({"temp_c": 88, "power_w": 690.0, "throttle": ["sw_power_cap", "hw_thermal"],
                  "pcie_gen": 4, "pcie_width": 8, "sm_clock_mhz": 1700}, 0.5)  # fmt: skip
    checks = {c["name"]: c for c in burnin.verdicts(*_results(), mon)}
    assert mon.throttled_s == {"sw_power_cap": 2.0, "hw_thermal": 2.0}
    assert checks["PCIe link under load"]["status"] == "warn"
    assert "Gen4 x8" in checks["PCIe link under load"]["detail"]
    assert (
        checks["ECC errors"]["status"] == "warn"
        and "3 new corrected" in (checks["ECC errors"]["detail"])
    )
    assert checks["thermal"]["status"] == "warn" and "88 °C" in checks["thermal"]["detail"]
    assert checks["XID errors"]["status"] == "pass"
    mon.xids.append(79)
    mon.after["ecc_uncorrected"] = 1
    checks = {c["name"]: c for c in burnin.verdicts(*_results(), mon)}
    assert checks["XID errors"]["status"] == "fail" and "79" in checks["XID errors"]["detail"]
    assert checks["ECC errors"]["status"] == "fail"


def test_split_must_be_three_shares(run_inprocess: RunInprocess) -> None:
    r = run_inprocess("burnin", "--device", "cpu", "--minutes", "0.01", "--split", "1,2")
    assert r.returncode == 2 and "--split" in r.stderr
    assert burnin.parse_split("2,1,1") == [0.5, 0.25, 0.25]
    assert isinstance(burnin.build_parser().parse_args([]), argparse.Namespace)


def test_the_thermal_check_names_the_memory_peak_and_warns_near_its_maximum() -> None:
    mon = burnin_monitor.Monitor(torch.device("cpu"))
    mon.available = True
    mon.static = {"slowdown_temp_c": 89, "memory_max_c": 95, "xid_events_supported": True}
    for temp in (60.0, 82.0, 79.0):
        mon._add({"temp_c": 70, "memory_temp_c": temp, "throttle": 0}, 0.5)
    thermal = {c["name"]: c for c in burnin.verdicts(*_results(), mon)}["thermal"]
    assert thermal["status"] == "pass" and "memory peak 82 °C (max 95 °C)" in thermal["detail"]
    mon._add({"temp_c": 70, "memory_temp_c": 91.0, "throttle": 0}, 0.5)
    thermal = {c["name"]: c for c in burnin.verdicts(*_results(), mon)}["thermal"]
    assert thermal["status"] == "warn" and "HBM neared its limit" in thermal["detail"]


def test_a_gddr_card_has_no_memory_words_in_the_thermal_check() -> None:
    mon = burnin_monitor.Monitor(torch.device("cpu"))
    mon.available = True
    mon.static = {"slowdown_temp_c": 87, "memory_max_c": None}
    mon._add({"temp_c": 70, "memory_temp_c": None, "throttle": 0}, 0.5)
    thermal = {c["name"]: c for c in burnin.verdicts(*_results(), mon)}["thermal"]
    assert thermal["status"] == "pass" and "memory" not in thermal["detail"]


def test_the_monitor_reads_hbm_temperature_as_a_field_value(fake_nvml: ModuleType) -> None:
    for index, want in ((1, 40.0), (0, None)):  # an H200, then an RTX 4090
        card = burnin_monitor.Card(index=index)
        mon = burnin_monitor.Monitor(torch.device("cpu"), nvml=fake_nvml, card=card)
        try:
            assert mon.available, mon.reason
            mon.static = {"memory_max_c": 95}  # the field's own status decides
            assert mon._memory_temp() == want
        finally:
            mon.stop()
