"""Text-generation benchmark: time to first token, per-token latency, request latency
percentiles and tokens/s over a sweep of batch sizes.

Uses the same default model as the lora runner (a Llama-style model built from
``--model-preset`` with random weights: the timings do not depend on the
weights) or a local Hugging Face checkpoint with ``--model PATH``. Each request
is one batch of prompts of ``--prompt-len`` tokens, decoded greedily for
``--new-tokens`` tokens with a key/value cache. ``--steps`` is the number of
timed requests per batch size.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from gpustation.runners.lib import common, llm
from gpustation.runs.metrics import MetricsWriter


def build_parser() -> argparse.ArgumentParser:
    parser = common.make_parser("infer", __doc__)
    common.add_training_args(
        parser, steps=20, batch_size=0, precision="bf16", compile_default=False
    )
    llm.add_model_args(parser)
    parser.set_defaults(seq_len=2048)
    parser.add_argument(
        "--batch-sizes",
        type=common.parse_int_list,
        default=[1, 4, 16, 64],
        help="comma-separated batch sizes to sweep (--batch-size N runs N alone)",
    )
    parser.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated per request")
    parser.add_argument(
        "--warmup-requests", type=int, default=2, help="untimed requests per batch size"
    )
    parser.add_argument(
        "--data", default=None, help="a .txt or .jsonl file prompts are cut from (default: corpus)"
    )
    parser.add_argument(
        "--static-cache",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="a key/value cache allocated once at prompt+new tokens (transformers "
        "StaticCache) instead of one that grows each token",
    )
    parser.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="static KV cache plus the decode step compiled with "
        "torch.compile(mode='reduce-overhead'), which replays it as a CUDA graph: "
        "fewer kernel launches per token at small batches (CUDA only; compiles once per "
        "batch size, in the untimed warm-up requests)",
    )
    return parser


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between ranks."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@torch.no_grad()
def generate_timed(
    model: Any, prompts: torch.Tensor, new_tokens: int, device: torch.device
) -> tuple[float, float, torch.Tensor]:
    """Greedy decoding with a KV cache: (seconds to first token, total seconds, tokens).

    The next token stays on the device between steps, so the host never waits
    for the GPU except to read the two clocks.
    """
    # transformers renamed past_key_values to cache in 5.x; accept either.
    new_api = "cache" in inspect.signature(model.forward).parameters
    key = "cache" if new_api else "past_key_values"
    common.sync(device)
    t0 = time.perf_counter()
    out = model(input_ids=prompts, use_cache=True)
    past = getattr(out, key)
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    common.sync(device)
    ttft = time.perf_counter() - t0
    generated = [token]
    for _ in range(new_tokens - 1):
        out = model(input_ids=token, use_cache=True, **{key: past})
        past = getattr(out, key)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        generated.append(token)
    common.sync(device)
    total = time.perf_counter() - t0
    return ttft, total, torch.cat(generated, dim=1)


@torch.no_grad()
def generate_static(
    model: Any,
    decode: Any,
    cache: Any,
    prompts: torch.Tensor,
    new_tokens: int,
    device: torch.device,
) -> tuple[float, float, torch.Tensor]:
    """Greedy decoding into a preallocated StaticCache; ``decode`` runs each one-token step
    (the model's forward, or its compiled CUDA-graph version). Same timings as
    :func:`generate_timed`."""
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache.reset()
    prompt_len = prompts.shape[1]
    positions = torch.arange(prompt_len, prompt_len + new_tokens, device=device).view(-1, 1, 1)
    common.sync(device)
    t0 = time.perf_counter()
    out = model(input_ids=prompts, use_cache=True, **{key: cache})
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    common.sync(device)
    ttft = time.perf_counter() - t0
    generated = [token]
    for i in range(new_tokens - 1):
        logits = decode(input_ids=token, position_ids=positions[i], use_cache=True, **{key: cache})
        token = logits.logits[:, -1].argmax(-1, keepdim=True)
        generated.append(token)
    common.sync(device)
    total = time.perf_counter() - t0
    return ttft, total, torch.cat(generated, dim=1)


def check_cuda_graphs(args: argparse.Namespace, device: torch.device) -> None:
    if args.cuda_graphs and device.type != "cuda":
        raise common.RunnerError(
            "--cuda-graphs refused: CUDA graphs need a CUDA GPU; on the CPU use "
            "--static-cache alone (the same static KV cache, without graph replay)",
            common.EXIT_USAGE,
        )


def main(args: argparse.Namespace) -> int:
    device = common.pick_device(args.device)
    check_cuda_graphs(args, device)
    static = bool(args.static_cache or args.cuda_graphs)
    common.seed_everything(args.seed)
    prec = common.Precision(args.precision, device)
    prec.apply_backend_flags()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision, torch.float32)
    if args.new_tokens < 1 or args.prompt_len < 1:
        raise common.RunnerError("--new-tokens and --prompt-len must be positive", 2)
    args.seq_len = max(args.seq_len, args.prompt_len + args.new_tokens)
    loaded = llm.load_model(args, device, dtype)
    model = loaded.model.eval()
    decode: Any = model
    if args.cuda_graphs:
        # Fixed shapes per batch size: compiled once, then replayed as a CUDA graph.
        decode = torch.compile(model.forward, mode="reduce-overhead", dynamic=False)
    elif args.compile:
        model.forward = torch.compile(model.forward, dynamic=True)
        decode = model
    ids, _ = llm.token_stream(args.data, loaded.tokenizer)
    batch_sizes = [args.batch_size] if args.batch_size else args.batch_sizes
    pool = llm.pack(ids, ids, args.prompt_len, min_blocks=max(batch_sizes))[:, 0].to(device)
    print(
        f"infer: {args.model or 'preset ' + args.model_preset} on {common.device_label(device)}, "
        f"{args.precision} weights, prompt {args.prompt_len} + {args.new_tokens} new tokens, "
        f"{args.steps} requests per batch size {batch_sizes}, "
        f"KV cache {'static' if static else 'dynamic'}, cuda_graphs={args.cuda_graphs}",
        flush=True,
    )
    metrics = MetricsWriter.from_env()
    rows: list[dict[str, Any]] = []
    g = torch.Generator().manual_seed(args.seed)
    with metrics:
        for n, bs in enumerate(batch_sizes, 1):
            common.reset_peak_memory(device)
            ttfts, lats = [], []
            cache = None
            if static:
                # start-up time: transformers, only where it is used
                from transformers import StaticCache

                cache = StaticCache(
                    config=model.config, max_cache_len=args.prompt_len + args.new_tokens
                )
            for r in range(args.warmup_requests + args.steps):
                common.maybe_simulate_oom(args, n)
                idx = torch.randint(0, len(pool), (bs,), generator=g).to(device)
                with prec.autocast():
                    if cache is not None:
                        ttft, total, _ = generate_static(
                            model, decode, cache, pool[idx], args.new_tokens, device
                        )
                    else:
                        ttft, total, _ = generate_timed(model, pool[idx], args.new_tokens, device)
                if r >= args.warmup_requests:
                    ttfts.append(ttft)
                    lats.append(total)
            per_token = [
                (t - f) / max(1, args.new_tokens - 1) for t, f in zip(lats, ttfts, strict=True)
            ]
            row = {
                "batch_size": bs,
                "ttft_ms_p50": percentile(ttfts, 50) * 1e3,
                "per_token_ms_p50": percentile(per_token, 50) * 1e3,
                "latency_ms_p50": percentile(lats, 50) * 1e3,
                "latency_ms_p99": percentile(lats, 99) * 1e3,
                "tokens_per_s": bs * args.new_tokens * len(lats) / max(sum(lats), 1e-9),
                "mem_peak_mib": common.peak_memory_mib(device),
            }
            rows.append({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
            metrics.log(
                step=n,
                total_steps=len(batch_sizes),
                throughput=row["tokens_per_s"],
                unit="tokens/s",
                mem_peak_mib=round(row["mem_peak_mib"], 1),
                **{k: v for k, v in rows[-1].items() if k not in ("tokens_per_s", "mem_peak_mib")},
            )
            print(
                f"batch {bs:>4}: first token {row['ttft_ms_p50']:.1f} ms, "
                f"{row['per_token_ms_p50']:.2f} ms/token, request p50 "
                f"{row['latency_ms_p50']:.0f} ms p99 {row['latency_ms_p99']:.0f} ms, "
                f"{row['tokens_per_s']:,.0f} tokens/s",
                flush=True,
            )
        best = max(rows, key=lambda r: r["tokens_per_s"])
        metrics.summary(
            sweep=rows,
            best_batch_size=best["batch_size"],
            tokens_per_s=best["tokens_per_s"],
            prompt_len=args.prompt_len,
            new_tokens=args.new_tokens,
            precision=args.precision,
            static_cache=static,
            cuda_graphs=args.cuda_graphs,
            model=args.model or f"preset:{args.model_preset}",
            device=str(device),
        )
    print()
    common.print_table(
        ["batch", "TTFT ms", "ms/token", "p50 ms", "p99 ms", "tokens/s", "peak MiB"],
        [
            [
                r["batch_size"],
                f"{r['ttft_ms_p50']:.1f}",
                f"{r['per_token_ms_p50']:.2f}",
                f"{r['latency_ms_p50']:.0f}",
                f"{r['latency_ms_p99']:.0f}",
                common.fmt_rate(r["tokens_per_s"]),
                f"{r['mem_peak_mib']:,.0f}",
            ]
            for r in rows
        ],
    )
    common.print_limits(_limits(rows, device, static, args.cuda_graphs))
    return common.EXIT_OK


def _limits(
    rows: list[dict[str, Any]], device: torch.device, static: bool = False, graphs: bool = False
) -> list[str]:
    tips = []
    if device.type == "cpu":
        tips.append("running on the CPU: figures say nothing about a GPU")
    best = max(rows, key=lambda r: r["tokens_per_s"])
    first = rows[0]
    tips.append(
        f"the best throughput was at batch {best['batch_size']} "
        f"({common.fmt_rate(best['tokens_per_s'])} tokens/s)"
    )
    if len(rows) > 1 and best is rows[-1]:
        tips.append(
            "throughput still rose at the largest batch: decoding reads every weight once "
            "per token, so batching shares that read; try larger batches if latency allows"
        )
    if len(rows) > 1 and best["per_token_ms_p50"] > 2 * first["per_token_ms_p50"]:
        tips.append(
            "per-token latency grew with the batch: past this point the GPU is compute-bound "
            "and each user waits longer"
        )
    if not graphs:
        tips.append(
            "small batches are bound by memory bandwidth and kernel-launch overhead; a static "
            "KV cache with CUDA graphs (--cuda-graphs) lowers ms/token"
        )
    elif static:
        tips.append(
            "decode steps replay as CUDA graphs: what remains per token is reading the "
            "weights and the KV cache from memory"
        )
    return tips


def _oom_hint(args: argparse.Namespace) -> str:
    return common.oom_advice(
        f"generating at batch sizes {args.batch_sizes} with {args.prompt_len}+"
        f"{args.new_tokens} tokens (the KV cache grows with batch x length)",
        None,
        extra=[
            "smaller batch sizes (--batch-sizes 1,2,4)",
            "shorter prompts or fewer new tokens (--prompt-len, --new-tokens)",
        ],
    )


def cli(argv: Sequence[str] | None = None) -> int:
    return common.run_main(main, build_parser(), argv, oom_hint=_oom_hint)


if __name__ == "__main__":
    sys.exit(cli())
