"""ResNet runner end to end on the CPU at tiny sizes, and its out-of-memory path."""

from __future__ import annotations

import math
from pathlib import Path

from gpustation.runners import EXIT_OOM
from tests.runners.conftest import RunInprocess, RunRunner

TINY = (
    "--device", "cpu", "--model", "resnet18", "--image-size", "32", "--num-classes", "10",
    "--batch-size", "4", "--no-compile", "--log-every", "2", "--warmup-steps", "1",
)  # fmt: skip


def test_resnet_reports_throughput_loss_and_memory(run_runner: RunRunner) -> None:
    r = run_runner("resnet", *TINY, "--steps", "6", "--precision", "fp32")
    assert r.returncode == 0, r.stderr
    s = r.summary
    assert s["img_per_s"] > 0
    assert s["world_size"] == 1 and s["batch_size"] == 4
    assert s["mem_peak_mib"] > 0
    # what the model and optimizer hold before the first step, said once, ahead of the steps
    (static,) = [e for e in r.events if "mem_static_mib" in e]
    assert r.events.index(static) < r.events.index(r.steps[0])
    assert 0 < static["mem_static_mib"] <= s["mem_peak_mib"] and "step" not in static
    # One fixed synthetic batch: the network memorises it, so the loss must fall.
    assert s["final_loss"] < s["first_loss"]
    steps = [e["step"] for e in r.steps]
    assert steps == [1, 2, 4, 6]
    assert all(e["total_steps"] == 6 and e["unit"] == "img/s" for e in r.steps)
    # Warm-up steps are not timed, so the first line has no throughput.
    assert r.steps[0]["throughput"] is None and r.steps[-1]["throughput"] > 0
    assert "What limits you" in r.stdout and "--precision bf16" in r.stdout


def test_resnet_bf16_with_accumulation(run_runner: RunRunner) -> None:
    r = run_runner(
        "resnet", *TINY, "--steps", "3", "--precision", "bf16", "--grad-accum", "2",
        "--no-channels-last",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.summary["precision"] == "bf16" and r.summary["channels_last"] is False
    assert math.isfinite(r.summary["final_loss"])


def test_out_of_memory_gives_advice_and_its_own_exit_status(run_runner: RunRunner) -> None:
    r = run_runner("resnet", *TINY, "--steps", "5", "--simulate-oom-at-step", "3")
    assert r.returncode == EXIT_OOM
    assert "out of memory while training resnet18 at batch 4" in r.stderr
    assert "--batch-size 2" in r.stderr and "--grad-accum 2" in r.stderr
    errors = [e for e in r.events if e.get("error") == "out_of_memory"]
    assert len(errors) == 1 and "--batch-size 2" in errors[0]["message"]
    # Steps before the failure were recorded; no summary was written.
    assert [e["step"] for e in r.steps] == [1, 2]
    assert not any("summary" in e for e in r.events)


def test_grad_accum_must_divide_batch(run_inprocess: RunInprocess) -> None:
    r = run_inprocess("resnet", *TINY, "--steps", "2", "--grad-accum", "3")
    assert r.returncode == 2
    assert "multiple of --grad-accum" in r.stderr


def test_each_rank_gets_its_own_synthetic_batch() -> None:
    import argparse

    import torch

    from gpustation.runners.resnet import synthetic_batches

    args = argparse.Namespace(seed=0, image_size=8, num_classes=10, channels_last=False)
    cpu = torch.device("cpu")
    x0, _ = next(synthetic_batches(args, cpu, 2, rank=0))
    x0_again, _ = next(synthetic_batches(args, cpu, 2, rank=0))
    x1, _ = next(synthetic_batches(args, cpu, 2, rank=1))
    assert torch.equal(x0, x0_again)  # reproducible from the seed
    assert not torch.equal(x0, x1)  # but not the same data on every rank


def test_trains_from_an_image_folder_with_workers(run_runner: RunRunner, tmp_path: Path) -> None:
    import random

    from PIL import Image

    root = tmp_path / "images"
    rng = random.Random(0)
    for label in ("cats", "dogs"):
        (root / label).mkdir(parents=True)
        for i in range(6):
            img = Image.new("RGB", (40, 40), tuple(rng.randrange(256) for _ in range(3)))
            img.save(root / label / f"{i}.png")
    r = run_runner(
        *("resnet", "--device", "cpu", "--model", "resnet18", "--num-classes", "2"),
        *("--image-size", "32", "--batch-size", "4", "--steps", "5", "--warmup-steps", "1"),
        *("--no-compile", "--precision", "fp32", "--data", str(root), "--workers", "1"),
        *("--persistent-workers", "--prefetch", "2", "--log-every", "1"),
    )
    assert r.returncode == 0, r.stderr
    # 12 images make 3 batches of 4 per epoch: 5 steps cross an epoch boundary.
    assert [e["step"] for e in r.steps] == [1, 2, 3, 4, 5]
    assert r.summary["img_per_s"] > 0
    assert "run gpustation.runners.dataloader" in r.stdout
