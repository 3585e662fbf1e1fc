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

Meanwhile NVML (read here with pynvml) is sampled: temperature against the
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
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gpustation.runners import common
from gpustation.runs.metrics import MetricsWriter

PHASES = ("matmul", "memory", "pcie")

# Throttle ("clocks event") reason bits as NVML defines them, in words.
THROTTLE_REASONS = {
    0x1: "idle",
    0x2: "application clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}
THERMAL_BITS = 0x8 | 0x20 | 0x40 | 0x80
PATTERNS = ("zeros", "ones", "0xAA", "0x55", "index", "random")
_PATTERN_WORDS = {"zeros": 0, "ones": -1, "0xAA": -0x55555556, "0x55": 0x55555555}


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


# ----------------------------------------------------------------------------- NVML


@dataclass
class Monitor:
    """NVML readings of one GPU, sampled in a thread; every reading may be missing."""

    device: torch.device
    interval: float = 0.5
    available: bool = False
    reason: str = ""
    static: dict[str, Any] = field(default_factory=dict)
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    phase: str = "setup"
    samples: int = 0
    peak: dict[str, float] = field(default_factory=dict)
    throttled_s: dict[str, float] = field(default_factory=dict)
    pcie_under_load: list[tuple[int, int]] = field(default_factory=list)
    xids: list[int] = field(default_factory=list)
    last: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._events: Any = None
        self._lock = threading.Lock()
        if self.device.type != "cuda":
            self.reason = "no GPU (running on the CPU)"
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handle = self._handle()
        except Exception as exc:  # no pynvml, no driver, no handle
            self.reason = f"NVML not available ({type(exc).__name__}: {exc})"
            return
        self.available = True
        nv, h = self.nv, self.handle
        q = self._q
        self.static = {
            "name": q(nv.nvmlDeviceGetName, h),
            "power_limit_w": _milli(q(nv.nvmlDeviceGetEnforcedPowerLimit, h)),
            "slowdown_temp_c": q(
                nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            ),
            "max_sm_clock_mhz": q(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
            "max_mem_clock_mhz": q(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM),
            "pcie_gen_max": q(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
            "pcie_width_max": q(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
            "ecc_enabled": _ecc_on(q(nv.nvmlDeviceGetEccMode, h)),
        }
        try:
            self._events = nv.nvmlEventSetCreate()
            nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._events)
        except Exception:
            self._events = None
        self.static["xid_events_supported"] = self._events is not None

    def _handle(self) -> Any:
        props = torch.cuda.get_device_properties(self.device)
        uuid = getattr(props, "uuid", None)
        if uuid is not None:
            try:
                return self.nv.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            except Exception:
                pass
        bus = getattr(props, "pci_bus_id", None)
        if bus is not None:
            dom = getattr(props, "pci_domain_id", 0)
            dev = getattr(props, "pci_device_id", 0)
            return self.nv.nvmlDeviceGetHandleByPciBusId(f"{dom:08x}:{bus:02x}:{dev:02x}.0")
        return self.nv.nvmlDeviceGetHandleByIndex(self.device.index or 0)

    def _q(self, fn: Any, *a: Any) -> Any:
        try:
            return fn(*a)
        except Exception:
            return None

    def counters(self) -> dict[str, Any]:
        """ECC, remapped rows and throttle-violation counters (read before and after)."""
        if not self.available:
            return {}
        nv, h, q = self.nv, self.handle, self._q
        out: dict[str, Any] = {
            "ecc_corrected": q(nv.nvmlDeviceGetTotalEccErrors, h,
                               nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
            "ecc_uncorrected": q(nv.nvmlDeviceGetTotalEccErrors, h,
                                 nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
        }  # fmt: skip
        rows = q(nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            out.update(remapped_corrected=rows[0], remapped_uncorrected=rows[1],
                       remap_pending=bool(rows[2]), remap_failure=bool(rows[3]))  # fmt: skip
        for name, policy in (("power", "NVML_PERF_POLICY_POWER"),
                             ("thermal", "NVML_PERF_POLICY_THERMAL")):  # fmt: skip
            v = q(nv.nvmlDeviceGetViolationStatus, h, getattr(nv, policy, -1))
            out[f"violation_{name}_ns"] = getattr(v, "violationTime", None)
        return out

    def sample(self) -> dict[str, Any]:
        nv, h, q = self.nv, self.handle, self._q
        reasons = q(getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                    or nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)  # fmt: skip
        util = q(nv.nvmlDeviceGetUtilizationRates, h)
        return {
            "temp_c": q(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
            "power_w": _milli(q(nv.nvmlDeviceGetPowerUsage, h)),
            "sm_clock_mhz": q(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": q(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
            "throttle": reasons,
            "pcie_gen": q(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
            "pcie_width": q(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
            "util_pct": getattr(util, "gpu", None),
        }

    def start(self) -> None:
        self.before = self.counters()
        if self.available:
            self._thread = threading.Thread(target=self._run, name="burnin-nvml", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.after = self.counters()
        if self._events is not None:
            try:
                self.nv.nvmlEventSetFree(self._events)
            except Exception:
                pass

    def _run(self) -> None:
        prev = time.monotonic()
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            dt, prev = now - prev, now
            s = self.sample()
            self._poll_xids()
            with self._lock:
                self._add(s, dt)

    def _add(self, s: dict[str, Any], dt: float) -> None:
        self.samples += 1
        self.last = s
        for key in ("temp_c", "power_w", "sm_clock_mhz", "mem_clock_mhz"):
            v = s.get(key)
            if v is not None:
                self.peak[key] = max(self.peak.get(key, v), v)
        bits = s.get("throttle") or 0
        for bit, name in THROTTLE_REASONS.items():
            if bits & bit and bit not in (0x1,):
                self.throttled_s[name] = self.throttled_s.get(name, 0.0) + dt
        if self.phase == "pcie" and s.get("pcie_gen") and s.get("pcie_width"):
            self.pcie_under_load.append((s["pcie_gen"], s["pcie_width"]))

    def _poll_xids(self) -> None:
        if self._events is None:
            return
        for _ in range(16):
            try:
                data = self.nv.nvmlEventSetWait_v2(self._events, 0)
            except Exception:
                return
            self.xids.append(int(getattr(data, "eventData", 0)))


def _milli(v: Any) -> float | None:
    return None if v is None else round(v / 1000.0, 1)


def _ecc_on(mode: Any) -> bool | None:
    if mode is None:
        return None
    current = mode[0] if isinstance(mode, (list, tuple)) else mode
    return bool(current)


# ----------------------------------------------------------------------------- the tests


@dataclass
class Progress:
    """Reports a step each percent of the planned time (total_steps 100)."""

    metrics: Any
    args: argparse.Namespace
    total_s: float
    monitor: Monitor
    t0: float = field(default_factory=time.monotonic)
    step: int = 0

    def tick(self, phase: str, **values: Any) -> None:
        pct = int(100 * (time.monotonic() - self.t0) / max(self.total_s, 1e-9))
        current = max(1, min(100, pct))
        common.maybe_simulate_oom(self.args, current)
        if current <= self.step:
            return
        self.step = current
        s = self.monitor.last if self.monitor.available else {}
        self.metrics.log(
            step=current, total_steps=100, phase=phase,
            temp_c=s.get("temp_c"), power_w=s.get("power_w"), sm_clock_mhz=s.get("sm_clock_mhz"),
            **values,
        )  # fmt: skip


def pick_precision(args: argparse.Namespace, device: torch.device) -> str:
    if args.precision:
        return str(args.precision)
    if device.type != "cuda":
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def matmul_test(
    args: argparse.Namespace, device: torch.device, seconds: float, prog: Progress
) -> dict[str, Any]:
    prec = pick_precision(args, device)
    common.Precision(prec, device).apply_backend_flags()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(prec, torch.float32)
    n = args.matrix_size or (8192 if device.type == "cuda" else 128)
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    ref = a @ b
    # The reference itself against the CPU in fp32, on a block of rows (wrong ALUs
    # could agree with themselves).
    rows = min(n, 64)
    cpu = a[:rows].float().cpu() @ b.float().cpu()
    rel = ((ref[:rows].float().cpu() - cpu).abs().max() / cpu.abs().max().clamp_min(1e-9)).item()
    ref_ok = rel < (3e-2 if dtype != torch.float32 else 1e-3)
    out = torch.empty_like(ref)
    mismatches = torch.zeros((), dtype=torch.int64, device=device)
    products = 0
    common.sync(device)
    t0 = time.perf_counter()
    end = t0 + seconds
    batch = 8 if device.type == "cuda" else 1
    while True:
        for _ in range(batch):
            torch.matmul(a, b, out=out)
            mismatches += (out != ref).sum()
        products += batch
        now = time.perf_counter()
        if now >= end:
            break
        if device.type == "cuda" and products % (batch * 8) == 0:
            common.sync(device)
        el = max(now - t0, 1e-9)
        prog.tick("matmul", throughput=round(2 * n**3 * products / el / 1e12, 2), unit="TFLOP/s")
    common.sync(device)
    elapsed = time.perf_counter() - t0
    return {
        "precision": prec,
        "matrix_size": n,
        "products": products,
        "mismatches": int(mismatches.item()),
        "tflops": round(2 * n**3 * products / max(elapsed, 1e-9) / 1e12, 3),
        "reference_rel_err_vs_cpu": rel,
        "reference_ok": ref_ok,
        "seconds": round(elapsed, 2),
    }


def _fill(chunk: torch.Tensor, scratch: torch.Tensor, pattern: str, seed: int) -> torch.Tensor:
    """The expected words of ``pattern`` for this chunk (a constant, or ``scratch``)."""
    if pattern in _PATTERN_WORDS:
        return torch.full((), _PATTERN_WORDS[pattern], dtype=torch.int32, device=chunk.device)
    if pattern == "index":
        torch.arange(seed, seed + scratch.numel(), dtype=torch.int32, out=scratch)
        return scratch
    g = torch.Generator(device=chunk.device).manual_seed(seed)
    scratch.random_(generator=g)
    return scratch


def memory_test(
    args: argparse.Namespace, device: torch.device, seconds: float, prog: Progress
) -> dict[str, Any]:
    common.free_memory(device)  # the matmul phase's cached blocks
    chunk_words = (256 * 2**20 if device.type == "cuda" else 2**20) // 4
    if args.mem_mib:
        target = args.mem_mib * 2**20
    elif device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        target = int(free * args.mem_fraction)
    else:
        target = 16 * 2**20
    chunk_words = max(1024, min(chunk_words, target // 4 // 2))
    scratch = torch.empty(chunk_words, dtype=torch.int32, device=device)
    chunks: list[torch.Tensor] = []
    try:
        while (len(chunks) + 2) * chunk_words * 4 <= target:
            chunks.append(torch.empty(chunk_words, dtype=torch.int32, device=device))
    except torch.OutOfMemoryError:
        common.free_memory(device)  # the free figure moved: test what we got
    tested_bytes = (len(chunks) + 1) * chunk_words * 4
    errors = 0
    by_pattern: dict[str, int] = {p: 0 for p in PATTERNS}
    passes = 0
    moved = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while passes == 0 or time.perf_counter() < end:
        for pattern in PATTERNS:
            bad = torch.zeros((), dtype=torch.int64, device=device)
            for i, c in enumerate(chunks):
                c.copy_(_fill(c, scratch, pattern, 7919 * i + passes).expand_as(c))
            for i, c in enumerate(chunks):
                bad += (c != _fill(c, scratch, pattern, 7919 * i + passes)).sum()
            n_bad = int(bad.item())
            by_pattern[pattern] += n_bad
            errors += n_bad
            moved += 2 * len(chunks) * chunk_words * 4
            el = max(time.perf_counter() - t0, 1e-9)
            prog.tick("memory", mem_errors=errors, mem_gbs=round(moved / el / 1e9, 1))
            if passes and time.perf_counter() >= end:
                break
        passes += 1
    elapsed = time.perf_counter() - t0
    del chunks, scratch
    common.free_memory(device)
    return {
        "tested_mib": round(tested_bytes / 2**20, 1),
        "passes": passes,
        "errors": errors,
        "errors_by_pattern": by_pattern,
        "gbs": round(moved / max(elapsed, 1e-9) / 1e9, 1),
        "seconds": round(elapsed, 2),
    }


def pcie_test(
    args: argparse.Namespace, device: torch.device, seconds: float, prog: Progress
) -> dict[str, Any]:
    cuda = device.type == "cuda"
    size = (args.copy_mib or (256 if cuda else 4)) * 2**20
    host = (torch.arange(size, dtype=torch.int32) % 251).to(torch.uint8)
    if cuda:
        host = host.pin_memory()
    # empty_like would give pageable memory: the device->host copies need pinned too.
    back = torch.empty(size, dtype=torch.uint8, pin_memory=cuda)
    dev = torch.empty(size, dtype=torch.uint8, device=device)
    h2d_s = d2h_s = 0.0
    rounds = 0
    errors = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    while rounds == 0 or time.perf_counter() < end:
        if cuda:
            e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            e[0].record()
            dev.copy_(host, non_blocking=True)
            e[1].record()
            back.copy_(dev, non_blocking=True)
            e[2].record()
            e[2].synchronize()
            h2d_s += e[0].elapsed_time(e[1]) / 1e3
            d2h_s += e[1].elapsed_time(e[2]) / 1e3
        else:
            a = time.perf_counter()
            dev.copy_(host)
            b = time.perf_counter()
            back.copy_(dev)
            h2d_s += b - a
            d2h_s += time.perf_counter() - b
        rounds += 1
        if rounds % 4 == 1:  # checking every round would halve the load
            errors += int((back != host).sum().item())
            back.zero_()
        prog.tick("pcie", copy_errors=errors,
                  h2d_gbs=round(size * rounds / max(h2d_s, 1e-9) / 1e9, 2))  # fmt: skip
    elapsed = time.perf_counter() - t0
    return {
        "buffer_mib": size // 2**20,
        "rounds": rounds,
        "errors": errors,
        "h2d_gbs": round(size * rounds / max(h2d_s, 1e-9) / 1e9, 2),
        "d2h_gbs": round(size * rounds / max(d2h_s, 1e-9) / 1e9, 2),
        "pinned": cuda,
        "seconds": round(elapsed, 2),
    }


# ----------------------------------------------------------------------------- verdicts


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
                     "clocks"):  # fmt: skip
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
    thermal_s = sum(v for k, v in mon.throttled_s.items() if "thermal" in k or "slowdown" in k)
    peak_t, slow = mon.peak.get("temp_c"), st.get("slowdown_temp_c")
    out.append(check(
        "thermal", "warn" if thermal_s > 0 else "pass",
        f"peak {peak_t} °C (slowdown at {slow} °C); thermal or hardware slowdown for "
        f"{thermal_s:.0f} s" + (": check airflow, fans and the paste" if thermal_s > 0 else ""),
    ))  # fmt: skip
    cap_s = mon.throttled_s.get("software power cap", 0.0)
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
        "peak_power_w": mon.peak.get("power_w"),
        "power_limit_w": st.get("power_limit_w"),
        "max_sm_clock_reached_mhz": mon.peak.get("sm_clock_mhz"),
        "max_sm_clock_mhz": st.get("max_sm_clock_mhz"),
        "max_mem_clock_reached_mhz": mon.peak.get("mem_clock_mhz"),
        "max_mem_clock_mhz": st.get("max_mem_clock_mhz"),
        "throttled_s": {k: round(v, 1) for k, v in mon.throttled_s.items()},
        "thermal_throttled_s": round(
            sum(v for k, v in mon.throttled_s.items() if "thermal" in k or "slowdown" in k), 1
        ) if mon.available else None,
        "power_capped_s": round(mon.throttled_s.get("software power cap", 0.0), 1)
        if mon.available else None,
        "power_violation_s": viol_s("violation_power_ns"),
        "thermal_violation_s": viol_s("violation_thermal_ns"),
        "nvml_samples": mon.samples,
    }  # fmt: skip


def cli(argv: Sequence[str] | None = None) -> int:
    return common.run_main(main, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(cli())
