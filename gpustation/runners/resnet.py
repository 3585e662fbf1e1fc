"""ResNet-50 training throughput: synthetic images made on the GPU, or an ImageFolder.

The defaults are the fast recipe on a 4090/H100-class card: batch 256, bf16
autocast, channels_last, torch.compile, cudnn.benchmark, synthetic data that
never leaves the GPU (so the input pipeline cannot be the bottleneck). Each
switch can be turned off to see what it is worth, e.g. ``--precision fp32
--no-channels-last --no-compile`` is the plain baseline.

Run data-parallel with ``torchrun --nproc_per_node N -m gpustation.runners.resnet``;
rank 0 writes the metrics.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from gpustation.runners.lib import common, profiling
from gpustation.runs.metrics import MetricsWriter


def build_parser() -> argparse.ArgumentParser:
    parser = common.make_parser("resnet", __doc__)
    common.add_training_args(
        parser, steps=100, batch_size=256, precision="bf16", compile_default=True
    )
    parser.add_argument(
        "--model",
        default="resnet50",
        help="a torchvision classification model name (resnet18, resnet50, ...)",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="an ImageFolder directory (class sub-folders of images); "
        "default: synthetic images generated on the device",
    )
    parser.add_argument("--image-size", type=int, default=224, help="image side in pixels")
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=10,
        help="steps not timed (compilation, cudnn autotuning)",
    )
    parser.add_argument("--log-every", type=int, default=10, help="steps between metric lines")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument(
        "--grad-accum", type=int, default=1, help="micro-batches accumulated per optimizer step"
    )
    parser.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="NHWC memory format (tensor cores prefer it)",
    )
    parser.add_argument(
        "--cudnn-benchmark",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="let cuDNN time and pick convolution algorithms",
    )
    parser.add_argument(
        "--workers", type=int, default=8, help="DataLoader worker processes (with --data)"
    )
    parser.add_argument(
        "--pin-memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="page-locked host buffers for faster copies (with --data)",
    )
    parser.add_argument(
        "--persistent-workers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep DataLoader workers between epochs",
    )
    parser.add_argument(
        "--prefetch", type=int, default=4, help="batches each DataLoader worker prepares ahead"
    )
    parser.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="capture the whole training step (forward, backward, optimizer) once in a CUDA "
        "graph and replay it: one launch per step instead of hundreds (CUDA only; not with "
        "fp16, whose grad scaler syncs with the host, nor data-parallel)",
    )
    profiling.add_profile_arg(parser)
    parser.add_argument(
        "--save-checkpoint",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="save the final weights to the output directory",
    )
    return parser


@dataclass
class Trainer:
    """A model, its optimizer and one ``step(images, labels)`` function."""

    model: nn.Module
    raw_model: nn.Module
    optimizer: torch.optim.Optimizer
    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def make_trainer(
    args: argparse.Namespace, device: torch.device, dist: common.Dist | None = None
) -> Trainer:
    """Build the model and a step function honouring precision, layout, compile and accumulation."""
    # start-up time: torchvision, only where it is used
    import torchvision

    graphs = bool(getattr(args, "cuda_graphs", False))
    if graphs:
        check_cuda_graphs(args, device, dist)
    prec = common.Precision(args.precision, device)
    prec.apply_backend_flags()
    torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format

    model: nn.Module = torchvision.models.get_model(args.model, num_classes=args.num_classes)
    model = model.to(device).to(memory_format=memory_format)
    raw = model
    if dist is not None:
        model = common.data_parallel(model, dist, device)
    if args.compile:
        # torch types compile() as returning a callable; given a module it returns one
        model = torch.compile(model)  # type: ignore[assignment]

    opt_kwargs: dict[str, Any] = {"lr": args.lr, "momentum": 0.9, "weight_decay": 5e-5}
    if device.type == "cuda":
        opt_kwargs["fused"] = True  # one kernel for the whole update
    optimizer = torch.optim.SGD(raw.parameters(), **opt_kwargs)
    scaler = prec.scaler()
    criterion = nn.CrossEntropyLoss()
    accum = max(1, args.grad_accum)

    def step(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # The batch is split into `accum` micro-batches; the loss returned stays
        # on the device so the caller decides when to pay for a host sync.
        images = images.to(device, non_blocking=True, memory_format=memory_format)
        labels = labels.to(device, non_blocking=True)
        total = torch.zeros((), device=device)
        for img, lab in zip(images.chunk(accum), labels.chunk(accum), strict=True):
            with prec.autocast():
                loss = criterion(model(img), lab) / accum
            scaler.scale(loss).backward()
            total += loss.detach()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return total

    run = graphed_step(step, device) if graphs else step
    return Trainer(model=model, raw_model=raw, optimizer=optimizer, step=run)


def check_cuda_graphs(
    args: argparse.Namespace, device: torch.device, dist: common.Dist | None
) -> None:
    """Refuse --cuda-graphs where a captured step would be wrong or impossible."""
    why = None
    if device.type != "cuda":
        why = "it needs a CUDA GPU (there are no CUDA graphs on the CPU); drop --cuda-graphs"
    elif args.precision == "fp16":
        why = "fp16's grad scaler reads the host on every step; use --precision bf16"
    elif dist is not None and dist.enabled:
        why = "data-parallel all-reduces are not captured here; run on one GPU"
    if why:
        raise common.RunnerError(f"--cuda-graphs refused: {why}", common.EXIT_USAGE)


def graphed_step(
    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    warmup_iters: int = 3,
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The whole step captured with ``torch.cuda.graph`` on first use, then replayed.

    Whole-step capture (rather than ``torch.compile(mode="reduce-overhead")``)
    also takes in the optimizer update, and works the same with and without
    --compile. The batch is copied into static input tensors before each replay.
    """
    state: dict[str, Any] = {}

    def run(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if "graph" not in state:
            static_x = images.to(device, copy=True)
            static_y = labels.to(device, copy=True)
            # Warm-up on a side stream (cudnn autotuning, compilation, optimizer state).
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(warmup_iters):
                    step(static_x, static_y)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_loss = step(static_x, static_y)
            state.update(graph=graph, x=static_x, y=static_y, loss=static_loss)
        state["x"].copy_(images, non_blocking=True)
        state["y"].copy_(labels, non_blocking=True)
        state["graph"].replay()
        loss: torch.Tensor = state["loss"]
        return loss

    return run


def synthetic_batches(
    args: argparse.Namespace, device: torch.device, batch_size: int, rank: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One fixed random batch made on the device, yielded forever (no host work per step).

    Each data-parallel rank gets its own batch, as it would its own shard of a dataset.
    """
    g = torch.Generator(device=device).manual_seed(args.seed + 1000 * rank)
    images = torch.randn(
        batch_size, 3, args.image_size, args.image_size, device=device, generator=g
    )
    labels = torch.randint(0, args.num_classes, (batch_size,), device=device, generator=g)
    if args.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    while True:
        yield images, labels


def folder_batches(
    args: argparse.Namespace, device: torch.device, dist: common.Dist
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches from an ImageFolder through a DataLoader, looping over epochs."""
    # start-up time: torchvision, only where it is used
    import torchvision
    from torchvision.transforms import v2

    tf = v2.Compose(
        [
            v2.RandomResizedCrop(args.image_size, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )
    dataset = torchvision.datasets.ImageFolder(args.data, transform=tf)
    sampler: Any = None
    if dist.enabled:
        sampler = torch.utils.data.DistributedSampler(
            dataset, num_replicas=dist.world_size, rank=dist.rank, seed=args.seed
        )
    workers = max(0, args.workers)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        num_workers=workers,
        pin_memory=bool(args.pin_memory) and device.type == "cuda",
        persistent_workers=bool(args.persistent_workers) and workers > 0,
        prefetch_factor=args.prefetch if workers > 0 else None,
        drop_last=True,
    )
    if len(loader) == 0:
        raise common.RunnerError(
            f"{args.data} holds fewer images than one batch of {args.batch_size}", common.EXIT_USAGE
        )
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def main(args: argparse.Namespace) -> int:
    with common.distributed(args.device) as dist:
        return _train(args, dist)


def _train(args: argparse.Namespace, dist: common.Dist) -> int:
    device = common.pick_device(args.device, dist.local_rank)
    common.seed_everything(args.seed + dist.rank)
    common.check_grad_accum(args)
    warmup = min(args.warmup_steps, max(0, args.steps - 1))
    metrics = MetricsWriter.from_env(rank=dist.rank)
    say = print if dist.is_main else (lambda *a, **k: None)

    say(
        f"resnet: {args.model} on {common.device_label(device)} x{dist.world_size}, "
        f"batch {args.batch_size}/process, {args.precision}, channels_last={args.channels_last}, "
        f"compile={args.compile}, cuda_graphs={args.cuda_graphs}, "
        f"data={'synthetic on device' if not args.data else args.data}",
        flush=True,
    )
    trainer = make_trainer(args, device, dist)
    batches = (
        folder_batches(args, device, dist)
        if args.data
        else synthetic_batches(args, device, args.batch_size, dist.rank)
    )
    prof, timer = profiling.profiler_and_timer(args, warmup, device, dist)
    warmup = timer.warmup_steps
    common.mark_static_memory(metrics, device)
    global_batch = args.batch_size * dist.world_size
    loss_val = float("nan")
    first_loss: float | None = None
    with metrics:
        for step in range(1, args.steps + 1):
            common.maybe_simulate_oom(args, step)
            images, labels = next(batches)
            prof.before_step(step)
            loss = trainer.step(images, labels)
            prof.after_step(step)
            timer.step_done(step, global_batch)
            if step % args.log_every == 0 or step == args.steps or step == 1:
                loss_val = common.all_reduce_mean(float(loss.item()), dist, device)
                if first_loss is None:
                    first_loss = loss_val
                rate = timer.recent_rate() if step > warmup else None
                mem = common.peak_memory_mib(device)
                common.report_step(
                    metrics,
                    say,
                    step=step,
                    total_steps=args.steps,
                    loss=loss_val,
                    rate=rate,
                    unit="img/s",
                    mem_mib=mem,
                    lr=args.lr,
                )
        img_per_s, seconds = timer.overall()
        mem = common.peak_memory_mib(device)
        summary = {
            "img_per_s": round(img_per_s, 2),
            "final_loss": loss_val,
            "first_loss": first_loss,
            "mem_peak_mib": round(mem, 1),
            "timed_steps": args.steps - warmup,
            "timed_seconds": round(seconds, 3),
            "world_size": dist.world_size,
            "batch_size": args.batch_size,
            "global_batch": global_batch,
            "precision": args.precision,
            "channels_last": args.channels_last,
            "compile": args.compile,
            "cuda_graphs": args.cuda_graphs,
            "model": args.model,
            "device": str(device),
            **prof.summary(),
        }
        metrics.summary(**summary)
    if dist.is_main:
        print(
            f"\n{args.model}: {img_per_s:,.1f} img/s over {args.steps - warmup} timed steps "
            f"({dist.world_size} process(es)), final loss {loss_val:.4f}, "
            f"peak memory {mem:,.0f} MiB"
        )
        common.print_limits(_limits(args, device))
        if args.save_checkpoint:
            path = common.output_dir(args) / f"{args.model}.pt"
            torch.save(trainer.raw_model.state_dict(), path)
            print(f"saved weights to {path}")
    return common.EXIT_OK


def _limits(args: argparse.Namespace, device: torch.device) -> list[str]:
    tips = []
    if device.type == "cpu":
        tips.append("running on the CPU: figures say nothing about a GPU")
    if args.precision in ("fp32", "tf32"):
        tips.append(
            "fp32/tf32 leave the tensor cores mostly idle: try --precision bf16 "
            "(about 2-3x on a 4090/H100)"
        )
    if not args.channels_last:
        tips.append(
            "NCHW layout makes cuDNN transpose around every convolution: "
            "--channels-last roughly doubles bf16 throughput"
        )
    if not args.compile:
        tips.append(
            "eager mode launches each small kernel separately: --compile fuses "
            "the normalisation/activation kernels (~1.4x here)"
        )
    if args.data:
        tips.append(
            "real images are decoded on the CPU: if img/s is below the synthetic "
            "figure, run gpustation.runners.dataloader to see whether --workers "
            "starves the GPU"
        )
    if args.grad_accum > 1:
        tips.append(
            "gradient accumulation trades speed for memory: use the largest "
            "micro-batch that fits (gpustation.runners.batchsize)"
        )
    if not tips:
        tips.append(
            "this is the fast recipe; what remains is the GPU's compute and "
            "memory bandwidth (watch power and clocks in the dashboard for throttling)"
        )
    return tips


def _oom_hint(args: argparse.Namespace) -> str:
    return common.oom_advice(
        f"training {args.model} at batch {args.batch_size}",
        args.batch_size,
        extra=["--channels-last and --precision bf16 reduce activation memory"],
    )


def cli(argv: Sequence[str] | None = None) -> int:
    return common.run_main(main, build_parser(), argv, oom_hint=_oom_hint)


if __name__ == "__main__":
    sys.exit(cli())
