"""The FSDP runner on the CPU with gloo: alone, and sharded over two processes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from tests.runners.conftest import RunInprocess, RunRunner

TINY = (
    "--device", "cpu", "--model-preset", "tiny", "--seq-len", "16", "--batch-size", "2",
    "--warmup-steps", "1", "--log-every", "1", "--precision", "fp32",
)  # fmt: skip


def test_fsdp_lora_alone_reports_memory_and_writes_its_config(
    run_runner: RunRunner, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    r = run_runner("fsdp", *TINY, "--steps", "3", "--offload", "--output-dir", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    s = r.summary
    assert s["mode"] == "lora" and s["fsdp"].startswith("fully_shard")
    assert s["world_size"] == 1 and s["fsdp_units"] == 3  # two layers and the root
    assert 0 < s["trainable_params"] < s["params"]
    # Offload asked for, but on the CPU there is nowhere to offload to: said, not pretended.
    assert s["offload"] is True and s["offload_effective"] is False
    assert "--offload is ignored on the CPU" in r.stdout
    assert s["mem_peak_mib"] is None and s["host_rss_peak_mib"] > 0
    assert [e["step"] for e in r.steps] == [1, 2, 3]
    assert all(e["host_rss_mib"] > 0 and e["mem_peak_mib"] is None for e in r.steps)
    assert r.steps[-1]["throughput"] > 0 and s["tokens_per_s"] > 0
    config = (out / "fsdp_config.yaml").read_text()
    assert "distributed_type: FSDP" in config and "fsdp_offload_params: true" in config


@pytest.mark.slow
def test_fsdp_full_sharded_over_two_processes(run_runner: RunRunner) -> None:
    r = run_runner(
        "fsdp", *TINY, "--steps", "4", "--mode", "full", "--precision", "bf16",
        "--sharding", "grad-op", "--no-activation-checkpointing", accelerate=2,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    s = r.summary
    assert s["world_size"] == 2 and s["trainable_params"] == s["params"]
    # Each process holds about half of every weight.
    assert s["params"] * 0.45 < s["local_params"] <= s["params"] * 0.55
    steps = [e["step"] for e in r.steps]
    assert steps == [1, 2, 3, 4]  # one stream: rank 0 only
    assert r.stdout.count("What limits you") == 1


def test_find_max_model_stops_on_the_cpu(run_inprocess: RunInprocess) -> None:
    r = run_inprocess("fsdp", "--device", "cpu", "--find-max-model")
    assert r.returncode == 0
    assert r.summary["find_max_model"] is None and "CUDA" in r.summary["skipped"]


def test_fp16_is_refused_with_a_reason(run_inprocess: RunInprocess) -> None:
    r = run_inprocess("fsdp", *TINY, "--precision", "fp16")
    assert r.returncode == 2 and "bf16" in r.stderr


def test_find_max_search_doubles_then_bisects() -> None:
    from gpustation.runners.lib.fsdp_search import _next_layers

    assert _next_layers(None, None) == 1
    assert _next_layers(8, None) == 16
    assert _next_layers(16, 32) == 24
    assert _next_layers(16, 18) == 0  # within an eighth: done
    assert _next_layers(None, 8) == 4


def test_profile_steps_write_a_trace_and_top_ops(run_runner: RunRunner, tmp_path: Path) -> None:
    out = tmp_path / "prof"
    r = run_runner("fsdp", *TINY, "--steps", "4", "--profile-steps", "2", "--output-dir", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    trace = json.loads((out / "profile" / "trace.json").read_text())
    assert trace["traceEvents"]
    top = json.loads((out / "profile" / "top_ops.json").read_text())
    assert top["profiled_steps"] == 2 and top["step_ms"] > 0
    ops = top["cpu_ops"]
    assert 0 < len(ops) <= 15
    assert all(0 <= o["share"] <= 1 for o in ops)
    assert [o["self_ms"] for o in ops] == sorted((o["self_ms"] for o in ops), reverse=True)
    assert "cuda_kernels" not in top  # CPU ops only on the CPU
    s = r.summary
    assert s["profile_trace"].endswith("trace.json") and s["profile_steps"] == 2
    # The profiled steps are not timed: warm-up 1 + 2 profiled, 1 timed.
    assert s["timed_steps"] == 1


@pytest.mark.parametrize("modes", ["offload", "no-offload", "both"])
def test_find_max_model_searches_the_modes_asked_for(
    run_inprocess: RunInprocess, monkeypatch: pytest.MonkeyPatch, modes: str
) -> None:
    import torch

    from gpustation.runners.lib import common, fsdp_search

    # The search on a pretend GPU where up to 12 layers fit (24 with offload).
    tried: list[tuple[int, bool]] = []

    def trial(
        args: argparse.Namespace, layers: int, hidden: int, offload: bool, seconds: float
    ) -> dict[str, Any]:
        tried.append((layers, offload))
        if layers > (24 if offload else 12):
            return {"layers": layers, "fits": False, "why": "out of memory"}
        return {"layers": layers, "fits": True, "tokens_per_s": 1000.0 / layers,
                "params": layers * 1e8, "mem_peak_mib": 1.0, "host_rss_peak_mib": 1.0}  # fmt: skip

    monkeypatch.setattr(common, "pick_device", lambda _: torch.device("cuda"))
    monkeypatch.setattr(fsdp_search, "run_trial", trial)
    monkeypatch.setattr(fsdp_search, "available_ram_bytes", lambda: None)
    r = run_inprocess("fsdp", "--find-max-model", "--find-modes", modes, "--find-start-layers", "4")
    assert r.returncode == 0
    searched = {offload for _, offload in tried}
    assert searched == {"offload": {True}, "no-offload": {False}, "both": {False, True}}[modes]
    s = r.summary
    if modes != "no-offload":
        assert 21 <= s["offload_max_layers"] <= 24
    if modes != "offload":
        assert 11 <= s["no_offload_max_layers"] <= 12
    assert (s["offload_max_layers"] is None) is (modes == "no-offload")
