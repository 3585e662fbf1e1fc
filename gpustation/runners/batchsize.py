"""The largest batch of the resnet or lora workload that fits in memory.

Starts at ``--batch-size``, doubles it until a training step runs out of
memory (or ``--max-batch-size`` is reached), then bisects between the last
size that fitted and the first that did not. After each out-of-memory error
the cached memory is released so the next attempt starts clean. Every option
of the chosen workload is accepted too (``--precision``, ``--image-size``,
``--seq-len``, ``--gradient-checkpointing`` ...), e.g.::

    python -m gpustation.runners.batchsize --workload lora --seq-len 1024
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

WORKLOADS = ("resnet", "lora")


def build_parser(workload: str = "resnet") -> argparse.ArgumentParser:
    """The workload's own parser plus the search options."""
    if workload == "resnet":
        # start-up time: each workload loads only its own runner
        from gpustation.runners import resnet

        parser = resnet.build_parser()
        parser.set_defaults(batch_size=32, steps=3, compile=False)
    else:
        # start-up time: each workload loads only its own runner
        from gpustation.runners import lora

        parser = lora.build_parser()
        parser.set_defaults(batch_size=4, steps=3, compile=False)
    parser.prog = "python -m gpustation.runners.batchsize"
    parser.description = __doc__
    parser.add_argument(
        "--workload", choices=WORKLOADS, default="resnet", help="what to find the batch for"
    )
    parser.add_argument(
        "--max-batch-size", type=int, default=4096, help="stop doubling at this batch"
    )
    parser.add_argument(
        "--multiple-of", type=int, default=8, help="bisect to a multiple of this (1: exact)"
    )
    parser.add_argument(
        "--memory-fraction",
        type=float,
        default=None,
        help="cap this process at a fraction of GPU memory (leaves headroom for others)",
    )
    # Hidden: on a CPU nothing runs out of memory; this makes the search testable.
    parser.add_argument("--simulate-oom-above", type=int, default=None, help=argparse.SUPPRESS)
    parser.set_defaults(save_adapter=False, verify_adapter=False)
    return parser


def _resnet_trial(args: argparse.Namespace, device: torch.device) -> Callable[[int], None]:
    # start-up time: each workload loads only its own runner
    from gpustation.runners import resnet

    trainer = resnet.make_trainer(args, device)

    def run(batch: int) -> None:
        images, labels = next(resnet.synthetic_batches(args, device, batch))
        for step in range(1, args.steps + 1):
            common.maybe_simulate_oom(args, step)
            trainer.step(images, labels)

    return run


def _lora_trial(args: argparse.Namespace, device: torch.device) -> Callable[[int], None]:
    # start-up time: each workload loads only its own runner
    from gpustation.runners import lora

    prec = common.Precision(args.precision, device)
    prec.apply_backend_flags()
    model, _ = lora.prepare_model(args, device)
    model.train()
    if args.compile:
        model = torch.compile(model)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr)
    vocab = model.config.vocab_size if hasattr(model, "config") else 256
    accum = max(1, args.grad_accum)

    def run(batch: int) -> None:
        x = torch.randint(0, min(vocab, 256), (batch, args.seq_len), device=device)
        for step in range(1, args.steps + 1):
            common.maybe_simulate_oom(args, step)
            for xm in x.chunk(accum):
                with prec.autocast():
                    loss = model(input_ids=xm, labels=xm).loss / accum
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    return run


def search(
    try_batch: Callable[[int], bool], start: int, limit: int, multiple: int
) -> tuple[int, list[int]]:
    """Largest batch in [1, limit] for which ``try_batch`` is True, and the sizes tried.

    Doubles from ``start`` until a failure, then bisects. When ``start`` itself
    fails, halves down first. Returns 0 when even a batch of 1 fails.
    """
    tried: list[int] = []

    def attempt(b: int) -> bool:
        tried.append(b)
        return try_batch(b)

    good, bad = 0, None
    b = max(1, min(start, limit))
    while True:
        if attempt(b):
            good = b
            if b >= limit:
                return good, tried
            b = min(b * 2, limit)
        else:
            bad = b
            if good or b == 1:
                break
            b = max(1, b // 2)
            if b == bad:
                break
    if not good:
        return 0, tried
    assert bad is not None
    step = max(1, multiple)
    while bad - good > step:
        mid = (good + bad) // 2
        if step > 1:
            mid = max(good + step, mid - mid % step)
            if mid >= bad:
                break
        if attempt(mid):
            good = mid
        else:
            bad = mid
    return good, tried


def main(args: argparse.Namespace) -> int:
    device = common.pick_device(args.device)
    common.seed_everything(args.seed)
    if device.type == "cuda" and args.memory_fraction:
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction, device)
    build = _resnet_trial if args.workload == "resnet" else _lora_trial
    what = (
        f"{args.model} {args.image_size}px"
        if args.workload == "resnet"
        else f"{args.model or 'preset ' + args.model_preset} x {args.seq_len} tokens"
    )
    print(
        f"batchsize: largest {args.workload} batch ({what}, {args.precision}) on "
        f"{common.device_label(device)}, starting at {args.batch_size}",
        flush=True,
    )
    run = build(args, device)
    metrics = MetricsWriter.from_env()
    trials: list[dict[str, Any]] = []

    def try_batch(batch: int) -> bool:
        common.free_memory(device)
        common.reset_peak_memory(device)
        t0 = time.perf_counter()
        ok = True
        error = ""
        try:
            run(batch)
            if args.simulate_oom_above is not None and batch > args.simulate_oom_above:
                raise torch.OutOfMemoryError(
                    f"simulated: batch {batch} > --simulate-oom-above {args.simulate_oom_above}"
                )
            common.sync(device)
        except Exception as exc:
            if not common.is_oom(exc):
                raise
            ok = False
            error = str(exc).splitlines()[0][:200]
        # The traceback holds the failed step's tensors; drop them before retrying.
        common.free_memory(device)
        trial: dict[str, Any] = {
            "batch_size": batch,
            "fits": ok,
            "mem_peak_mib": round(common.peak_memory_mib(device), 1),
            "seconds": round(time.perf_counter() - t0, 3),
        }
        if error:
            trial["error"] = error
        trials.append(trial)
        metrics.log(step=len(trials), **trial)
        print(
            f"  batch {batch:>5}: "
            + ("fits" if ok else "out of memory")
            + (f", peak {trial['mem_peak_mib']:,.0f} MiB" if ok else ""),
            flush=True,
        )
        return ok

    with metrics:
        best, _ = search(try_batch, args.batch_size, args.max_batch_size, args.multiple_of)
        fitted = [t for t in trials if t["fits"] and t["batch_size"] == best]
        summary: dict[str, Any] = {
            "largest_batch": best,
            "workload": args.workload,
            "trials": trials,
            "hit_limit": best >= args.max_batch_size,
            "mem_peak_mib": fitted[-1]["mem_peak_mib"] if fitted else None,
            "precision": args.precision,
            "device": str(device),
        }
        if device.type == "cuda":
            summary["mem_total_mib"] = torch.cuda.get_device_properties(device).total_memory / 2**20
        metrics.summary(**summary)
    if best == 0:
        raise torch.OutOfMemoryError("even a batch of 1 does not fit")
    print(f"\nlargest {args.workload} batch that fits: {best}")
    tips = [
        f"use --batch-size {best} at most; about {max(1, int(best * 0.9))} leaves headroom "
        "for memory fragmentation and other processes"
    ]
    if summary["hit_limit"]:
        tips.append(f"the search stopped at --max-batch-size {args.max_batch_size}")
    if args.precision in ("fp32", "tf32"):
        tips.append("--precision bf16 roughly halves activation memory: a larger batch fits")
    if args.workload == "lora" and not args.gradient_checkpointing:
        tips.append("--gradient-checkpointing fits a much larger batch, at ~30% less speed")
    common.print_limits(tips)
    return common.EXIT_OK


def _oom_hint(args: argparse.Namespace) -> str:
    return common.oom_advice(
        f"searching the {args.workload} batch size: even batch 1 does not fit",
        None,
        extra=["--gradient-checkpointing (lora) or a smaller --image-size / --seq-len"],
    )


def cli(argv: Sequence[str] | None = None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--workload", choices=WORKLOADS, default="resnet")
    known, _ = pre.parse_known_args(argv)
    return common.run_main(main, build_parser(known.workload), argv, oom_hint=_oom_hint)


if __name__ == "__main__":
    sys.exit(cli())
