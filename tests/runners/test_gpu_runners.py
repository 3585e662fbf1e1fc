"""The runners on a real GPU at small sizes: compile, bf16, fp8, pinned memory, real OOM.

Skipped without CUDA. They only compute: no GPU setting is changed.
"""

from __future__ import annotations

import math

import pytest

from tests.runners.conftest import RunRunner

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_healthcheck_passes_on_a_working_gpu(run_runner: RunRunner) -> None:
    r = run_runner("healthcheck", gpu=True)
    assert r.returncode == 0, r.stdout + r.stderr
    s = r.summary
    names = [c["name"] for c in s["checks"]]
    assert "NVIDIA driver" in names and "NCCL" in names
    assert sum(n.startswith("matmul on cuda:") for n in names) == torch.cuda.device_count()
    assert all(c["status"] == "pass" for c in s["checks"])


def test_resnet_bf16_channels_last_compiled(run_runner: RunRunner) -> None:
    r = run_runner(
        "resnet", "--model", "resnet18", "--image-size", "64", "--batch-size", "64",
        "--steps", "30", "--warmup-steps", "10", "--precision", "bf16", "--channels-last",
        "--compile", "--num-classes", "100", gpu=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    s = r.summary
    assert s["device"].startswith("cuda") and s["img_per_s"] > 1000
    assert s["final_loss"] < s["first_loss"]
    assert 0 < s["mem_peak_mib"] < torch.cuda.get_device_properties(0).total_memory / 2**20


def test_lora_default_model_compiled_bf16(run_runner: RunRunner) -> None:
    r = run_runner(
        "lora", "--model-preset", "default", "--batch-size", "16", "--seq-len", "256",
        "--steps", "60", "--warmup-steps", "10", "--log-every", "10", "--precision", "bf16",
        "--compile", gpu=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    s = r.summary
    assert s["final_loss"] < s["first_loss"] - 0.5
    assert s["adapter_reload_ok"] is True
    assert s["tokens_per_s"] > 10_000


def test_matmul_bf16_beats_fp32_and_fp8_runs_where_supported(run_runner: RunRunner) -> None:
    r = run_runner(
        "matmul", "--sizes", "2048,4096", "--precisions", "fp32,bf16,fp8", "--seconds", "0.2",
        "--copy-mib", "256", gpu=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    s = r.summary
    assert s["bf16_tflops"] > 2 * s["fp32_tflops"]
    if torch.cuda.get_device_capability(0) >= (8, 9):
        assert s["fp8_tflops"] is not None and s["fp8_tflops"] > s["bf16_tflops"]
    assert s["copy_bandwidth_gbs"] > 100


def test_infer_sweep_on_gpu(run_runner: RunRunner) -> None:
    r = run_runner(
        "infer", "--batch-sizes", "1,8", "--prompt-len", "64", "--new-tokens", "32",
        "--steps", "5", gpu=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = r.summary["sweep"]
    assert rows[1]["tokens_per_s"] > rows[0]["tokens_per_s"]  # batching shares weight reads
    assert all(math.isfinite(x["latency_ms_p99"]) for x in rows)


def test_dataloader_probe_with_pinned_memory(run_runner: RunRunner) -> None:
    r = run_runner(
        "dataloader", "--model", "resnet18", "--image-size", "64", "--source-size", "128",
        "--batch-size", "32", "--steps", "5", "--workers-list", "0,2", gpu=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    configs = r.summary["configs"]
    assert {(c["num_workers"], c["pin_memory"]) for c in configs} == {
        (0, False),
        (0, True),
        (2, False),
        (2, True),
    }


def test_batchsize_recovers_from_real_out_of_memory(run_runner: RunRunner) -> None:
    # A 6 GiB cap makes ResNet-50 run out of memory at a few hundred images.
    frac = min(0.9, 6 * 2**30 / torch.cuda.get_device_properties(0).total_memory)
    r = run_runner(
        "batchsize", "--workload", "resnet", "--model", "resnet50", "--batch-size", "32",
        "--steps", "1", "--precision", "bf16", "--memory-fraction", f"{frac:.4f}", gpu=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    s = r.summary
    failed = [t for t in s["trials"] if not t["fits"]]
    assert failed and "simulated" not in failed[0]["error"]
    assert 32 <= s["largest_batch"] < min(t["batch_size"] for t in failed)


def test_burnin_reads_nvml_and_passes_on_a_healthy_gpu(run_runner: RunRunner) -> None:
    r = run_runner("burnin", "--minutes", "0.3", "--mem-fraction", "0.5", gpu=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = r.summary
    assert s["result"] == "pass" and s["nvml"] is True
    assert s["matmul_mismatches"] == 0 and s["memory_errors"] == 0 and s["copy_errors"] == 0
    assert s["pcie_gen_under_load"] and s["peak_temp_c"] and s["power_limit_w"]
    assert s["h2d_gbs"] > 5 and s["d2h_gbs"] > 5  # both directions from pinned memory


def test_cuda_graphs_speed_up_small_resnet_steps(run_runner: RunRunner) -> None:
    common = ("--model", "resnet18", "--image-size", "64", "--batch-size", "16",
              "--num-classes", "100", "--steps", "40", "--warmup-steps", "10",
              "--precision", "bf16", "--no-compile")  # fmt: skip
    eager = run_runner("resnet", *common, gpu=True)
    graphs = run_runner("resnet", *common, "--cuda-graphs", gpu=True)
    assert eager.returncode == 0 and graphs.returncode == 0, graphs.stderr[-3000:]
    assert graphs.summary["cuda_graphs"] is True
    assert graphs.summary["img_per_s"] > eager.summary["img_per_s"]
    assert graphs.summary["final_loss"] < graphs.summary["first_loss"]  # it still trains


def test_infer_cuda_graphs_lower_ms_per_token(run_runner: RunRunner) -> None:
    common = ("--batch-sizes", "1", "--prompt-len", "32", "--new-tokens", "32", "--steps", "3")
    eager = run_runner("infer", *common, gpu=True)
    graphs = run_runner("infer", *common, "--cuda-graphs", gpu=True)
    assert eager.returncode == 0 and graphs.returncode == 0, graphs.stderr[-3000:]
    e, g = eager.summary["sweep"][0], graphs.summary["sweep"][0]
    assert graphs.summary["static_cache"] is True
    assert g["per_token_ms_p50"] < e["per_token_ms_p50"]


def test_fsdp_offload_moves_the_training_state_to_the_host(run_runner: RunRunner) -> None:
    common = ("--model-preset", "default", "--mode", "full", "--batch-size", "4",
              "--seq-len", "256", "--steps", "6", "--warmup-steps", "2")  # fmt: skip
    on_gpu = run_runner("fsdp", *common, "--no-offload", gpu=True)
    offload = run_runner("fsdp", *common, "--offload", gpu=True)
    assert on_gpu.returncode == 0 and offload.returncode == 0, offload.stderr[-3000:]
    assert offload.summary["offload_effective"] is True
    assert offload.summary["mem_peak_mib"] < on_gpu.summary["mem_peak_mib"]
    assert offload.summary["host_rss_peak_mib"] > on_gpu.summary["host_rss_peak_mib"]
