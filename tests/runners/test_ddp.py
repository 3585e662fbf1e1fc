"""Data-parallel runs with two processes on gloo write one metrics stream (rank 0)."""

from __future__ import annotations

import pytest

from tests.runners.conftest import RunResult, RunRunner

pytestmark = pytest.mark.slow


def _one_stream(r: RunResult) -> None:
    assert r.returncode == 0, r.stderr[-3000:]
    # one training line and at most one eval line per step: rank 0 alone writes
    for kind in ("loss", "eval_loss"):
        steps = [e["step"] for e in r.steps if kind in e]
        assert steps == sorted(set(steps)), f"duplicate {kind} lines from several ranks: {steps}"
    assert r.summary["world_size"] == 2


def test_ddp_resnet_two_processes(run_runner: RunRunner) -> None:
    r = run_runner(
        "resnet", "--device", "cpu", "--model", "resnet18", "--image-size", "32",
        "--num-classes", "10", "--batch-size", "4", "--steps", "4", "--warmup-steps", "1",
        "--log-every", "2", "--no-compile", "--precision", "fp32", torchrun=2,
    )  # fmt: skip
    _one_stream(r)
    assert r.summary["global_batch"] == 8
    assert r.stdout.count("What limits you") == 1  # only rank 0 talks


def test_ddp_lora_two_processes(run_runner: RunRunner) -> None:
    r = run_runner(
        "lora", "--device", "cpu", "--model-preset", "tiny", "--seq-len", "32",
        "--batch-size", "4", "--steps", "4", "--warmup-steps", "1", "--log-every", "2",
        "--no-compile", "--precision", "fp32", torchrun=2,
    )  # fmt: skip
    _one_stream(r)
    assert r.summary["adapter_reload_ok"] is True
    assert r.stdout.count("saved adapter to") == 1


def test_accelerate_launch_works_the_same(run_runner: RunRunner) -> None:
    # accelerate launch exports the same RANK/WORLD_SIZE/MASTER_* variables as torchrun.
    r = run_runner(
        "resnet", "--device", "cpu", "--model", "resnet18", "--image-size", "32",
        "--num-classes", "10", "--batch-size", "4", "--steps", "2", "--warmup-steps", "1",
        "--log-every", "1", "--no-compile", "--precision", "fp32", accelerate=2,
    )  # fmt: skip
    _one_stream(r)
