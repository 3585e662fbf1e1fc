"""Every shipped run preset names a runner and its arguments are accepted by that runner."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping
from pathlib import Path

import pytest

from gpustation.runners import runner_names
from gpustation.runs.launch.argv import format_args
from gpustation.runs.presets import load_preset_file

PRESETS = sorted((Path(__file__).parents[2] / "gpustation" / "presets" / "runs").glob("*.toml"))
EXPECTED = {
    "healthcheck", "matmul-precision", "resnet50-bf16", "resnet50-fp32-baseline", "lora-tiny",
    "lora-local-model", "infer-bench", "dataloader-probe", "batchsize-resnet50", "ddp-resnet50",
    "ddp-lora", "fsdp-lora", "fsdp-full", "burnin",
    "contention",
}  # fmt: skip


def _parser(runner: str, args: Mapping[str, object]) -> argparse.ArgumentParser:
    module = importlib.import_module(f"gpustation.runners.{runner}")
    if runner == "batchsize":
        parser: argparse.ArgumentParser = module.build_parser(args.get("workload", "resnet"))
    else:
        parser = module.build_parser()
    return parser


def test_all_expected_presets_ship() -> None:
    assert {p.stem for p in PRESETS} >= EXPECTED


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_preset_args_parse_with_its_runner(path: Path) -> None:
    preset, problems = load_preset_file(path)
    assert not problems and preset is not None, problems
    assert preset.runner in runner_names()
    parsed = _parser(preset.runner, preset.args).parse_args(format_args(preset.args))
    for key, value in preset.args.items():
        got = getattr(parsed, key)
        if isinstance(got, list):  # comma-separated lists
            got = ",".join(map(str, got))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert got == pytest.approx(value), key
        else:
            assert str(got) == str(value), key
    if preset.launcher == "torchrun":
        assert preset.runner in ("resnet", "lora") and preset.nproc_per_node == 2
