"""The contention runner: training and inference alone, then together, on the CPU."""

from __future__ import annotations

import torch

from gpustation.runners import contention
from tests.runners.conftest import RunRunner


def test_three_phases_with_each_workload_measured(run_runner: RunRunner) -> None:
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
    # One run with three phases: the summary lists them with the lines' figures.
    assert [p["phase"] for p in s["phases"]] == ["train", "infer", "both"]
    for line, phase in zip(r.steps, s["phases"], strict=True):
        assert {k: v for k, v in phase.items() if "slowdown" not in k} == {
            k: v for k, v in line.items() if k not in ("t", "time", "step", "total_steps")
        }
    assert s["phases"][2]["train_slowdown"] == s["train_slowdown"]
    assert "train_slowdown" not in s["phases"][0]
    # On the CPU the GPU figures are unknown, not zero, and the summary says why.
    for phase in (*r.steps, *s["phases"]):
        for key in ("power_w_mean", "power_w_peak", "util_pct_mean", "sm_pct_train",
                    "sm_pct_infer"):  # fmt: skip
            assert phase[key] is None, (key, phase)
        assert phase["gpu_note"] == phase["sm_note"] == "no GPU"
    assert s["gpu_note"] == s["sm_note"] == "no GPU"
    assert s["shared_sm_pct_train"] is None
    assert "SM % train/infer" in r.stdout
    assert "power, utilisation and SM shares: no GPU" in r.stdout


def test_advice_names_mps_a_lower_batch_and_separate_gpus_when_sharing_hurts() -> None:
    tips = " ".join(contention.advice(1.8, 1.4, 3.0, torch.device("cuda", 0)))
    assert "MPS" in tips and "--batch-size" in tips and "own GPU" in tips
    calm = contention.advice(1.05, 1.02, 1.1, torch.device("cuda", 0))
    assert len(calm) == 1 and "barely" in calm[0]


def test_advice_uses_the_measured_sm_shares() -> None:
    shares = contention.Shares(train_shared=68.0, infer_shared=30.0, infer_alone=42.0)
    tips = " ".join(contention.advice(1.8, 1.4, 3.0, torch.device("cuda", 0), shares))
    assert "inference got 30 % of the SMs while training ran (training 68 %)" in tips
    # leave inference what it used alone: 100 - 42 -> 60 % for training, in steps of 10
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60 for the training process" in tips
    assert "the 42 % of the SMs it used alone" in tips
    # Unmeasured shares: the advice in general words, no number made up.
    general = " ".join(contention.advice(1.8, 1.4, 3.0, torch.device("cuda", 0), None))
    assert "MPS" in general and "% of the SMs" not in general
    assert contention.mps_cap(95.0) == 10 and contention.mps_cap(3.0) == 90
