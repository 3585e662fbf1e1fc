"""Sharded training of a Llama-style model with PyTorch FSDP2 (``fully_shard``).

Every decoder layer is its own FSDP unit and the whole model the root one:
parameters, gradients and optimizer state are split across the processes,
each layer's weights are gathered just before its forward and backward and
freed after. ``--mode lora`` trains a LoRA adapter (peft) on a sharded frozen
base, ``--mode full`` every weight. With no ``--model`` a Llama-style model is
built from ``--model-preset`` (``--num-layers``/``--hidden-size`` change its
shape) with random weights, no download; ``--model PATH`` loads a local
checkpoint.

- ``--offload`` keeps the sharded parameters, gradients and optimizer state in
  pinned host memory (FSDP2 CPUOffloadPolicy; the optimizer steps on the CPU):
  far less GPU memory for a slower step. On the CPU there is nothing to
  offload to and it is ignored.
- ``--sharding full`` frees gathered weights after the forward (FULL_SHARD),
  ``grad-op`` keeps them until the backward (SHARD_GRAD_OP: more memory, one
  all-gather less per layer).
- ``--precision bf16``: bf16 compute with fp32 sharded weights and fp32
  gradient reduction (MixedPrecisionPolicy).
- ``--activation-checkpointing`` recomputes each layer in the backward.

Launch with ``accelerate launch --num_processes N -m gpustation.runners.fsdp``
or ``torchrun``; alone it shards over one process (the memory layout and the
offload path are the same, with nothing to communicate). The FSDP settings are
written to OUTPUT_DIR/fsdp_config.yaml as an accelerate config. Each step
reports tokens/s, peak GPU memory (CUDA) and host RSS.

``--find-max-model`` instead grows the model (layers doubled at the chosen
width, then bisected) in child processes until it no longer fits one GPU,
with and without offload, and reports the largest of each with its tokens/s
(CUDA only: on the CPU it says so and stops).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from gpustation.runners.lib import common, fsdp_search, llm, profiling
from gpustation.runs.metrics import MetricsWriter

SHARDING = {"full": True, "grad-op": False}  # reshard_after_forward
CONFIG_FILE = "fsdp_config.yaml"


def build_parser() -> argparse.ArgumentParser:
    parser = common.make_parser("fsdp", __doc__)
    common.add_training_args(
        parser, steps=50, batch_size=8, precision="bf16", compile_default=False
    )
    llm.add_model_args(parser)
    parser.add_argument(
        "--mode",
        choices=("lora", "full"),
        default="lora",
        help="lora: a LoRA adapter on a sharded frozen base; full: every weight trained",
    )
    parser.add_argument(
        "--num-layers", type=int, default=None, help="decoder layers (default: the preset's)"
    )
    parser.add_argument(
        "--hidden-size",
        type=int,
        default=None,
        help="model width (default: the preset's; MLP width 2.75x, 64-wide heads)",
    )
    parser.add_argument(
        "--data", default=None, help="a .jsonl or .txt training file (default: shipped corpus)"
    )
    parser.add_argument(
        "--offload",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="keep sharded weights, gradients and optimizer state in host memory",
    )
    parser.add_argument(
        "--sharding",
        choices=sorted(SHARDING),
        default="full",
        help="full: FULL_SHARD (free gathered weights after forward); grad-op: SHARD_GRAD_OP",
    )
    parser.add_argument(
        "--activation-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="recompute each decoder layer in the backward pass (less activation memory)",
    )
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: "
                        "1e-3 for lora, 1e-4 for full)")  # fmt: skip
    parser.add_argument("--warmup-steps", type=int, default=3, help="steps not timed")
    parser.add_argument("--log-every", type=int, default=5, help="steps between metric lines")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="0 disables clipping")
    parser.add_argument("--lora-r", type=int, default=16, help="LoRA rank (--mode lora)")
    parser.add_argument("--lora-alpha", type=float, default=32.0)
    profiling.add_profile_arg(parser)
    parser.add_argument(
        "--find-max-model",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="find the largest model (layers at this width) that trains on one GPU with "
        "and without --offload, with tokens/s of each (CUDA only)",
    )
    parser.add_argument(
        "--find-start-layers", type=int, default=8, help="first layer count tried (doubled)"
    )
    parser.add_argument(
        "--find-modes",
        choices=("both", "no-offload", "offload"),
        default="both",
        help="--find-max-model: search without offload, with it, or both (each gets its "
        "share of --find-max-seconds)",
    )
    parser.add_argument(
        "--find-max-seconds", type=float, default=240, help="time for the whole search"
    )
    parser.add_argument(
        "--find-trial-seconds", type=float, default=90, help="time cap of one trial"
    )
    parser.add_argument(
        "--host-ram-fraction",
        type=float,
        default=0.7,
        help="--find-max-model: offload trials stop before their estimated host memory "
        "passes this share of the available RAM",
    )
    return parser


# ----------------------------------------------------------------------------- model


def shape_overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.num_layers:
        out["num_hidden_layers"] = args.num_layers
    if args.hidden_size:
        h = args.hidden_size
        heads = max(1, h // 64)
        out.update(
            hidden_size=h,
            intermediate_size=int(2.75 * h) // 8 * 8,
            num_attention_heads=heads,
            num_key_value_heads=heads,
        )
    return out


def decoder_layers(model: Any) -> torch.nn.ModuleList:
    for name, module in model.named_modules():
        if name.endswith(".layers") and isinstance(module, torch.nn.ModuleList):
            return module
    raise common.RunnerError("no decoder layers (a `.layers` ModuleList) found in the model")


def build_model(args: argparse.Namespace, device: torch.device) -> tuple[Any, llm.LoadedModel]:
    """The model (fp32 weights: FSDP keeps the sharded master copy), before sharding."""
    if args.model:
        loaded = llm.load_pretrained(args.model, device, torch.float32)
    else:
        loaded = llm.build_from_preset(
            args.model_preset, args.seed, device, torch.float32, args.seq_len,
            shape_overrides(args),
        )  # fmt: skip
    model = loaded.model
    if args.activation_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if args.mode == "lora":
        # start-up time: peft, only where it is used
        from peft import LoraConfig, get_peft_model

        with _quiet():
            model = get_peft_model(
                model,
                LoraConfig(
                    r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                    target_modules="all-linear", bias="none", task_type="CAUSAL_LM",
                ),
            )  # fmt: skip
    return model, loaded


def shard(model: Any, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """fully_shard every decoder layer, then the root; returns what was applied."""
    # start-up time: torch.distributed, only where it is used
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"reshard_after_forward": SHARDING[args.sharding]}
    if args.precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    offload = bool(args.offload) and device.type == "cuda"
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return {"fsdp_units": len(layers) + 1, "offload_effective": offload}


def accelerate_config_text(args: argparse.Namespace, world_size: int) -> str:
    """The accelerate config these FSDP settings correspond to (for accelerate launch)."""
    mp = args.precision if args.precision in ("bf16", "fp16") else "no"
    lines = [
        "# FSDP settings of this run, as an accelerate config (accelerate launch --config_file)",
        "compute_environment: LOCAL_MACHINE",
        "distributed_type: FSDP",
        f"mixed_precision: {mp}",
        f"num_processes: {world_size}",
        "fsdp_config:",
        "  fsdp_version: 2",
        "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP",
        "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer",
        f"  fsdp_offload_params: {str(bool(args.offload)).lower()}",
        f"  fsdp_reshard_after_forward: {str(SHARDING[args.sharding]).lower()}",
        f"  fsdp_activation_checkpointing: {str(bool(args.activation_checkpointing)).lower()}",
        "  fsdp_state_dict_type: SHARDED_STATE_DICT",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- training


@contextlib.contextmanager
def process_group(device_name: str | None) -> Iterator[common.Dist]:
    """The launcher's process group, or a one-process group so FSDP runs alone too."""
    # start-up time: torch.distributed, only where it is used
    import torch.distributed as dist

    with common.distributed(device_name) as d:
        own = False
        if not d.enabled and not dist.is_initialized():
            use_cuda = device_name == "cuda" or (device_name is None and torch.cuda.is_available())
            backend = "nccl" if use_cuda and torch.cuda.is_available() else "gloo"
            # torch re-exports HashStore without marking it so.
            store = dist.HashStore()  # type: ignore[attr-defined]
            dist.init_process_group(backend, store=store, rank=0, world_size=1)
            own = True
        try:
            yield d
        finally:
            if own and dist.is_initialized():
                dist.destroy_process_group()


def main(args: argparse.Namespace) -> int:
    if args.find_max_model:
        return fsdp_search.find_max_model(args)
    if args.precision == "fp16":
        raise common.RunnerError(
            "--precision fp16 is not offered here (a sharded grad scaler would be needed); "
            "use bf16",
            common.EXIT_USAGE,
        )
    with process_group(args.device) as d:
        return _train(args, d)


def _train(args: argparse.Namespace, d: common.Dist) -> int:
    device = common.pick_device(args.device, d.local_rank)
    common.seed_everything(args.seed)
    prec = common.Precision(args.precision, device)
    prec.apply_backend_flags()
    say = print if d.is_main else (lambda *a, **k: None)
    warmup = min(args.warmup_steps, max(0, args.steps - 1))
    if args.offload and device.type != "cuda":
        say("note: --offload is ignored on the CPU (the weights already live in host memory)")
    if args.compile:
        say("note: --compile is not applied to the sharded model here; it runs eager")
        args.compile = False

    model, loaded = build_model(args, device)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    cfg = (model.get_base_model() if hasattr(model, "get_base_model") else model).config
    flops_per_token = llm.train_flops_per_token(model, args.seq_len)
    if args.mode == "full":
        flops_per_token *= 1.5  # weight gradients too: 6N instead of 4N
    applied = shard(model, args, device)
    applied["local_params"] = sum(_local_numel(p) for p in model.parameters())
    # Peak GPU memory of training, not of the unsharded model before it was sharded
    # (or, with --offload, moved to the host).
    common.free_memory(device)
    common.reset_peak_memory(device)
    if d.is_main:
        out = common.output_dir(args)
        (out / CONFIG_FILE).write_text(accelerate_config_text(args, d.world_size), "utf-8")
    ids, labels = llm.token_stream(args.data, loaded.tokenizer)
    blocks = llm.pack(ids, labels, args.seq_len, min_blocks=args.batch_size)
    sampler = llm.BatchSampler(
        blocks, args.batch_size, args.steps, args.seed, device, d.rank, d.world_size
    )
    lr = args.lr if args.lr is not None else (1e-3 if args.mode == "lora" else 1e-4)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    say(
        f"fsdp: {args.model or 'preset ' + args.model_preset} ({cfg.num_hidden_layers} layers, "
        f"hidden {cfg.hidden_size}, {total / 1e6:,.1f}M params, {trainable / 1e6:,.2f}M "
        f"trainable, mode {args.mode}) on {common.device_label(device)} x{d.world_size}; "
        f"fully_shard (FSDP2) over {applied['fsdp_units']} units, sharding {args.sharding}, "
        f"offload={applied['offload_effective']}, {args.precision}, activation "
        f"checkpointing={args.activation_checkpointing}; batch {args.batch_size} x "
        f"{args.seq_len}/process",
        flush=True,
    )

    model.train()
    metrics = MetricsWriter.from_env(rank=d.rank)
    prof, timer = profiling.profiler_and_timer(args, warmup, device, d)
    warmup = timer.warmup_steps
    tokens_per_step = args.batch_size * args.seq_len * d.world_size
    losses: list[tuple[int, float]] = []
    loss_val = float("nan")
    rss_peak = common.host_rss_mib()
    with metrics:
        for step in range(1, args.steps + 1):
            common.maybe_simulate_oom(args, step)
            prof.before_step(step)
            x, y = sampler.batch(step - 1)
            # bf16 compute comes from the MixedPrecisionPolicy, not autocast.
            loss = model(input_ids=x, labels=y).loss
            loss.backward()
            if args.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            prof.after_step(step)
            timer.step_done(step, tokens_per_step)
            rss = common.host_rss_mib()
            rss_peak = max(rss_peak, rss)
            if step % args.log_every == 0 or step == args.steps or step == 1:
                loss_val = common.all_reduce_mean(float(loss.detach().item()), d, device)
                losses.append((step, loss_val))
                rate = timer.recent_rate() if step > warmup else None
                common.report_step(
                    metrics, say, step=step, total_steps=args.steps, loss=loss_val,
                    rate=rate, unit="tokens/s",
                    mem_mib=common.peak_memory_mib(device) if device.type == "cuda" else None,
                    lr=lr, extra={"host_rss_mib": round(rss, 1)},
                )  # fmt: skip
        tokens_per_s, seconds = timer.overall()
        mem = common.peak_memory_mib(device) if device.type == "cuda" else None
        summary: dict[str, Any] = {
            "tokens_per_s": round(tokens_per_s, 1),
            "model_tflops_per_s": round(tokens_per_s * flops_per_token / 1e12, 3),
            "final_loss": loss_val,
            "first_loss": losses[0][1] if losses else None,
            "loss_curve": losses,
            "mem_peak_mib": None if mem is None else round(mem, 1),
            "host_rss_peak_mib": round(rss_peak, 1),
            "timed_steps": args.steps - warmup,
            "timed_seconds": round(seconds, 3),
            "world_size": d.world_size,
            "mode": args.mode,
            "fsdp": "fully_shard (FSDP2)",
            "sharding": args.sharding,
            "offload": bool(args.offload),
            "activation_checkpointing": bool(args.activation_checkpointing),
            "num_layers": cfg.num_hidden_layers,
            "hidden_size": cfg.hidden_size,
            "params": total,
            "trainable_params": trainable,
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "precision": args.precision,
            "compile": False,
            "model": args.model or f"preset:{args.model_preset}",
            "device": str(device),
            **applied,
            **prof.summary(),
        }
        metrics.summary(**summary)
    if d.is_main:
        print(
            f"\nFSDP {args.mode}: {tokens_per_s:,.0f} tokens/s over {args.steps - warmup} timed "
            f"steps ({d.world_size} process(es)), loss {summary['first_loss']:.3f} -> "
            f"{loss_val:.3f}, peak GPU memory "
            + (f"{mem:,.0f} MiB" if mem is not None else "n/a (cpu)")
            + f", host RSS {rss_peak:,.0f} MiB",
            flush=True,
        )
        common.print_limits(_limits(args, device, applied, d))
    return common.EXIT_OK


def _limits(
    args: argparse.Namespace, device: torch.device, applied: dict[str, Any], d: common.Dist
) -> list[str]:
    tips = []
    if device.type == "cpu":
        tips.append("running on the CPU: figures say nothing about a GPU")
    if applied["offload_effective"]:
        tips.append(
            "offload moves every weight shard over PCIe twice a step and steps the "
            "optimizer on the CPU: use it only when the model does not fit otherwise"
        )
    if args.activation_checkpointing:
        tips.append(
            "activation checkpointing recomputes each layer (~30% slower); drop it "
            "(--no-activation-checkpointing) if the batch fits without"
        )
    if d.world_size == 1:
        tips.append(
            "one process: sharding saves nothing here; on one GPU the plain lora runner "
            "is faster unless you need offload"
        )
    if args.sharding == "full" and d.world_size > 1:
        tips.append("--sharding grad-op skips one all-gather per layer if memory allows")
    return tips


def _local_numel(p: torch.Tensor) -> int:
    """Elements of a parameter this process holds (its shard, for an FSDP2 DTensor)."""
    local = getattr(p, "to_local", None)
    return int(local().numel()) if local else int(p.numel())


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        yield


def _oom_hint(args: argparse.Namespace) -> str:
    return common.oom_advice(
        f"FSDP {args.mode} training at batch {args.batch_size} x {args.seq_len} tokens",
        None,
        extra=[
            f"a smaller batch (--batch-size {max(1, args.batch_size // 2)})",
            "--offload keeps weights, gradients and optimizer state in host memory",
            "--activation-checkpointing (on by default) recomputes activations",
            "more processes (GPUs) split the weights further",
        ],
    )


def cli(argv: Sequence[str] | None = None) -> int:
    return common.run_main(main, build_parser(), argv, oom_hint=_oom_hint)


if __name__ == "__main__":
    sys.exit(cli())
