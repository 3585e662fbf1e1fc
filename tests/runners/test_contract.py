"""Every runner found on disk keeps the contract written in gpustation/runners/__init__.py."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import gpustation.runners
from gpustation.runners import EXIT_OOM, SHARED_OPTIONS, runner_names
from tests.conftest import child_env
from tests.runners.conftest import RunInprocess

RUNNERS = runner_names()
PACKAGE_DIR = Path(gpustation.runners.__file__).parent

# The smallest CPU run of each runner, for its step loop's maybe_simulate_oom; a
# runner without a step loop has the reason instead.
TINY_OOM_RUN: dict[str, tuple[str, ...] | str] = {
    "batchsize": (
        "--workload", "resnet", "--model", "resnet18", "--image-size", "32",
        "--num-classes", "10", "--batch-size", "2", "--steps", "1", "--precision", "fp32",
    ),
    "burnin": ("--minutes", "0.01"),
    "contention": (
        "--model-preset", "tiny", "--seq-len", "16", "--batch-size", "2", "--phase-seconds",
        "0.5", "--prompt-len", "8", "--new-tokens", "2", "--precision", "fp32",
    ),
    "dataloader": (
        "--model", "tiny", "--num-classes", "10", "--image-size", "32", "--source-size", "32",
        "--batch-size", "2", "--steps", "1", "--workers-list", "0", "--precision", "fp32",
    ),
    "fsdp": (
        "--model-preset", "tiny", "--seq-len", "16", "--batch-size", "2", "--steps", "2",
        "--precision", "fp32",
    ),
    "healthcheck": "no step loop: out of memory in a check is reported as that check failing",
    "infer": (
        "--model-preset", "tiny", "--batch-sizes", "1", "--prompt-len", "8", "--new-tokens", "2",
        "--steps", "1", "--precision", "fp32",
    ),
    "lora": (
        "--model-preset", "tiny", "--seq-len", "16", "--batch-size", "2", "--steps", "2",
        "--no-compile", "--precision", "fp32",
    ),
    "matmul": ("--sizes", "16", "--precisions", "fp32", "--steps", "1", "--copy-mib", "1"),
    "resnet": (
        "--model", "resnet18", "--image-size", "32", "--num-classes", "10", "--batch-size", "2",
        "--steps", "2", "--no-compile", "--precision", "fp32",
    ),
}  # fmt: skip


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"gpustation.runners.{name}")


def _parse(parser: argparse.ArgumentParser, *argv: str) -> argparse.Namespace:
    return parser.parse_args(list(argv))


def _rejects(parser: argparse.ArgumentParser, *argv: str) -> bool:
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(list(argv))
    return exc.value.code == 2


def test_runner_names_are_every_module_here_and_the_libraries_none() -> None:
    modules = {p.stem for p in PACKAGE_DIR.glob("*.py")} - {"__init__"}
    assert set(RUNNERS) == modules
    assert sorted(RUNNERS) == RUNNERS
    libraries = {p.stem for p in (PACKAGE_DIR / "lib").glob("*.py")} - {"__init__"}
    assert {"common", "llm", "checkpoint"} <= libraries
    assert not libraries & set(RUNNERS)


def test_the_runner_package_lists_runners_without_torch() -> None:
    code = (
        "import sys; from gpustation.runners import runner_names; names = runner_names(); "
        "assert 'torch' not in sys.modules, 'runner_names imported torch'; print(names)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == repr(RUNNERS)


@pytest.mark.parametrize("name", RUNNERS)
def test_runner_has_the_entry_points(name: str) -> None:
    module = _module(name)
    for attr in ("build_parser", "main", "cli"):
        assert callable(getattr(module, attr, None)), f"{name} has no {attr}()"
    parser = module.build_parser()
    assert isinstance(parser, argparse.ArgumentParser)
    assert parser.prog == f"python -m gpustation.runners.{name}"
    _parse(parser)  # every argument has a default: a preset may give none


@pytest.mark.parametrize("name", RUNNERS)
def test_help_as_the_launcher_starts_it(name: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", f"gpustation.runners.{name}", "--help"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith(f"usage: python -m gpustation.runners.{name}")
    assert "--device" in out and "--seed" in out and "--output-dir" in out
    assert f"{EXIT_OOM} out of memory" in out  # the exit status is documented
    assert "--simulate-oom" not in out  # test-only options stay hidden


@pytest.mark.parametrize("name", RUNNERS)
def test_shared_options_mean_the_same_everywhere(name: str) -> None:
    parser = _module(name).build_parser()
    defaults = vars(_parse(parser))
    have = {opt for opt in SHARED_OPTIONS if opt[2:].replace("-", "_") in defaults}
    assert {"--seed", "--device", "--output-dir"} <= have  # every runner has these

    assert defaults["seed"] == 0 and _parse(parser, "--seed", "5").seed == 5
    assert defaults["device"] is None
    assert _parse(parser, "--device", "cpu").device == "cpu"
    assert _parse(parser, "--device", "cuda").device == "cuda"
    assert _rejects(parser, "--device", "tpu")
    assert defaults["output_dir"] is None  # the run directory
    assert _parse(parser, "--output-dir", "/o").output_dir == "/o"
    for opt in ("--steps", "--batch-size"):
        if opt in have:
            dest = opt[2:].replace("-", "_")
            assert isinstance(defaults[dest], int), opt
            assert getattr(_parse(parser, opt, "7"), dest) == 7
            assert _rejects(parser, opt, "seven")
    if "--precision" in have:
        for p in ("fp32", "tf32", "fp16", "bf16"):
            assert _parse(parser, "--precision", p).precision == p
        assert _rejects(parser, "--precision", "fp64")
    if "--compile" in have:
        assert isinstance(defaults["compile"], bool)
        assert _parse(parser, "--compile").compile is True
        assert _parse(parser, "--no-compile").compile is False
    for opt in ("--model", "--data"):
        if opt in have:
            dest = opt[2:]
            assert getattr(_parse(parser, opt, "/some/path"), dest) == "/some/path"
    if "--data" in have:
        assert defaults["data"] is None  # built on the spot unless given


@pytest.mark.parametrize("name", RUNNERS)
def test_out_of_memory_leaving_main_exits_75(
    name: str, run_inprocess: RunInprocess, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    def out_of_memory(args: argparse.Namespace) -> int:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(_module(name), "main", out_of_memory)
    r = run_inprocess(name, "--device", "cpu")
    assert r.returncode == EXIT_OOM
    assert "out of memory" in r.stderr and "Try:" in r.stderr
    errors = [e for e in r.events if e.get("error") == "out_of_memory"]
    assert len(errors) == 1 and "Try:" in errors[0]["message"]


@pytest.mark.parametrize("name", RUNNERS)
def test_simulated_out_of_memory_in_the_step_loop_exits_75(
    name: str, run_inprocess: RunInprocess
) -> None:
    assert name in TINY_OOM_RUN, f"add the smallest CPU run of {name} to TINY_OOM_RUN"
    tiny = TINY_OOM_RUN[name]
    if isinstance(tiny, str):
        pytest.skip(tiny)
    r = run_inprocess(name, "--device", "cpu", *tiny, "--simulate-oom-at-step", "1")
    assert r.returncode == EXIT_OOM, r.stderr
    assert "out of memory" in r.stderr
    assert sum(e.get("error") == "out_of_memory" for e in r.events) == 1
    if name != "batchsize":  # batchsize sums up its trials, then says none fitted
        assert not any("summary" in e for e in r.events)
