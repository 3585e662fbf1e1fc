"""healthcheck, matmul, infer, dataloader and batchsize runners on the CPU."""

from __future__ import annotations

import pytest

from gpustation.runners import EXIT_OOM, batchsize, dataloader, infer
from tests.runners.conftest import RunInprocess, RunRunner


def test_healthcheck_on_cpu_passes_and_skips_gpu_checks(run_inprocess: RunInprocess) -> None:
    r = run_inprocess("healthcheck", "--device", "cpu", "--matmul-size", "64")
    assert r.returncode == 0, r.stderr
    s = r.summary
    statuses = {c["name"]: c["status"] for c in s["checks"]}
    assert statuses == {"GPU checks": "skip", "torch on the CPU": "pass"}
    assert s["ok"] is True and s["failed"] == 0
    assert "[PASS] torch on the CPU" in r.stdout


def test_healthcheck_without_a_gpu_fails_with_fixes(run_runner: RunRunner) -> None:
    # The child sees no GPU (CUDA_VISIBLE_DEVICES is empty), so the GPU checks fail.
    r = run_runner("healthcheck", "--matmul-size", "64")
    assert r.returncode == 1
    s = r.summary
    failed = [c for c in s["checks"] if c["status"] == "fail"]
    assert failed and all(c["fix"] for c in failed)
    assert s["ok"] is False and s["failed"] == len(failed)
    assert "fix:" in r.stdout and "What limits you" in r.stdout


def test_matmul_reports_a_precision_table(run_inprocess: RunInprocess) -> None:
    r = run_inprocess(
        "matmul", "--device", "cpu", "--sizes", "32,64", "--precisions", "fp32,bf16,fp8",
        "--steps", "5", "--copy-mib", "8",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    s = r.summary
    assert set(s["tflops"]) == {"fp32", "bf16", "fp8"}
    assert set(s["tflops"]["fp32"]) == {"32", "64"}
    assert all(v > 0 for v in s["tflops"]["fp32"].values())
    assert s["bf16_tflops"] == max(s["tflops"]["bf16"].values())
    assert s["fp8_tflops"] is None  # needs a CUDA GPU
    assert s["speedup_vs_fp32"]["fp32"] == pytest.approx(1.0)
    assert s["copy_bandwidth_gbs"] > 0
    assert [e["step"] for e in r.steps] == [1, 2, 3, 4]  # fp8 points are skipped
    assert "vs fp32" in r.stdout and "fp8 skipped" in r.stdout


def test_infer_sweep_reports_latency_percentiles(run_runner: RunRunner) -> None:
    r = run_runner(
        "infer", "--device", "cpu", "--model-preset", "tiny", "--batch-sizes", "1,3",
        "--prompt-len", "8", "--new-tokens", "4", "--steps", "3", "--precision", "fp32",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    sweep = r.summary["sweep"]
    assert [row["batch_size"] for row in sweep] == [1, 3]
    for row in sweep:
        assert 0 < row["ttft_ms_p50"] <= row["latency_ms_p50"] <= row["latency_ms_p99"]
        assert row["tokens_per_s"] > 0
    assert r.summary["best_batch_size"] in (1, 3)
    assert [round(e["throughput"], 3) for e in r.steps] == [row["tokens_per_s"] for row in sweep]


def test_percentile_interpolates() -> None:
    assert infer.percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert infer.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 99) == pytest.approx(4.96)
    assert infer.percentile([7.0], 99) == 7.0


def test_dataloader_finds_a_starved_pipeline(run_runner: RunRunner) -> None:
    # A one-layer model on small crops computes in well under a millisecond while
    # decoding 256 px JPEGs takes several: the step must be mostly waiting.
    r = run_runner(
        "dataloader", "--device", "cpu", "--model", "tiny", "--num-classes", "10",
        "--image-size", "32", "--source-size", "256", "--batch-size", "8", "--steps", "6",
        "--warmup-steps", "1", "--workers-list", "0,1", "--precision", "fp32",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    s = r.summary
    assert [(c["num_workers"], c["pin_memory"]) for c in s["configs"]] == [(0, False), (1, False)]
    first = s["configs"][0]
    assert first["wait_fraction"] > 0.5 and first["starved"] is True
    assert s["starved_at_default"] is True
    assert "starves the GPU" in s["verdict"] or "fixes it" in s["verdict"]
    assert len(r.steps) == 2 and all(e["unit"] == "img/s" for e in r.steps)


def test_dataloader_judge_recommends_cheapest_setting_that_keeps_up() -> None:
    def cfg(w: int, pin: bool, ips: float, wait: float) -> dict[str, object]:
        return {
            "num_workers": w, "pin_memory": pin, "img_per_s": ips,
            "wait_fraction": wait, "starved": wait > dataloader.STARVED,
        }  # fmt: skip

    verdict, pick = dataloader.judge(
        [cfg(0, False, 100, 0.8), cfg(4, False, 490, 0.02), cfg(8, True, 500, 0.01)]
    )
    assert pick == {"num_workers": 4, "pin_memory": False}
    assert "with num_workers=0 the GPU waits 80%" in verdict and "fixes it" in verdict
    verdict, pick = dataloader.judge([cfg(0, False, 100, 0.9), cfg(8, False, 300, 0.6)])
    assert pick["num_workers"] == 8 and "even at its best" in verdict
    verdict, _ = dataloader.judge([cfg(0, False, 100, 0.01)])
    assert "keeps up" in verdict


def test_batch_search_bisects_to_the_limit() -> None:
    for limit in (1, 7, 13, 64, 100):

        def fits(b: int, lim: int = limit) -> bool:
            return b <= lim

        best, tried = batchsize.search(fits, 4, 1000, 1)
        assert best == limit, (limit, tried)
    best, _ = batchsize.search(lambda b: b <= 37, 8, 1000, 8)
    assert best == 32  # a multiple of 8
    best, tried = batchsize.search(lambda b: True, 8, 50, 1)
    assert best == 50 and tried[-1] == 50  # stops at the cap
    assert batchsize.search(lambda b: False, 8, 50, 1)[0] == 0


def test_batchsize_runner_recovers_from_out_of_memory(run_runner: RunRunner) -> None:
    r = run_runner(
        "batchsize", "--workload", "resnet", "--device", "cpu", "--model", "resnet18",
        "--image-size", "32", "--num-classes", "10", "--batch-size", "2", "--steps", "1",
        "--multiple-of", "1", "--precision", "fp32", "--simulate-oom-above", "5",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    s = r.summary
    assert s["largest_batch"] == 5
    tried = [(t["batch_size"], t["fits"]) for t in s["trials"]]
    assert tried == [(2, True), (4, True), (8, False), (6, False), (5, True)]
    assert "largest resnet batch that fits: 5" in r.stdout


def test_batchsize_lora_workload_and_total_failure(run_inprocess: RunInprocess) -> None:
    r = run_inprocess(
        "batchsize", "--workload", "lora", "--device", "cpu", "--model-preset", "tiny",
        "--seq-len", "16", "--batch-size", "2", "--steps", "1", "--precision", "fp32",
        "--simulate-oom-above", "0",
    )  # fmt: skip
    # Nothing fits: the out-of-memory exit status and advice, after trying down to 1.
    assert r.returncode == EXIT_OOM
    assert "even batch 1 does not fit" in r.stderr
    assert [t["batch_size"] for t in r.summary["trials"]] == [2, 1]
