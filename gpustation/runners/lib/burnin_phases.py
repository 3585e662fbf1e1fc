"""The burn-in's three phases, each run for its share of the time: matrix products
checked against a reference, a memory pattern test, and a host<->device copy loop,
with the progress they report as they go.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from gpustation.runners.lib import common
from gpustation.runners.lib.burnin_monitor import Monitor

PATTERNS = ("zeros", "ones", "0xAA", "0x55", "index", "random")
_PATTERN_WORDS = {"zeros": 0, "ones": -1, "0xAA": -0x55555556, "0x55": 0x55555555}


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
