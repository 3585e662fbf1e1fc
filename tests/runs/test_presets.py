"""Preset loading, validation, overrides, argv and GPU selection."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import gpustation.runners
from gpustation.errors import UsageError
from gpustation.runs.launch.argv import build_argv, build_env, format_args, resolve_gpus
from gpustation.runs.presets import (
    PresetProblem,
    RunPreset,
    apply_overrides,
    find_preset,
    load_preset_file,
    load_presets,
)


@pytest.fixture
def fake_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module gpustation.runners.fake_tiny that exists on disk only for this test."""
    extra = tmp_path / "runners_extra"
    extra.mkdir()
    (extra / "fake_tiny.py").write_text("raise SystemExit('must not be imported')\n")
    monkeypatch.setattr(gpustation.runners, "__path__", [*gpustation.runners.__path__, str(extra)])
    return "fake_tiny"


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    path.write_text(text)
    return path


def test_good_and_bad_presets_load_side_by_side(tmp_path: Path, fake_runner: str) -> None:
    d = tmp_path / "p"
    write(d, "good", f'runner = "{fake_runner}"\ntitle = "Good one"\n[args]\nbatch_size = 8\n')
    write(d, "cmd", 'command = ["echo", "hi"]\ngpus = [0, 1]\n[env]\nFOO = "1"\n')
    write(d, "syntax", 'title = "x"\n\nrunner = "unterminated\nz = 1\n')
    write(d, "unknown", f'runner = "{fake_runner}"\ntitel = "typo"\n')
    write(d, "wrongtype", 'command = ["x"]\ngpus = "two"\nnnodes = true\n[env]\nN = 4\n')
    write(d, "norunner", 'title = "nothing to run"\n')
    write(d, "missingmod", 'title = "x"\nrunner = "no_such_runner_here"\n')
    write(d, "both", f'runner = "{fake_runner}"\ncommand = ["x"]\n')
    write(d, "badlauncher", 'command = ["x"]\nlauncher = "mpirun"\n')

    presets, problems = load_presets([("package", d)])

    assert sorted(presets) == ["cmd", "good"]
    assert presets["good"].display_title == "Good one"
    assert presets["cmd"].gpus == [0, 1] and presets["cmd"].env == {"FOO": "1"}
    by_file: dict[str, list[PresetProblem]] = {}
    for p in problems:
        by_file.setdefault(Path(p.path).stem, []).append(p)
    assert set(by_file) == {
        "syntax",
        "unknown",
        "wrongtype",
        "norunner",
        "missingmod",
        "both",
        "badlauncher",
    }
    (syntax,) = by_file["syntax"]
    assert syntax.line == 3 and "TOML syntax error" in syntax.message
    (unknown,) = by_file["unknown"]
    assert unknown.key == "titel" and unknown.line == 2 and "'title'" in unknown.message
    wrong = {p.key: p for p in by_file["wrongtype"]}
    assert set(wrong) == {"gpus", "nnodes", "env.N"}
    assert wrong["gpus"].line == 2 and "GPU count or a list" in wrong["gpus"].message
    assert wrong["nnodes"].line == 3
    assert wrong["env.N"].line == 5 and "string" in wrong["env.N"].message
    assert "missing runner" in by_file["norunner"][0].message
    assert "gpustation.runners.no_such_runner_here" in by_file["missingmod"][0].message
    assert by_file["missingmod"][0].line == 2
    assert "not both" in by_file["both"][0].message
    assert "mpirun" in by_file["badlauncher"][0].message
    # Rendered, a problem names file and line.
    assert str(syntax).startswith(f"{d / 'syntax.toml'}:3:")


def test_user_preset_of_the_same_name_wins(tmp_path: Path) -> None:
    pkg, user = tmp_path / "pkg", tmp_path / "user"
    write(pkg, "same", 'command = ["pkg"]\n')
    write(pkg, "only-pkg", 'command = ["pkg"]\n')
    write(user, "same", 'command = ["user"]\n')
    presets, problems = load_presets([("package", pkg), ("user", user)])
    assert not problems
    assert presets["same"].command == ["user"] and presets["same"].origin == "user"
    assert presets["only-pkg"].origin == "package"


def test_name_defaults_to_file_name_and_can_be_set(tmp_path: Path) -> None:
    preset, _ = load_preset_file(write(tmp_path, "file-name", 'command = ["x"]\n'))
    assert preset is not None and preset.name == "file-name"
    preset, _ = load_preset_file(write(tmp_path, "other", 'name = "given"\ncommand = ["x"]\n'))
    assert preset is not None and preset.name == "given"


def test_runner_check_does_not_import_the_module(fake_runner: str, tmp_path: Path) -> None:
    # The fake module raises SystemExit when imported; loading must not do that.
    preset, problems = load_preset_file(write(tmp_path, "r", f'runner = "{fake_runner}"\n'))
    assert not problems and preset is not None
    assert f"gpustation.runners.{fake_runner}" not in sys.modules


def test_overrides_are_typed_by_the_defaults() -> None:
    preset = RunPreset(
        name="p",
        command=["x"],
        args={"batch_size": 32, "lr": 0.1, "compile": True, "model": "r50", "sizes": [1, 2]},
    )
    new, parsed, warnings = apply_overrides(
        preset,
        ["batch-size=64", "lr=3e-4", "compile=false", "model=vit", "sizes=4,8,16", "extra=7"],
    )
    assert new.args == {
        "batch_size": 64,
        "lr": 0.0003,
        "compile": False,
        "model": "vit",
        "sizes": [4, 8, 16],
        "extra": "7",
    }
    assert parsed["batch_size"] == 64 and parsed["extra"] == "7"
    assert len(warnings) == 1 and "extra" in warnings[0]
    assert preset.args["batch_size"] == 32, "the original preset is left alone"


def test_an_unknown_key_set_to_true_or_false_is_a_switch() -> None:
    from gpustation.runs.launch.argv import format_args

    preset = RunPreset(name="p", command=["x"], args={"steps": 10})
    new, parsed, warnings = apply_overrides(preset, ["merge=true", "verify=off", "seed=1"])
    assert parsed == {"merge": True, "verify": False, "seed": "1"}  # digits stay text
    assert format_args(new.args) == ["--steps", "10", "--merge", "--no-verify", "--seed", "1"]
    assert "as a switch" in warnings[0] and "as a string" in warnings[2]


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ("batch_size=big", ["batch_size", "big", "whole number"]),
        ("lr=fast", ["lr", "fast", "number"]),
        ("compile=maybe", ["compile", "maybe", "true or false"]),
        ("novalue", ["key=value"]),
    ],
)
def test_bad_override_names_key_value_and_type(item: str, words: list[str]) -> None:
    preset = RunPreset(name="p", command=["x"], args={"batch_size": 32, "lr": 0.1, "compile": True})
    with pytest.raises(UsageError) as err:
        apply_overrides(preset, [item])
    for word in words:
        assert word in str(err.value)


def test_find_preset_lists_near_names() -> None:
    presets = {n: RunPreset(name=n, command=["x"]) for n in ("resnet50-bf16", "resnet50-fp32")}
    with pytest.raises(UsageError) as err:
        find_preset("resnet50", presets)
    assert err.value.exit_code == 2
    assert "resnet50-bf16" in str(err.value) and "resnet50-fp32" in str(err.value)


def test_format_args() -> None:
    assert format_args(
        {"batch_size": 64, "compile": True, "amp": False, "lr": 0.5, "sizes": [1, 2], "m": "a b"}
    ) == [
        "--batch-size",
        "64",
        "--compile",
        "--no-amp",
        "--lr",
        "0.5",
        "--sizes",
        "1",
        "2",
        "--m",
        "a b",
    ]


def test_argv_for_each_launcher() -> None:
    py = "/py"
    base: dict[str, Any] = dict(name="p", runner="resnet", args={"steps": 3})
    assert build_argv(RunPreset(**base), [0], python=py) == [
        py,
        "-P",
        "-m",
        "gpustation.runners.resnet",
        "--steps",
        "3",
    ]
    torchrun = build_argv(RunPreset(**base, launcher="torchrun"), [0, 1], python=py)
    assert torchrun[:6] == [py, "-P", "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    assert "--standalone" in torchrun
    assert torchrun[-4:] == ["-m", "gpustation.runners.resnet", "--steps", "3"]
    multi = build_argv(
        RunPreset(
            **base,
            launcher="torchrun",
            nproc_per_node=8,
            nnodes=2,
            node_rank=1,
            rdzv_backend="c10d",
            rdzv_endpoint="head:29400",
            rdzv_id="job7",
        ),
        [0],
        python=py,
    )
    assert "--standalone" not in multi
    for pair in (
        ["--nproc_per_node", "8"],
        ["--nnodes", "2"],
        ["--node_rank", "1"],
        ["--rdzv_backend", "c10d"],
        ["--rdzv_endpoint", "head:29400"],
        ["--rdzv_id", "job7"],
    ):
        i = multi.index(pair[0])
        assert multi[i : i + 2] == pair
    acc = build_argv(RunPreset(**base, launcher="accelerate"), [0, 1, 2], python=py)
    assert acc[:6] == [py, "-P", "-m", "accelerate.commands.launch", "--num_processes", "3"]
    assert "--multi_gpu" in acc
    assert acc[acc.index("-m", 3) :] == ["-m", "gpustation.runners.resnet", "--steps", "3"]
    cmd = build_argv(RunPreset(name="c", command=["train.sh", "x"], args={"n": 1}), [0])
    assert cmd == ["train.sh", "x", "--n", "1"]


def test_gpu_selection() -> None:
    p = RunPreset(name="p", command=["x"])
    assert resolve_gpus(p, None, 4) == [0, 1, 2, 3]
    assert resolve_gpus(RunPreset(name="p", command=["x"], gpus=2), None, 4) == [0, 1]
    assert resolve_gpus(RunPreset(name="p", command=["x"], gpus=[1, 3]), None, 4) == [1, 3]
    assert resolve_gpus(RunPreset(name="p", command=["x"], gpus=2), [3], 4) == [3]
    assert resolve_gpus(RunPreset(name="p", command=["x"], gpus=2), None, None) == []
    with pytest.raises(UsageError, match="wants 3 GPUs"):
        resolve_gpus(RunPreset(name="p", command=["x"], gpus=3), None, 2)
    with pytest.raises(UsageError, match="no GPU 5"):
        resolve_gpus(p, [0, 5], 2)


def test_environment_of_the_child(tmp_path: Path) -> None:
    preset = RunPreset(name="p", command=["x"], env={"MY_VAR": "1"})
    base = {"NCCL_NVLS_ENABLE": "0", "PATH": "/bin"}
    env = build_env(preset, [2, 3], "rid", tmp_path, has_driver=True, base=base)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["GPUSTATION_METRICS_FILE"] == str(tmp_path / "metrics.jsonl")
    assert env["GPUSTATION_RUN_DIR"] == str(tmp_path)
    assert env["MY_VAR"] == "1"
    # Only additions: the parent's NCCL settings pass through untouched.
    assert "NCCL_NVLS_ENABLE" not in env
    no_driver = build_env(preset, [], "rid", tmp_path, has_driver=False, base=base)
    assert "CUDA_VISIBLE_DEVICES" not in no_driver


def test_the_runners_shared_options_need_no_preset_argument() -> None:
    from gpustation.runs.presets import RunPreset, apply_overrides

    preset = RunPreset(name="p", runner="resnet", args={"steps": 10})
    changed, parsed, warnings = apply_overrides(preset, ["device=cpu", "seed=3"])
    assert warnings == [] and parsed == {"device": "cpu", "seed": "3"}
    assert changed.args["device"] == "cpu"
    _, _, warned = apply_overrides(preset, ["colour=blue"])
    assert warned and "no argument" in warned[0]
    command = RunPreset(name="c", command=["x"], args={})
    _, _, warned = apply_overrides(command, ["device=cpu"])  # a command has no shared options
    assert warned


def test_a_key_the_runners_parser_has_is_typed_by_it_without_a_warning() -> None:
    from gpustation import paths

    presets, _ = load_presets([("package", paths.package_dir() / "presets" / "runs")])
    lora = find_preset("lora-tiny", presets)
    assert "keep_checkpoints" not in lora.args and "merge" not in lora.args
    items = ["checkpoint_every=50", "keep_checkpoints=2", "merge=true", "generate_prompt=A GPU"]
    new, parsed, warnings = apply_overrides(lora, items)
    assert warnings == []
    assert parsed == {
        "checkpoint_every": 50,
        "keep_checkpoints": 2,
        "merge": True,
        "generate_prompt": "A GPU",
    }
    assert "--keep-checkpoints" in format_args(new.args)
    with pytest.raises(UsageError, match="keep_checkpoints=two: expected a whole number"):
        apply_overrides(lora, ["keep_checkpoints=two"])
    # a key neither the preset nor its runner has is still passed on, with a warning
    # that suggests only the preset's own names
    _, _, warned = apply_overrides(lora, ["checkpoint_every=5", "keep_checkpoint=2"])
    assert len(warned) == 1 and "'checkpoint_every'" not in warned[0]
