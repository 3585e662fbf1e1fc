"""Matrix-multiply throughput per precision and the device's copy bandwidth.

Measures ``torch.matmul`` of square N x N matrices for fp32, tf32, fp16 and
bf16 (and fp8 through ``torch._scaled_mm`` where the card and torch support it)
over a set of sizes, and the memory bandwidth of a device-to-device copy. The
table shows what each number format is worth on this card: the ceiling for any
model whose time goes into matrix products.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from gpustation.runners.lib import common
from gpustation.runs.metrics import MetricsWriter

ALL_PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")


def build_parser() -> argparse.ArgumentParser:
    parser = common.make_parser("matmul", __doc__)
    parser.add_argument(
        "--sizes",
        type=common.parse_int_list,
        default=[2048, 4096, 8192, 16384],
        help="comma-separated matrix sizes N (N x N times N x N)",
    )
    parser.add_argument(
        "--precisions",
        default="fp32,tf32,fp16,bf16,fp8",
        help="comma-separated subset of " + ",".join(ALL_PRECISIONS),
    )
    parser.add_argument(
        "--steps", type=int, default=0, help="timed multiplies per point (0: about --seconds)"
    )
    parser.add_argument(
        "--seconds", type=float, default=0.5, help="time spent per point when --steps is 0"
    )
    parser.add_argument(
        "--copy-mib", type=int, default=1024, help="size of the buffer copied for bandwidth"
    )
    return parser


def fp8_supported(device: torch.device) -> tuple[bool, str]:
    """Whether fp8 matmuls can run here, and why not."""
    if device.type != "cuda":
        return False, "fp8 matmul needs a CUDA GPU"
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return False, f"torch {torch.__version__} has no fp8 matmul"
    if torch.cuda.get_device_capability(device) < (8, 9):
        return False, "fp8 tensor cores need compute capability 8.9 (Ada) or newer"
    return True, ""


def _operation(precision: str, n: int, device: torch.device) -> Callable[[], Any]:
    """A zero-argument function doing one N x N x N product in ``precision``."""
    g = torch.Generator(device=device).manual_seed(n)
    if precision == "fp8":
        a = torch.randn(n, n, device=device, generator=g).to(torch.float8_e4m3fn)
        # _scaled_mm wants its second operand column-major.
        b = torch.randn(n, n, device=device, generator=g).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    return lambda: torch.matmul(a, b)


def time_op(
    op: Callable[[], Any], device: torch.device, steps: int, seconds: float
) -> tuple[float, int]:
    """Seconds per call of ``op`` (after warm-up) and the number of calls timed."""
    for _ in range(3):
        op()
    common.sync(device)
    if steps <= 0:
        # Calibrate: enough calls to fill about `seconds`, at least 5.
        t0 = time.perf_counter()
        op()
        common.sync(device)
        one = max(time.perf_counter() - t0, 1e-6)
        steps = max(5, min(2000, int(seconds / one)))
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            op()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / steps, steps
    t0 = time.perf_counter()
    for _ in range(steps):
        op()
    return (time.perf_counter() - t0) / steps, steps


def matmul_tflops(
    precision: str, n: int, device: torch.device, steps: int = 0, seconds: float = 0.5
) -> float:
    """Achieved TFLOP/s of one precision at one size (2·N³ FLOPs per product)."""
    common.Precision("tf32" if precision == "tf32" else "fp32", device).apply_backend_flags()
    op = _operation(precision, n, device)
    per_call, _ = time_op(op, device, steps, seconds)
    return 2 * n**3 / per_call / 1e12


def copy_bandwidth_gbs(device: torch.device, mib: int, steps: int = 0) -> float:
    """GB/s of a device-to-device copy (bytes read plus bytes written)."""
    n = mib * 2**20 // 4
    src = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    per_call, _ = time_op(lambda: dst.copy_(src), device, steps, 0.3)
    return 2 * src.numel() * 4 / per_call / 1e9


def main(args: argparse.Namespace) -> int:
    device = common.pick_device(args.device)
    wanted = [p.strip() for p in args.precisions.split(",") if p.strip()]
    bad = [p for p in wanted if p not in ALL_PRECISIONS]
    if bad:
        raise common.RunnerError(
            f"unknown precision(s) {bad}; choose from {','.join(ALL_PRECISIONS)}", 2
        )
    fp8_ok, fp8_why = fp8_supported(device)
    print(f"matmul: {common.device_label(device)}, sizes {args.sizes}, precisions {wanted}")
    if "fp8" in wanted and not fp8_ok:
        print(f"  fp8 skipped: {fp8_why}")
    metrics = MetricsWriter.from_env()
    table: dict[str, dict[str, float | None]] = {}
    points = [(p, n) for p in wanted for n in args.sizes]
    with metrics:
        for i, (prec, n) in enumerate(points, 1):
            common.maybe_simulate_oom(args, i)
            table.setdefault(prec, {})
            if prec == "fp8" and not fp8_ok:
                table[prec][str(n)] = None
                continue
            try:
                tflops: float | None = matmul_tflops(prec, n, device, args.steps, args.seconds)
            except Exception as exc:
                if common.is_oom(exc):
                    common.free_memory(device)
                    print(f"  {prec} N={n}: out of memory, skipped")
                    tflops = None
                elif prec == "fp8":
                    print(f"  fp8 N={n}: failed ({type(exc).__name__}: {exc}), skipped")
                    tflops = None
                else:
                    raise
            table[prec][str(n)] = tflops
            metrics.log(
                step=i,
                total_steps=len(points),
                throughput=tflops,
                unit="TFLOP/s",
                precision=prec,
                size=n,
            )
            if tflops is not None:
                print(f"  {prec:>4} N={n:<6} {tflops:9.2f} TFLOP/s", flush=True)
        common.Precision("fp32", device).apply_backend_flags()
        bandwidth = copy_bandwidth_gbs(device, args.copy_mib if device.type == "cuda" else 64)
        best = {
            p: max((v for v in row.values() if v is not None), default=None)
            for p, row in table.items()
        }
        fp32_best = best.get("fp32")
        metrics.summary(
            tflops=table,
            best_tflops=best,
            speedup_vs_fp32={
                p: (v / fp32_best if v and fp32_best else None) for p, v in best.items()
            },
            copy_bandwidth_gbs=round(bandwidth, 1),
            sizes=args.sizes,
            device=str(device),
            device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            **{f"{p}_tflops": v for p, v in best.items()},
        )
    print()
    rows = []
    for p, row in table.items():
        cells = [_fmt(v) for v in row.values()]
        b = best[p]
        speed = f"{b / fp32_best:.1f}x" if b and fp32_best else "n/a"
        rows.append([p, *cells, _fmt(b), speed])
    common.print_table(
        ["precision", *[f"N={n}" for n in args.sizes], "best TFLOP/s", "vs fp32"], rows
    )
    print(f"\ndevice copy bandwidth: {bandwidth:,.0f} GB/s (read + write)")
    common.print_limits(_limits(best, device, fp8_ok, fp8_why))
    return common.EXIT_OK


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.1f}" if v >= 10 else f"{v:.3g}"


def _limits(
    best: dict[str, float | None], device: torch.device, fp8_ok: bool, fp8_why: str
) -> list[str]:
    tips = []
    if device.type == "cpu":
        tips.append("running on the CPU: figures say nothing about a GPU")
    fast = max(best, key=lambda p: best[p] or 0.0) if best else None
    if fast:
        tips.append(
            f"{fast} is the fastest format here; models spending their time in matmuls "
            f"gain most by training in it (bf16 autocast needs no loss scaling)"
        )
    if (fp32 := best.get("fp32")) and (tf32 := best.get("tf32")) and tf32 > 1.5 * fp32:
        tips.append(
            "fp32 code leaves speed unused: torch.set_float32_matmul_precision('high') "
            "turns on TF32"
        )
    if not fp8_ok:
        tips.append(f"no fp8: {fp8_why}")
    tips.append(
        "small sizes cannot fill the GPU: the rate at the largest N is the card's ceiling; "
        "if it is far below the data sheet, check power limit and clocks for throttling"
    )
    return tips


def cli(argv: Sequence[str] | None = None) -> int:
    return common.run_main(main, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(cli())
