"""Burn-in and acceptance test of a GPU: a new card, or a second-hand one.

For ``--minutes`` (split by ``--split``) it runs, in turn:

- matrix products in the card's fastest precision (bf16 where supported, else
  fp16; fp32 on the CPU), every result compared element by element against a
  product computed once at the start (gpu-burn's method: cuBLAS gives the same
  bits for the same inputs, so any difference is a fault); the reference is
  itself checked against the CPU once;
- a memory pattern test over ``--mem-fraction`` of the free memory: all
  zeros, all ones, 0xAA.., 0x55.., each word's own index and seeded random
  words are written to every chunk, then read back and counted wrong;
- a host<->device copy loop over PCIe from pinned memory, each round trip
  checked, with the bandwidth of each direction.

Meanwhile NVML (through the telemetry's query helper) is sampled: temperature against the
slowdown threshold, power against the enforced limit, SM and memory clocks
against their maximum, throttle reasons and the seconds each was active, the
PCIe link generation and width under load against the maximum, and XID
events; ECC and remapped-row counters are read before and after. The run ends
with a verdict per check in words (pass, warn, fail, info, n/a) and a summary
whose flat figures ``gpustation runs compare`` sets side by side for two
cards. It exits 1 when a check fails. Nothing is changed on the card.

Without NVML (or on the CPU, ``--device cpu --minutes 0.02`` for a smoke test)
the NVML checks are reported as not available.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from gpustation.runners.lib import common
from gpustation.runners.lib.burnin_monitor import Monitor
from gpustation.runners.lib.burnin_phases import (
    PATTERNS,
    Progress,
    matmul_test,
    memory_test,
    pcie_test,
)
from gpustation.runs.metrics import MetricsWriter

PHASES = ("matmul", "memory", "pcie")


def build_parser() -> argparse.ArgumentParser:
    parser = common.make_parser("burnin", __doc__)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the whole test")
    parser.add_argument(
        "--split",
        default="0.6,0.25,0.15",
        help="shares of the time for matmul, memory and pcie (comma-separated)",
    )
    parser.add_argument(
        "--precision",
        choices=common.PRECISIONS,
        default=None,
        help="matmul precision (default: the card's fastest: bf16, else fp16; fp32 on the CPU)",
    )
    parser.add_argument(
        "--matrix-size",
        type=int,
        default=0,
        help="matrix side (default: 8192 on a GPU, 128 on the CPU)",
    )
    parser.add_argument(
        "--mem-fraction", type=float, default=0.85, help="share of the free GPU memory tested"
    )
    parser.add_argument(
        "--mem-mib", type=int, default=0, help="memory tested, MiB (overrides --mem-fraction; "
        "default on the CPU: 16)"
    )  # fmt: skip
    parser.add_argument(
        "--copy-mib",
        type=int,
        default=0,
        help="buffer of the copy loop (default: 256 on a GPU, 4 on the CPU)",
    )
    parser.add_argument(
        "--sample-every", type=float, default=0.5, help="seconds between NVML samples"
    )
    return parser


# ----------------------------------------------------------------------------- verdicts


#: the memory's peak this close to its maximum makes the thermal check a warning
#: (the dashboard's memory alert uses the same distance)
MEMORY_NEAR_MAX_C = 5.0


def check(name: str, status: str, detail: str) -> dict[str, str]:
    return {"name": name, "status": status, "detail": detail}


def verdicts(
    mm: dict[str, Any], mem: dict[str, Any], pcie: dict[str, Any], mon: Monitor
) -> list[dict[str, str]]:
    out = []
    if mm["mismatches"] == 0 and mm["reference_ok"]:
        out.append(check("matmul results", "pass",
                         f"{mm['products']:,} {mm['precision']} products of {mm['matrix_size']}² "
                         f"all identical to the reference ({mm['tflops']:,.3g} TFLOP/s); the "
                         "reference agrees with the CPU"))  # fmt: skip
    else:
        why = []
        if mm["mismatches"]:
            why.append(f"{mm['mismatches']:,} elements differed from the reference over "
                       f"{mm['products']:,} products: the card computes wrong results")  # fmt: skip
        if not mm["reference_ok"]:
            why.append(
                f"the reference differs from the CPU by {mm['reference_rel_err_vs_cpu']:.2e}"
            )
        out.append(check("matmul results", "fail", "; ".join(why)))
    out.append(check(
        "memory patterns", "pass" if mem["errors"] == 0 else "fail",
        f"{mem['tested_mib'] / 1024:,.2f} GiB x {mem['passes']} pass(es) of {len(PATTERNS)} "
        f"patterns: {mem['errors']:,} wrong words"
        + ("" if not mem["errors"] else f" ({mem['errors_by_pattern']})"),
    ))  # fmt: skip
    out.append(check(
        "PCIe copies", "pass" if pcie["errors"] == 0 else "fail",
        f"{pcie['rounds']:,} round trips of {pcie['buffer_mib']} MiB, {pcie['errors']:,} "
        f"corrupted bytes; host->device {pcie['h2d_gbs']:,.1f} GB/s, device->host "
        f"{pcie['d2h_gbs']:,.1f} GB/s",
    ))  # fmt: skip
    if not mon.available:
        for name in ("PCIe link under load", "ECC errors", "XID errors", "thermal", "power",
                     "clocks", "NVML readings"):  # fmt: skip
            out.append(check(name, "n/a", mon.reason))
        return out
    st, b, a = mon.static, mon.before, mon.after
    gmax, wmax = st.get("pcie_gen_max"), st.get("pcie_width_max")
    if mon.pcie_under_load and gmax and wmax:
        gen = max(g for g, _ in mon.pcie_under_load)
        width = max(w for _, w in mon.pcie_under_load)
        ok = gen >= gmax and width >= wmax
        out.append(check("PCIe link under load", "pass" if ok else "warn",
                         f"Gen{gen} x{width} during the copies (card maximum Gen{gmax} x{wmax})"
                         + ("" if ok else ": a slower link than the card supports (riser, slot, "
                            "BIOS setting, or a dirty connector)")))  # fmt: skip
    else:
        out.append(check("PCIe link under load", "n/a", "the link was not read during the copies"))
    if st.get("ecc_enabled") is False:
        out.append(check("ECC errors", "n/a", "ECC is off on this card"))
    elif a.get("ecc_uncorrected") is None:
        out.append(check("ECC errors", "n/a", "the driver gives no ECC counters for this card"))
    else:
        dc = (a.get("ecc_corrected") or 0) - (b.get("ecc_corrected") or 0)
        du = (a.get("ecc_uncorrected") or 0) - (b.get("ecc_uncorrected") or 0)
        bad = du > 0 or a.get("remap_failure") or a.get("remap_pending")
        status = "fail" if bad else ("warn" if dc > 0 else "pass")
        out.append(check("ECC errors", status,
                         f"{dc} new corrected, {du} new uncorrected during the run (totals "
                         f"{a.get('ecc_corrected')} / {a.get('ecc_uncorrected')}); remapped rows "
                         f"{a.get('remapped_corrected', 'n/a')} corrected / "
                         f"{a.get('remapped_uncorrected', 'n/a')} uncorrected"
                         + (", a row remap is pending (reset the GPU when idle)"
                            if a.get("remap_pending") else "")
                         + (", row remapping FAILED" if a.get("remap_failure") else "")
                         ))  # fmt: skip
    if not st.get("xid_events_supported"):
        out.append(check("XID errors", "n/a", "XID events cannot be registered here"))
    else:
        out.append(
            check(
                "XID errors",
                "fail" if mon.xids else "pass",
                f"{len(mon.xids)} critical XID event(s)"
                + (f": {sorted(set(mon.xids))} (see the kernel log)" if mon.xids else ""),
            )
        )
    thermal_s = mon.thermal_s()
    peak_t, slow = mon.peak.get("temp_c"), st.get("slowdown_temp_c")
    peak_mem, mem_max = mon.peak.get("memory_temp_c"), st.get("memory_max_c")
    mem_hot = (
        peak_mem is not None and mem_max is not None and (peak_mem >= mem_max - MEMORY_NEAR_MAX_C)
    )
    memory = (
        f"; memory peak {peak_mem:.0f} °C (max {mem_max} °C)"
        + (": the HBM neared its limit, check the airflow" if mem_hot else "")
        if peak_mem is not None
        else ""
    )
    out.append(check(
        "thermal", "warn" if thermal_s > 0 or mem_hot else "pass",
        f"peak {peak_t} °C (slowdown at {slow} °C); thermal or hardware slowdown for "
        f"{thermal_s:.0f} s" + (": check airflow, fans and the paste" if thermal_s > 0 else "")
        + memory,
    ))  # fmt: skip
    cap_s = mon.throttled_s.get("sw_power_cap", 0.0)
    out.append(check(
        "power", "info",
        f"peak {mon.peak.get('power_w')} W of the {st.get('power_limit_w')} W limit; at the "
        f"power cap for {cap_s:.0f} s (normal under a burn-in)",
    ))  # fmt: skip
    out.append(check(
        "clocks", "info",
        f"SM up to {mon.peak.get('sm_clock_mhz')} MHz (max {st.get('max_sm_clock_mhz')}), memory "
        f"up to {mon.peak.get('mem_clock_mhz')} MHz (max {st.get('max_mem_clock_mhz')})",
    ))  # fmt: skip
    errors = mon.errors()
    out.append(check(
        "NVML readings", "warn" if errors else "pass",
        f"{len(errors)} reading(s) failed: " + "; ".join(errors) if errors
        else "every reading answered (or the card does not support it)",
    ))  # fmt: skip
    return out


# ----------------------------------------------------------------------------- main


def parse_split(text: str) -> list[float]:
    try:
        parts = [float(x) for x in text.split(",")]
    except ValueError:
        parts = []
    if len(parts) != 3 or any(p < 0 for p in parts) or sum(parts) <= 0:
        raise common.RunnerError(
            f"--split {text!r}: three non-negative shares for matmul,memory,pcie", common.EXIT_USAGE
        )
    total = sum(parts)
    return [p / total for p in parts]


def main(args: argparse.Namespace) -> int:
    device = common.pick_device(args.device)
    if args.minutes <= 0:
        raise common.RunnerError("--minutes must be positive", common.EXIT_USAGE)
    split = parse_split(args.split)
    total_s = args.minutes * 60
    common.seed_everything(args.seed)
    monitor = Monitor(device, interval=max(0.05, args.sample_every))
    print(
        f"burnin: {common.device_label(device)} for {args.minutes:g} min "
        f"(matmul {split[0]:.0%}, memory {split[1]:.0%}, pcie {split[2]:.0%}); NVML: "
        + ("yes" if monitor.available else monitor.reason),
        flush=True,
    )
    metrics = MetricsWriter.from_env()
    with metrics:
        prog = Progress(metrics, args, total_s, monitor)
        monitor.start()
        results: dict[str, dict[str, Any]] = {}
        try:
            for phase, share, fn in zip(PHASES, split, (matmul_test, memory_test, pcie_test),
                                        strict=True):  # fmt: skip
                monitor.phase = phase
                results[phase] = fn(args, device, total_s * share, prog)
                print(f"{phase}: {results[phase]}", flush=True)
        finally:
            monitor.stop()
        checks = verdicts(results["matmul"], results["memory"], results["pcie"], monitor)
        failed = [c for c in checks if c["status"] == "fail"]
        summary = _summary(results, monitor, checks, device, time.monotonic() - prog.t0)
        metrics.summary(**summary)
    print("\nchecks:")
    for c in checks:
        print(f"  {c['status'].upper():<5} {c['name']}: {c['detail']}")
    print(
        f"\nburn-in {'FAILED: ' + ', '.join(c['name'] for c in failed) if failed else 'passed'}"
        f" ({summary['seconds']:.0f} s)",
        flush=True,
    )
    return common.EXIT_FAILED if failed else common.EXIT_OK


def _summary(
    r: dict[str, dict[str, Any]], mon: Monitor, checks: list[dict[str, str]],
    device: torch.device, seconds: float,
) -> dict[str, Any]:  # fmt: skip
    mm, mem, pc = r["matmul"], r["memory"], r["pcie"]
    st, b, a = mon.static, mon.before, mon.after

    def delta(key: str) -> int | None:
        if a.get(key) is None or b.get(key) is None:
            return None
        return int(a[key] - b[key])

    def viol_s(key: str) -> float | None:
        d = delta(key)
        return None if d is None else round(d / 1e9, 1)

    gen = max((g for g, _ in mon.pcie_under_load), default=None)
    width = max((w for _, w in mon.pcie_under_load), default=None)
    return {
        "result": "fail" if any(c["status"] == "fail" for c in checks) else "pass",
        "checks": checks,
        "device": str(device),
        "gpu": st.get("name"),
        "nvml": mon.available,
        "seconds": round(seconds, 1),
        "matmul_precision": mm["precision"],
        "matmul_tflops": mm["tflops"],
        "matmul_products": mm["products"],
        "matmul_mismatches": mm["mismatches"],
        "memory_tested_mib": mem["tested_mib"],
        "memory_errors": mem["errors"],
        "memory_gbs": mem["gbs"],
        "copy_errors": pc["errors"],
        "h2d_gbs": pc["h2d_gbs"],
        "d2h_gbs": pc["d2h_gbs"],
        "pcie_gen_under_load": gen,
        "pcie_width_under_load": width,
        "pcie_gen_max": st.get("pcie_gen_max"),
        "pcie_width_max": st.get("pcie_width_max"),
        "ecc_corrected_new": delta("ecc_corrected"),
        "ecc_uncorrected_new": delta("ecc_uncorrected"),
        "ecc_before": {k: v for k, v in b.items() if not k.startswith("violation")} or None,
        "ecc_after": {k: v for k, v in a.items() if not k.startswith("violation")} or None,
        "xid_events": len(mon.xids) if st.get("xid_events_supported") else None,
        "xids": sorted(set(mon.xids)),
        "peak_temp_c": mon.peak.get("temp_c"),
        "slowdown_temp_c": st.get("slowdown_temp_c"),
        "peak_memory_temp_c": mon.peak.get("memory_temp_c"),
        "memory_temp_max_c": st.get("memory_max_c"),
        "peak_power_w": mon.peak.get("power_w"),
        "power_limit_w": st.get("power_limit_w"),
        "max_sm_clock_reached_mhz": mon.peak.get("sm_clock_mhz"),
        "max_sm_clock_mhz": st.get("max_sm_clock_mhz"),
        "max_mem_clock_reached_mhz": mon.peak.get("mem_clock_mhz"),
        "max_mem_clock_mhz": st.get("max_mem_clock_mhz"),
        "throttled_s": {k: round(v, 1) for k, v in mon.throttled_s.items()},
        "thermal_throttled_s": round(mon.thermal_s(), 1) if mon.available else None,
        "power_capped_s": round(mon.throttled_s.get("sw_power_cap", 0.0), 1)
        if mon.available else None,
        "power_violation_s": viol_s("violation_power_ns"),
        "thermal_violation_s": viol_s("violation_thermal_ns"),
        "nvml_samples": mon.samples,
        "nvml_errors": mon.errors() if mon.available else [],
    }  # fmt: skip


def cli(argv: Sequence[str] | None = None) -> int:
    return common.run_main(main, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(cli())
