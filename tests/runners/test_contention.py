"""The contention runner: training and inference alone, then together, on the CPU."""

from __future__ import annotations

import torch

from gpustation.runners import contention


def test_three_phases_with_each_workload_measured(run_runner) -> None:
    r = run_runner(
        "contention", "--device", "cpu", "--model-preset", "tiny", "--seq-len", "16",
        "--batch-size", "2", "--phase-seconds", "1", "--prompt-len", "8", "--new-tokens", "3",
        "--precision", "fp32",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert [e["phase"] for e in r.steps] == ["train", "infer", "both"]
    assert [e["step"] for e in r.steps] == [1, 2, 3]
    train, infer, both = r.steps
    assert train["train_tokens_per_s"] > 0 and "infer_latency_ms_p50" not in train
    assert infer["infer_latency_ms_p99"] >= infer["infer_latency_ms_p50"] > 0
    assert both["train_tokens_per_s"] > 0 and both["infer_tokens_per_s"] > 0
    s = r.summary
    ratio = s["train_alone_tokens_per_s"] / s["train_shared_tokens_per_s"]
    assert abs(s["train_slowdown"] - ratio) < 0.01 * ratio
    assert s["infer_p99_slowdown"] > 0 and s["infer_tokens_slowdown"] > 0
    assert s["advice"] and "CPU" in s["advice"][0]
    assert "What limits you" in r.stdout


def test_advice_names_mps_a_lower_batch_and_separate_gpus_when_sharing_hurts() -> None:
    tips = " ".join(contention.advice(1.8, 1.4, 3.0, torch.device("cuda", 0)))
    assert "MPS" in tips and "--batch-size" in tips and "own GPU" in tips
    calm = contention.advice(1.05, 1.02, 1.1, torch.device("cuda", 0))
    assert len(calm) == 1 and "barely" in calm[0]
