"""``gpustation run --resume RUN_ID``, as a user runs it: a LoRA run continued from its
last complete checkpoint as a new run, and the clear refusals."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpustation.runs import rundir
from gpustation.runs.store.index import RunStore
from tests.conftest import child_env, gpustation_cmd
from tests.runners.conftest import CHILD_TIMEOUT_S, read_events
from tests.runs.conftest import RunsEnv, command_preset, runs_environment

LORA_PRESET = """title = "tiny LoRA"
runner = "lora"
gpus = 1

[args]
device = "cpu"
model_preset = "tiny"
compile = false
precision = "fp32"
steps = 4
batch_size = 4
seq_len = 32
lr = 0.01
lr_warmup_steps = 0
warmup_steps = 1
log_every = 1
checkpoint_every = 2
generate_tokens = 4
verify_adapter = false

[env]
OMP_NUM_THREADS = "1"
TOKENIZERS_PARALLELISM = "false"
"""


@pytest.fixture
def runs_env(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunsEnv]:
    yield from runs_environment(gpustation_dirs, monkeypatch)


def gs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpustation_cmd(*args),
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=CHILD_TIMEOUT_S,
    )


def _losses(directory: Path) -> dict[int, float]:
    events = read_events(directory / rundir.METRICS_FILE)
    return {e["step"]: e["loss"] for e in events if "loss" in e}


def test_resume_a_lora_run_from_its_last_checkpoint(runs_env: RunsEnv) -> None:
    runs_env["write_preset"]("tiny-lora", LORA_PRESET)
    first = gs("run", "tiny-lora")
    assert first.returncode == 0, first.stdout + first.stderr
    (record,) = RunStore().list_runs()
    a_id = record.id
    a_dir = rundir.run_dir(a_id)
    root = a_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-00000002", "step-00000004"]
    # A later checkpoint that never got its marker (a crash mid-write) is passed over.
    shutil.copytree(root / "step-00000004", root / "step-00000006")
    (root / "step-00000006" / "complete.json").unlink()

    # Nothing is left to train at the old run's own 4 steps.
    done = gs("run", "--resume", a_id)
    assert done.returncode == 2
    assert "at step 4" in done.stderr and "--set steps=8" in done.stderr

    second = gs("run", "lora", "--resume", a_id, "--set", "steps=8")
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"resuming run {a_id} from its checkpoint at step 4" in second.stderr
    a, b = RunStore().list_runs()[::-1]
    assert a.id == a_id and b.id != a_id and b.status == "succeeded"
    b_dir = Path(b.run_dir or "")
    run = rundir.read_run(b_dir) or {}
    ckpt = str(root / "step-00000004")
    assert run["resumed_from"] == {"run": a_id, "step": 4, "checkpoint": ckpt}
    assert run["argv"][run["argv"].index("--resume-from") + 1] == ckpt
    assert b.resumed_from["run"] == a_id and b.total_steps == 8
    # Energy per token counts the tokens the run itself trained: B's steps 5-8, not 1-8.
    tokens_per_step = 4 * 32
    assert a.work == 4 * tokens_per_step and b.work == 4 * tokens_per_step
    assert b.work_unit == "token"
    assert b.energy_j and b.energy_per_unit_j == pytest.approx(b.energy_j / b.work)

    # The new run's metrics start at step 5, from where A stopped: its first loss is
    # close to A's last one, far from the loss a fresh start has (A's first).
    a_losses, b_losses = _losses(a_dir), _losses(b_dir)
    assert sorted(b_losses) == [5, 6, 7, 8]
    fresh_gap = abs(a_losses[1] - a_losses[4])
    assert fresh_gap > 0.2
    assert abs(b_losses[5] - a_losses[4]) < fresh_gap / 3
    summary = b.summary
    assert summary["resumed_from"]["run"] == a_id and summary["resumed_from"]["step"] == 4
    assert summary["sample_tokens"] == 4 and "sample" in summary
    # Its own checkpoints go to its own run directory.
    assert (b_dir / "checkpoints" / "step-00000008" / "complete.json").exists()

    shown = gs("runs", "show", b.id)
    assert shown.returncode == 0, shown.stderr
    assert "resumed from" in shown.stdout and f"run {a_id} at step 4" in shown.stdout

    # Without a complete checkpoint (only the half-written one left) it is refused.
    for path in root.glob("step-0000000[24]"):
        shutil.rmtree(path)
    gone = gs("run", "--resume", a_id, "--set", "steps=8")
    assert gone.returncode == 2
    assert "no complete checkpoint" in gone.stderr and a_id in gone.stderr
    assert len(RunStore().list_runs()) == 2  # no run was started


def test_resume_refuses_unknown_and_non_lora_runs(runs_env: RunsEnv) -> None:
    unknown = gs("run", "lora", "--resume", "no-such-run")
    assert unknown.returncode == 2
    assert "no run 'no-such-run'" in unknown.stderr and "runs list" in unknown.stderr

    runs_env["write_preset"]("ok", command_preset("ok", "train_ok", args="steps = 2"))
    plain = gs("run", "ok", "--detach")
    assert plain.returncode == 0, plain.stderr
    run_id = plain.stdout.strip()
    refused = gs("run", "--resume", run_id)
    assert refused.returncode == 2
    assert "ran a command" in refused.stderr and "LoRA runner" in refused.stderr
    both = gs("run", "--resume", run_id, "--", "python", "x.py")
    assert both.returncode == 2 and "no command" in both.stderr
    assert [r["id"] for r in json.loads(gs("runs", "list", "--json").stdout)] == [run_id]
