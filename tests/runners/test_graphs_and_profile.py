"""CUDA graphs are refused on the CPU; the static KV cache decodes like the dynamic one;
--profile-steps works in the resnet and lora runners."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runners.conftest import RunInprocess, RunRunner

RESNET = (
    "--device", "cpu", "--model", "resnet18", "--image-size", "32", "--num-classes", "10",
    "--batch-size", "2", "--no-compile", "--precision", "fp32", "--warmup-steps", "1",
)  # fmt: skip
INFER = (
    "--device", "cpu", "--model-preset", "tiny", "--prompt-len", "8", "--new-tokens", "5",
    "--steps", "2", "--warmup-requests", "1", "--precision", "fp32",
)  # fmt: skip


@pytest.mark.parametrize("runner,args", [("resnet", RESNET), ("infer", INFER)])
def test_cuda_graphs_are_refused_on_the_cpu(
    run_inprocess: RunInprocess, runner: str, args: list[str]
) -> None:
    r = run_inprocess(runner, *args, "--steps", "2", "--cuda-graphs")
    assert r.returncode == 2
    assert "--cuda-graphs refused" in r.stderr and "CUDA" in r.stderr
    assert not any("summary" in e for e in r.events)


def test_resnet_refuses_cuda_graphs_with_fp16_before_building_anything() -> None:
    import argparse

    import torch

    from gpustation.runners import resnet
    from gpustation.runners.lib import common

    args = argparse.Namespace(precision="fp16")
    with pytest.raises(common.RunnerError, match="grad scaler"):
        resnet.check_cuda_graphs(args, torch.device("cuda", 0), None)


def test_static_cache_generates_the_same_tokens_as_the_dynamic_one() -> None:
    import torch

    from gpustation.runners import infer
    from gpustation.runners.lib import llm

    cpu = torch.device("cpu")
    model = llm.build_from_preset("tiny", 0, cpu, torch.float32, 64).model.eval()
    from transformers import StaticCache

    prompts = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    _, _, dynamic = infer.generate_timed(model, prompts, 6, cpu)
    cache = StaticCache(config=model.config, max_cache_len=14)
    for _ in range(2):  # the cache is reset between requests
        _, _, static = infer.generate_static(model, model, cache, prompts, 6, cpu)
        assert torch.equal(static, dynamic)


def test_infer_static_cache_sweep(run_inprocess: RunInprocess) -> None:
    r = run_inprocess("infer", *INFER, "--batch-sizes", "1,2", "--static-cache")
    assert r.returncode == 0, r.stderr
    s = r.summary
    assert s["static_cache"] is True and s["cuda_graphs"] is False
    assert [row["batch_size"] for row in s["sweep"]] == [1, 2]
    assert all(row["per_token_ms_p50"] > 0 for row in s["sweep"])


@pytest.mark.parametrize("runner", ["resnet", "lora"])
def test_profile_steps_in_the_training_runners(
    run_runner: RunRunner, tmp_path: Path, runner: str
) -> None:
    out = tmp_path / runner
    args = RESNET if runner == "resnet" else (
        "--device", "cpu", "--model-preset", "tiny", "--seq-len", "16", "--batch-size", "2",
        "--no-compile", "--precision", "fp32", "--warmup-steps", "1", "--no-save-adapter",
    )  # fmt: skip
    r = run_runner(runner, *args, "--steps", "3", "--profile-steps", "1", "--output-dir", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    top = json.loads((out / "profile" / "top_ops.json").read_text())
    assert top["profiled_steps"] == 1 and top["cpu_ops"]
    names = {o["name"] for o in top["cpu_ops"]}
    assert any(n.startswith("aten::") for n in names)
    assert (out / "profile" / "trace.json").stat().st_size > 0
    assert r.summary["profile_steps"] == 1 and r.summary["profile_top_op"] in names
