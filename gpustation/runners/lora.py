"""LoRA fine-tuning of a causal language model with transformers + peft.

With no ``--model`` it builds a small Llama-style model with random weights
(``--model-preset``) and trains on the text corpus shipped with gpustation,
tokenised by bytes; ``--model PATH`` loads a local Hugging Face checkpoint and
its tokenizer; ``--data FILE.jsonl`` takes instruction data (Alpaca-style
instruction/input/output, prompt/completion, or text records).

Fast by default on a GPU: base weights stored in bf16, SDPA attention, fused
AdamW, torch.compile, sequences packed with no padding, no host syncs between
log lines. The adapter is saved to the output directory and reloaded once to
check it reproduces the trained model's logits.

Checkpoints (adapter, optimizer, LR schedule, step, RNG and data position) go
to OUTPUT_DIR/checkpoints every --checkpoint-every steps and at the end;
--resume-from continues from one. At the end a short greedy sample is
generated from the trained model, and --merge saves the adapter merged into
the base weights to OUTPUT_DIR/merged.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from gpustation.runners.lib import checkpoint, common, llm, lora_output, phase, profiling
from gpustation.runs.metrics import MetricsWriter

ADAPTER_DIR = "adapter"
# Above this many base parameters the adapter check reuses the loaded base.
REBUILD_MAX_PARAMS = 300_000_000
CHECK_FILE = "gpustation_check.pt"


def build_parser() -> argparse.ArgumentParser:
    parser = common.make_parser("lora", __doc__)
    common.add_training_args(
        parser, steps=200, batch_size=16, precision="bf16", compile_default=True
    )
    llm.add_model_args(parser)
    parser.add_argument(
        "--data",
        default=None,
        help="a .jsonl instruction file or a .txt file (default: the shipped corpus)",
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    parser.add_argument("--lr-warmup-steps", type=int, default=10, help="linear LR warm-up")
    parser.add_argument(
        "--warmup-steps", type=int, default=5, help="steps not timed (compilation, autotuning)"
    )
    parser.add_argument("--log-every", type=int, default=10, help="steps between metric lines")
    parser.add_argument(
        "--eval-fraction",
        type=float,
        default=0.05,
        help="share of the packed sequences held out for the eval loss (0: no eval)",
    )
    parser.add_argument(
        "--eval-every", type=int, default=50, help="steps between eval losses (and at the end)"
    )
    parser.add_argument(
        "--eval-batches", type=int, default=4, help="held-out batches each eval loss averages"
    )
    parser.add_argument(
        "--grad-accum",
        type=int,
        default=1,
        help="split each step's batch into this many micro-batches (less memory)",
    )
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="0 disables clipping")
    parser.add_argument("--lora-r", type=int, default=16, help="LoRA rank")
    parser.add_argument("--lora-alpha", type=float, default=32.0, help="LoRA scaling numerator")
    parser.add_argument("--lora-dropout", type=float, default=0.0)
    parser.add_argument(
        "--target-modules",
        default="all-linear",
        help="comma-separated module names to adapt (q_proj,v_proj,...) or all-linear",
    )
    parser.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="recompute activations in the backward pass: less memory, ~30%% slower",
    )
    parser.add_argument(
        "--base-dtype",
        choices=("auto", "fp32", "bf16", "fp16"),
        default="auto",
        help="storage dtype of the frozen base weights (auto: bf16 with --precision bf16, "
        "else fp32)",
    )
    parser.add_argument(
        "--load-in-4bit",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="quantise the base model to 4-bit NF4 (QLoRA; needs bitsandbytes and a GPU)",
    )
    profiling.add_profile_arg(parser)
    parser.add_argument(
        "--save-adapter",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="save the adapter to OUTPUT_DIR/adapter",
    )
    parser.add_argument(
        "--verify-adapter",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reload the saved adapter and check it gives the trained model's logits",
    )
    checkpoint.add_args(parser)
    lora_output.add_args(parser)
    return parser


def base_dtype(args: argparse.Namespace) -> torch.dtype:
    if args.base_dtype == "auto":
        # Frozen weights need no fp32 master copy: bf16 storage halves their
        # memory and saves the cast autocast would do on every forward.
        return torch.bfloat16 if args.precision == "bf16" else torch.float32
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.base_dtype]


def lora_config(args: argparse.Namespace) -> Any:
    # start-up time: peft, only where it is used
    from peft import LoraConfig

    targets: Any = args.target_modules
    if targets != "all-linear":
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    return LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )


def prepare_model(args: argparse.Namespace, device: torch.device) -> tuple[Any, llm.LoadedModel]:
    """The base model (loaded or built) wrapped with a fresh LoRA adapter."""
    # start-up time: peft, only where it is used
    from peft import get_peft_model, prepare_model_for_kbit_training

    loaded = llm.load_model(args, device, base_dtype(args), args.load_in_4bit)
    base = loaded.model
    if args.load_in_4bit:
        base = prepare_model_for_kbit_training(
            base, use_gradient_checkpointing=args.gradient_checkpointing
        )
    elif args.gradient_checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with _quiet_peft():
        model = get_peft_model(base, lora_config(args))
    return model, loaded


def lr_lambda(args: argparse.Namespace) -> Any:
    warm: int = max(0, args.lr_warmup_steps)

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        # Cosine decay to 10% of the peak over the remaining steps.
        progress = (step - warm) / max(1, args.steps - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


def split_eval(
    blocks: torch.Tensor, fraction: float, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Hold out the last ``fraction`` of the packed sequences for the eval loss.

    The training split keeps at least one batch; with too few sequences to
    spare, or ``fraction`` 0, there is no eval split.
    """
    if not 0 <= fraction < 1:
        raise common.RunnerError("--eval-fraction must be in [0, 1)", common.EXIT_USAGE)
    n_eval = int(len(blocks) * fraction)
    if n_eval < 1 or len(blocks) - n_eval < batch_size:
        return blocks, None
    return blocks[:-n_eval], blocks[-n_eval:]


def eval_loss(
    model: Any,
    held_out: torch.Tensor,
    args: argparse.Namespace,
    prec: common.Precision,
    device: torch.device,
    dist: common.Dist,
) -> float:
    """The mean loss over up to ``--eval-batches`` batches of the held-out sequences."""
    model.eval()
    total, count = 0.0, 0
    try:
        with torch.no_grad():
            for i in range(max(1, args.eval_batches)):
                chunk = held_out[i * args.batch_size : (i + 1) * args.batch_size]
                if len(chunk) == 0:
                    break
                chunk = chunk.to(device)
                with prec.autocast():
                    loss = model(input_ids=chunk[:, 0], labels=chunk[:, 1]).loss
                total += float(loss.item())
                count += 1
    finally:
        model.train()
    return common.all_reduce_mean(total / max(1, count), dist, device)


def main(args: argparse.Namespace) -> int:
    with common.distributed(args.device) as dist:
        return _train(args, dist)


def _train(args: argparse.Namespace, dist: common.Dist) -> int:
    device = common.pick_device(args.device, dist.local_rank)
    common.check_grad_accum(args)
    _check_args(args)
    resume = checkpoint.find(args.resume_from) if args.resume_from else None
    start = resume.step if resume is not None else 0
    if resume is not None and start >= args.steps:
        raise common.RunnerError(
            f"--resume-from {resume.path}: the checkpoint is at step {start}, so --steps "
            f"{args.steps} leaves nothing to train; ask for more steps (--steps {2 * start})",
            common.EXIT_USAGE,
        )
    common.seed_everything(args.seed)  # same base weights and adapter init on every rank
    prec = common.Precision(args.precision, device)
    prec.apply_backend_flags()
    say = print if dist.is_main else (lambda *a, **k: None)
    warmup = start + min(args.warmup_steps, max(0, args.steps - start - 1))

    model, loaded = prepare_model(args, device)
    peft_model = model
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    flops_per_token = llm.train_flops_per_token(model, args.seq_len)
    ids, labels = llm.token_stream(args.data, loaded.tokenizer)
    blocks = llm.pack(ids, labels, args.seq_len, min_blocks=args.batch_size)
    blocks, held_out = split_eval(blocks, args.eval_fraction, args.batch_size)
    sampler = llm.BatchSampler(
        blocks, args.batch_size, args.steps, args.seed, device, dist.rank, dist.world_size
    )
    say(
        f"lora: {args.model or 'preset ' + args.model_preset} ({total / 1e6:,.1f}M params, "
        f"{trainable / 1e6:,.2f}M trainable, r={args.lora_r}) on {common.device_label(device)} "
        f"x{dist.world_size}; {len(ids):,} tokens of "
        f"{args.data or 'shipped corpus'} packed into {len(blocks)} sequences of {args.seq_len}; "
        f"batch {args.batch_size}/process, {args.precision}, base weights "
        f"{str(base_dtype(args)).removeprefix('torch.')}, compile={args.compile}, "
        f"grad checkpointing={args.gradient_checkpointing}",
        flush=True,
    )

    model.train()
    if args.compile and args.load_in_4bit:
        say("note: --compile is skipped with --load-in-4bit (bitsandbytes kernels do not compile)")
        args.compile = False
    model = common.data_parallel(model, dist, device)
    if args.compile and not compile_layers(peft_model):
        model = torch.compile(model)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    opt_kwargs: dict[str, Any] = {"lr": args.lr, "weight_decay": 0.0}
    if device.type == "cuda":
        opt_kwargs["fused"] = True
    optimizer = torch.optim.AdamW(params, **opt_kwargs)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(args))
    scaler = prec.scaler()
    accum = max(1, args.grad_accum)
    trainer = checkpoint.Trainer(peft_model, loaded.info, optimizer, schedule, scaler)
    position = {
        "sequences": len(blocks),
        "batch_size": args.batch_size,
        "world_size": dist.world_size,
        "seed": args.seed,
    }
    if resume is not None:
        checkpoint.resume(resume, trainer, position, args.steps, device, say)
    last_checkpoint: Path | None = None

    metrics = MetricsWriter.from_env(rank=dist.rank)
    prof, timer = profiling.profiler_and_timer(args, warmup, device, dist)
    warmup = timer.warmup_steps
    common.mark_static_memory(metrics, device)
    tokens_per_step = args.batch_size * args.seq_len * dist.world_size
    losses: list[tuple[int, float]] = []
    eval_losses: list[tuple[int, float]] = []
    loss_val = float("nan")
    stopped_at: int | None = None
    with metrics, common.StopAsked(dist, device, args.log_every) as stop:
        for step in range(start + 1, args.steps + 1):
            common.maybe_simulate_oom(args, step)
            prof.before_step(step)
            x, y = sampler.batch(step - 1)
            step_loss = torch.zeros((), device=device)
            for xm, ym in zip(x.chunk(accum), y.chunk(accum), strict=True):
                with prec.autocast():
                    loss = model(input_ids=xm, labels=ym).loss / accum
                scaler.scale(loss).backward()
                step_loss += loss.detach()
            if args.max_grad_norm > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            prof.after_step(step)
            timer.step_done(step, tokens_per_step)
            if held_out is not None and (step % args.eval_every == 0 or step == args.steps):
                with phase.within(metrics, "eval", step):
                    eval_val = eval_loss(model, held_out, args, prec, device, dist)
                eval_losses.append((step, eval_val))
                metrics.log(step=step, eval_loss=eval_val, total_steps=args.steps)
                say(f"step {step:>5}/{args.steps}  eval loss {eval_val:.4f}", flush=True)
            if step % args.log_every == 0 or step == args.steps or step == start + 1:
                loss_val = common.all_reduce_mean(float(step_loss.item()), dist, device)
                losses.append((step, loss_val))
                rate = timer.recent_rate() if step > warmup else None
                mem = common.peak_memory_mib(device)
                lr = float(schedule.get_last_lr()[0])
                common.report_step(
                    metrics,
                    say,
                    step=step,
                    total_steps=args.steps,
                    loss=loss_val,
                    rate=rate,
                    unit="tokens/s",
                    mem_mib=mem,
                    lr=lr,
                )
            stopping = step < args.steps and stop.now(step)
            if dist.is_main and (stopping or _checkpoint_due(args, step)):
                with phase.within(metrics, "checkpoint", step):
                    last_checkpoint = checkpoint.save(
                        common.output_dir(args),
                        trainer,
                        step=step,
                        total_steps=args.steps,
                        keep=args.keep_checkpoints,
                        data_position={"batches": step, **position},
                    )
                say(f"checkpoint at step {step}: {last_checkpoint}", flush=True)
            if stopping:
                stopped_at = step
                break
        if stopped_at is not None:
            # Saved and leaving, as the stop promised: no summary, the run did not finish.
            metrics.log(step=stopped_at, event="stopped", total_steps=args.steps)
            say(f"stopped at step {stopped_at} of {args.steps}; gpustation run --resume goes on")
            return common.EXIT_STOPPED
        tokens_per_s, seconds = timer.overall()
        mem = common.peak_memory_mib(device)
        summary: dict[str, Any] = {
            "tokens_per_s": round(tokens_per_s, 1),
            # the work this run did (a resumed run's from its first step): energy per token
            "tokens": (args.steps - start) * tokens_per_step,
            "model_tflops_per_s": round(tokens_per_s * flops_per_token / 1e12, 3),
            "flops_per_token": flops_per_token,
            "final_loss": loss_val,
            "first_loss": losses[0][1] if losses else None,
            "loss_curve": losses,
            "eval_loss": eval_losses[-1][1] if eval_losses else None,
            "eval_sequences": 0 if held_out is None else len(held_out),
            "mem_peak_mib": round(mem, 1),
            "timed_steps": args.steps - warmup,
            "timed_seconds": round(seconds, 3),
            "world_size": dist.world_size,
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "precision": args.precision,
            "compile": args.compile,
            "params": total,
            "trainable_params": trainable,
            "model": args.model or f"preset:{args.model_preset}",
            "device": str(device),
            **prof.summary(),
        }
        if resume is not None:
            summary["resumed_from"] = {
                "run": resume.run_id,
                "step": start,
                "checkpoint": str(resume.path),
            }
        if last_checkpoint is not None:
            summary["last_checkpoint"] = str(last_checkpoint)
        if dist.is_main and args.save_adapter:
            summary.update(_save_and_verify(args, peft_model, loaded, x[:2], prec, device))
        if dist.is_main:
            summary.update(lora_output.finish(args, peft_model, loaded.tokenizer, prec, device))
        metrics.summary(**summary)
    if dist.is_main:
        print(
            f"\nLoRA: {tokens_per_s:,.0f} tokens/s "
            f"({summary['model_tflops_per_s']:.3g} model TFLOP/s) over {args.steps - warmup} "
            f"timed steps, loss {summary['first_loss']:.3f} -> {loss_val:.3f}, "
            f"peak memory {mem:,.0f} MiB"
        )
        common.print_limits(_limits(args, device, total, summary))
    if summary.get("adapter_reload_ok") is False:
        return common.EXIT_FAILED
    return common.EXIT_OK


def _check_args(args: argparse.Namespace) -> None:
    for flag, value in (
        ("--checkpoint-every", args.checkpoint_every),
        ("--keep-checkpoints", args.keep_checkpoints),
        ("--generate-tokens", args.generate_tokens),
    ):
        if value < 0:
            raise common.RunnerError(f"{flag}: 0 or more, got {value}", common.EXIT_USAGE)
    if args.merge and args.load_in_4bit:
        raise common.RunnerError(
            "--merge with --load-in-4bit: merging into 4-bit weights rounds the adapter away; "
            "train with 4-bit weights, then merge the saved adapter into a bf16 or fp32 base",
            common.EXIT_USAGE,
        )


def _checkpoint_due(args: argparse.Namespace, step: int) -> bool:
    if args.keep_checkpoints == 0:
        return False
    steps: int = args.steps
    every: int = args.checkpoint_every
    return step == steps or (every > 0 and step % every == 0)


def compile_layers(model: Any) -> int:
    """Compile each decoder layer in place; returns how many (0 if none were found).

    Identical layers share one compiled graph, so a 16-layer model compiles in
    the time of one layer instead of sixteen, with the same fusions inside
    each layer (norms, rotary embedding, SiLU gate, LoRA branches).
    """
    layers = None
    for name, module in model.named_modules():
        if name.endswith(".layers") and isinstance(module, torch.nn.ModuleList):
            layers = module
            break
    if layers is None:
        return 0
    for layer in layers:
        layer.compile()
    return len(layers)


@torch.no_grad()
def _logits(model: Any, x: torch.Tensor, prec: common.Precision) -> torch.Tensor:
    was_training = model.training
    model.eval()
    # Compiled layers round differently from eager ones; compare like with like.
    stance = getattr(torch.compiler, "set_stance", None)
    eager = stance("force_eager") if stance else contextlib.nullcontext()
    with eager, prec.autocast():
        out: torch.Tensor = model(input_ids=x).logits.float()
    model.train(was_training)
    return out


def _save_and_verify(
    args: argparse.Namespace,
    model: Any,
    loaded: llm.LoadedModel,
    sample: torch.Tensor,
    prec: common.Precision,
    device: torch.device,
) -> dict[str, Any]:
    """Save the adapter with what is needed to rebuild its base; reload it and compare."""
    out = common.output_dir(args) / ADAPTER_DIR
    model.save_pretrained(out)
    llm.save_base_info(out, loaded.info)
    if isinstance(loaded.tokenizer, llm.HFTokenizer):
        loaded.tokenizer.tok.save_pretrained(out)
    sample = sample[:, : min(64, sample.shape[1])]
    logits = _logits(model, sample, prec)
    torch.save(
        {"input_ids": sample.cpu(), "logits": logits.cpu(), "precision": args.precision},
        out / CHECK_FILE,
    )
    print(f"saved adapter to {out}", flush=True)
    result: dict[str, Any] = {"adapter_dir": str(out)}
    if not args.verify_adapter:
        return result
    base_params = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    if base_params < REBUILD_MAX_PARAMS:
        # Rebuild the base from its saved description, as a user would.
        del loaded
        reloaded = load_adapter(out, device, base_dtype(args))
        got = _logits(reloaded, sample, prec)
        del reloaded
    else:
        # A second copy of a big base might not fit beside the first: load the
        # saved adapter next to the trained one on the same base and compare.
        with _quiet_peft():
            model.load_adapter(out, adapter_name="reloaded")
        model.set_adapter("reloaded")
        got = _logits(model, sample, prec)
        model.set_adapter("default")
        model.delete_adapter("reloaded")
    diff = (got - logits).abs().max().item()
    scale = logits.abs().max().item() or 1.0
    tol = 1e-3 if args.precision in ("fp32", "tf32") else 2e-2
    ok = diff <= tol * scale + 1e-4
    result.update(adapter_reload_max_abs_diff=diff, adapter_reload_ok=ok)
    print(
        f"adapter reload check: max |logit difference| {diff:.2e} -> "
        + (
            "same outputs"
            if ok
            else "DIFFERENT outputs (the saved adapter does not reproduce the trained model)"
        ),
        flush=True,
    )
    return result


def load_adapter(
    adapter_dir: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> Any:
    """Rebuild the base model an adapter was trained on and load the adapter onto it."""
    # start-up time: peft, only where it is used
    from peft import PeftModel

    adapter_dir = Path(adapter_dir)
    device = torch.device(device)
    info = llm.read_base_info(adapter_dir)
    base = llm.rebuild_base(info, device, dtype or torch.float32).model
    with _quiet_peft():
        return PeftModel.from_pretrained(base, adapter_dir).to(device)


@contextlib.contextmanager
def _quiet_peft() -> Iterator[None]:
    with warnings.catch_warnings():
        # peft reads a transformers property that transformers 5 deprecates; not ours to fix.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        yield


def _limits(
    args: argparse.Namespace, device: torch.device, params: int, summary: dict[str, Any]
) -> list[str]:
    tips = []
    if device.type == "cpu":
        tips.append("running on the CPU: figures say nothing about a GPU")
    if args.precision != "bf16":
        tips.append("--precision bf16 stores the frozen base in bf16 and uses tensor cores")
    if args.gradient_checkpointing:
        tips.append(
            "gradient checkpointing recomputes every layer in the backward pass (~30% "
            "slower); drop it if the batch fits without (--no-gradient-checkpointing)"
        )
    if not args.compile:
        tips.append("--compile fuses the norm/rotary/activation kernels around the matmuls")
    if params < 100e6 and device.type == "cuda":
        tips.append(
            "a small model cannot fill a big GPU: kernel launches and memory traffic "
            "dominate; a larger --batch-size or --seq-len raises tokens/s"
        )
    if args.grad_accum > 1:
        tips.append("micro-batches (--grad-accum) save memory but run smaller, slower kernels")
    first, final = summary.get("first_loss"), summary.get("final_loss")
    if first is not None and final is not None and final >= first:
        tips.append("the loss did not fall: try a lower --lr or more --steps")
    if not tips:
        tips.append("compute-bound on the matmuls: this is close to what the card can do")
    return tips


def _oom_hint(args: argparse.Namespace) -> str:
    return common.oom_advice(
        f"fine-tuning at batch {args.batch_size} x {args.seq_len} tokens",
        args.batch_size,
        extra=[
            "gradient checkpointing (--gradient-checkpointing): activations recomputed, not stored",
            f"shorter sequences (--seq-len {max(16, args.seq_len // 2)})",
            "4-bit base weights (--load-in-4bit, needs bitsandbytes)",
        ],
    )


def cli(argv: Sequence[str] | None = None) -> int:
    return common.run_main(main, build_parser(), argv, oom_hint=_oom_hint)


if __name__ == "__main__":
    sys.exit(cli())
