"""Does the input pipeline starve the GPU? Time waiting for data against time computing.

Trains an image model (ResNet-50 by default) on batches from a DataLoader and,
for every combination of ``--workers-list`` and pin_memory, times how long each
step waits for its batch and how long it computes. Images are real JPEG bytes
decoded and augmented on the CPU (a fixed set generated at start, or an
ImageFolder with ``--data``), as in ImageNet training. The verdict names the
cheapest setting that keeps the GPU fed, or says that none does.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from gpustation.runners.lib import common
from gpustation.runs.metrics import MetricsWriter

STARVED = 0.10  # waiting more than this fraction of a step counts as starving the GPU


def build_parser() -> argparse.ArgumentParser:
    parser = common.make_parser("dataloader", __doc__)
    common.add_training_args(
        parser, steps=30, batch_size=128, precision="bf16", compile_default=False
    )
    parser.add_argument(
        "--model", default="resnet50", help="torchvision model name, or 'tiny' (a small CNN)"
    )
    parser.add_argument("--data", default=None, help="an ImageFolder directory (default: JPEGs)")
    parser.add_argument("--image-size", type=int, default=224, help="crop side in pixels")
    parser.add_argument(
        "--source-size", type=int, default=320, help="side of the generated JPEGs before cropping"
    )
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument(
        "--workers-list",
        type=common.parse_int_list,
        default=None,
        help="comma-separated num_workers values to try (default: 0,2,4,8,... up to the CPUs)",
    )
    parser.add_argument(
        "--pin-memory-options",
        default="false,true",
        help="comma-separated pin_memory values to try (true/false)",
    )
    parser.add_argument("--prefetch", type=int, default=2, help="prefetch_factor per worker")
    parser.add_argument("--warmup-steps", type=int, default=3, help="untimed steps per setting")
    parser.add_argument(
        "--channels-last", action=argparse.BooleanOptionalAction, default=True, help="NHWC layout"
    )
    return parser


class JpegImages(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """A fixed set of JPEG-encoded images, decoded and augmented on every access."""

    def __init__(self, count: int, source_size: int, image_size: int, classes: int, seed: int):
        # start-up time: torchvision, only where it is used
        from torchvision.io import encode_jpeg

        g = torch.Generator().manual_seed(seed)
        self.jpegs = []
        for _ in range(count):
            # Smooth random content compresses like a photograph, unlike white noise.
            small = torch.randint(0, 256, (3, 8, 8), generator=g, dtype=torch.uint8)
            img = nn.functional.interpolate(
                small[None].float(), size=(source_size, source_size), mode="bicubic"
            )[0]
            self.jpegs.append(encode_jpeg(img.clamp(0, 255).to(torch.uint8), quality=90))
        self.labels = torch.randint(0, classes, (count,), generator=g)
        self.transform = _train_transform(image_size)
        self.length = max(count, 4096)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        # start-up time: torchvision, only where it is used
        from torchvision.io import decode_jpeg

        j = i % len(self.jpegs)
        return self.transform(decode_jpeg(self.jpegs[j])), int(self.labels[j])


def _train_transform(image_size: int) -> Any:
    # start-up time: torchvision, only where it is used
    from torchvision.transforms import v2

    return v2.Compose(
        [
            v2.RandomResizedCrop(image_size, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ]
    )


def _dataset(args: argparse.Namespace) -> torch.utils.data.Dataset[tuple[torch.Tensor, int]]:
    if args.data:
        # start-up time: torchvision, only where it is used
        import torchvision
        from torchvision.transforms import v2

        tf = v2.Compose([v2.ToImage(), _train_transform(args.image_size)])
        images: torch.utils.data.Dataset[tuple[torch.Tensor, int]] = (
            torchvision.datasets.ImageFolder(args.data, transform=tf)
        )
        return images
    return JpegImages(64, args.source_size, args.image_size, args.num_classes, args.seed)


def _model(args: argparse.Namespace) -> nn.Module:
    if args.model == "tiny":
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(16, args.num_classes),
        )
    # start-up time: torchvision, only where it is used
    import torchvision

    model: nn.Module = torchvision.models.get_model(args.model, num_classes=args.num_classes)
    return model


def _bool_list(text: str) -> list[bool]:
    out = []
    for v in text.split(","):
        v = v.strip().lower()
        if v in ("true", "1", "yes", "on"):
            out.append(True)
        elif v in ("false", "0", "no", "off"):
            out.append(False)
        elif v:
            raise common.RunnerError(f"--pin-memory-options: {v!r} is not true/false", 2)
    return out


def default_workers() -> list[int]:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpus = cpus or 1
    out = [0]
    w = 2
    while w <= cpus:
        out.append(w)
        w *= 2
    return out


def main(args: argparse.Namespace) -> int:
    device = common.pick_device(args.device)
    common.seed_everything(args.seed)
    prec = common.Precision(args.precision, device)
    prec.apply_backend_flags()
    torch.backends.cudnn.benchmark = True
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model = _model(args).to(device).to(memory_format=fmt)
    if args.compile:
        # torch types compile() as returning a callable; given a module it returns one
        model = torch.compile(model)  # type: ignore[assignment]
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = prec.scaler()
    loss_fn = nn.CrossEntropyLoss()
    dataset = _dataset(args)
    workers = args.workers_list or default_workers()
    pins = _bool_list(args.pin_memory_options)
    if device.type != "cuda":
        pins = [False]  # pinning only matters for host-to-GPU copies
    configs = [(w, p) for w in workers for p in pins]
    print(
        f"dataloader: {args.model} on {common.device_label(device)}, batch {args.batch_size}, "
        f"{args.precision}; data: {args.data or 'JPEGs decoded + augmented on the CPU'}; "
        f"trying num_workers {workers} x pin_memory {pins}",
        flush=True,
    )

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x.to(device, non_blocking=True, memory_format=fmt)
        y = y.to(device, non_blocking=True)
        with prec.autocast():
            loss: torch.Tensor = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    metrics = MetricsWriter.from_env()
    results: list[dict[str, Any]] = []
    with metrics:
        for n, (w, pin) in enumerate(configs, 1):
            common.maybe_simulate_oom(args, n)
            loader = torch.utils.data.DataLoader(
                dataset,
                batch_size=args.batch_size,
                shuffle=True,
                num_workers=w,
                pin_memory=pin,
                prefetch_factor=args.prefetch if w > 0 else None,
                drop_last=True,
                generator=torch.Generator().manual_seed(args.seed),
            )
            it = iter(loader)
            wait = compute = 0.0
            loss = torch.zeros(())
            # Warm-up steps let workers start and fill their prefetch queues,
            # which a real run pays only once per epoch.
            for s in range(args.warmup_steps + args.steps):
                t0 = time.perf_counter()
                try:
                    x, y = next(it)
                except StopIteration:
                    it = iter(loader)
                    x, y = next(it)
                t1 = time.perf_counter()
                loss = train_step(x, y)
                common.sync(device)
                t2 = time.perf_counter()
                if s >= args.warmup_steps:
                    wait += t1 - t0
                    compute += t2 - t1
            del it  # shuts the workers down before the next setting starts its own
            total = wait + compute
            r = {
                "num_workers": w,
                "pin_memory": pin,
                "img_per_s": args.batch_size * args.steps / max(total, 1e-9),
                "wait_ms_per_step": wait / args.steps * 1e3,
                "compute_ms_per_step": compute / args.steps * 1e3,
                "wait_fraction": wait / max(total, 1e-9),
            }
            r["starved"] = r["wait_fraction"] > STARVED
            results.append(r)
            metrics.log(
                step=n,
                total_steps=len(configs),
                loss=float(loss),
                throughput=r["img_per_s"],
                unit="img/s",
                mem_peak_mib=round(common.peak_memory_mib(device), 1),
                **{k: v for k, v in r.items() if k != "img_per_s"},
            )
            print(
                f"num_workers {w:>2} pin_memory {pin!s:>5}: {r['img_per_s']:8,.1f} img/s, "
                f"waiting {r['wait_ms_per_step']:7.1f} ms + computing "
                f"{r['compute_ms_per_step']:7.1f} ms per step "
                f"({r['wait_fraction']:.0%} waiting{', STARVED' if r['starved'] else ''})",
                flush=True,
            )
        verdict, pick = judge(results)
        metrics.summary(
            configs=results,
            starved_at_default=results[0]["starved"],
            starved_at_best=not any(not r["starved"] for r in results),
            recommended=pick,
            best_img_per_s=max(r["img_per_s"] for r in results),
            verdict=verdict,
            model=args.model,
            batch_size=args.batch_size,
            device=str(device),
        )
    print()
    common.print_table(
        ["workers", "pin", "img/s", "wait ms", "compute ms", "waiting"],
        [
            [
                r["num_workers"],
                r["pin_memory"],
                f"{r['img_per_s']:,.1f}",
                f"{r['wait_ms_per_step']:.1f}",
                f"{r['compute_ms_per_step']:.1f}",
                f"{r['wait_fraction']:.0%}",
            ]
            for r in results
        ],
    )
    common.print_limits([verdict])
    return common.EXIT_OK


def judge(results: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The verdict and the recommended setting.

    The recommendation is the cheapest setting (fewest workers, then no
    pinning) within 5% of the best throughput, so no CPU is spent for nothing.
    """
    best = max(r["img_per_s"] for r in results)
    good = [r for r in results if r["img_per_s"] >= 0.95 * best]
    pick = min(good, key=lambda r: (r["num_workers"], r["pin_memory"]))
    choice = {"num_workers": pick["num_workers"], "pin_memory": pick["pin_memory"]}
    setting = f"num_workers={pick['num_workers']}, pin_memory={pick['pin_memory']}"
    first = results[0]
    if pick["starved"]:
        most = max(r["num_workers"] for r in results)
        return (
            f"the input pipeline starves the GPU even at its best ({setting}: "
            f"{pick['wait_fraction']:.0%} of each step waiting, {most} workers tried): decode "
            "on the GPU (torchvision.io.decode_jpeg(device='cuda') or DALI), store images "
            "pre-resized, or cache decoded tensors; more CPU cores also help"
        ), choice
    if first["starved"]:
        return (
            f"with num_workers={first['num_workers']} the GPU waits "
            f"{first['wait_fraction']:.0%} of each step for data; {setting} fixes it "
            f"({pick['img_per_s']:,.0f} img/s, {pick['wait_fraction']:.0%} waiting)"
        ), choice
    return (
        f"the input pipeline keeps up: the step is compute-bound "
        f"({first['wait_fraction']:.0%} waiting at num_workers={first['num_workers']}); "
        f"{setting} is enough"
    ), choice


def cli(argv: Sequence[str] | None = None) -> int:
    return common.run_main(main, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(cli())
