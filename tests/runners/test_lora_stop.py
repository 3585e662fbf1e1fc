"""Stopping a LoRA run does what the stop dialog promises: SIGINT saves a checkpoint of the
step it is in, atomically like the periodic ones, and the run leaves; resume goes on from it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpustation.runs import rundir
from gpustation.runs.checkpoints import MARKER, latest_checkpoint
from gpustation.runs.store.index import RunStore
from tests.conftest import child_env
from tests.runners.conftest import CHILD_TIMEOUT_S, read_events
from tests.runners.test_lora import TINY
from tests.runners.test_lora_resume_cli import LORA_PRESET, gs
from tests.runs.conftest import RunsEnv, runs_environment, wait_until

SMALL = ("--seq-len", "32", "--batch-size", "4", "--lr", "0.01", "--lr-warmup-steps", "0")


def _steps(metrics: Path) -> list[int]:
    return [e["step"] for e in read_events(metrics) if "loss" in e] if metrics.exists() else []


def test_sigint_saves_the_step_it_is_in_and_resume_goes_on_from_it(tmp_path: Path) -> None:
    out, metrics = tmp_path / "out", tmp_path / "metrics.jsonl"
    env = {**child_env(), "GPUSTATION_METRICS_FILE": str(metrics), "OMP_NUM_THREADS": "1"}
    argv = [
        sys.executable, "-P", "-m", "gpustation.runners.lora", *TINY, *SMALL,
        "--steps", "100000", "--log-every", "1", "--checkpoint-every", "0",
        "--generate-tokens", "0", "--no-verify-adapter", "--output-dir", str(out),
    ]  # fmt: skip
    pipe = subprocess.PIPE
    child = subprocess.Popen(argv, env=env, stdout=pipe, stderr=pipe, text=True)
    try:
        wait_until(lambda: len(_steps(metrics)) >= 3, timeout=CHILD_TIMEOUT_S, what="3 steps")
        seen = max(_steps(metrics))
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130, stderr
    assert "stopping after this step" in stderr

    stopped = [e for e in read_events(metrics) if e.get("event") == "stopped"]
    assert len(stopped) == 1
    at = stopped[0]["step"]
    # The checkpoint is of the step the run was in when asked, not the last periodic one
    # (there were none), and it is complete: a marker, written last.
    assert at >= seen and at == max(_steps(metrics))
    found = latest_checkpoint(out)
    assert found is not None and found.step == at
    marker = json.loads((found.path / MARKER).read_text())
    assert marker["step"] == at and marker["data_position"]["batches"] == at
    assert not list((out / "checkpoints").glob(".*.tmp"))
    assert f"checkpoint at step {at}" in stdout and "summary" not in read_events(metrics)[-1]

    # Resumed, it goes on from the next step.
    metrics.unlink()
    resumed = subprocess.run(
        [*argv[:4], *TINY, *SMALL, "--steps", str(at + 2), "--log-every", "1",
         "--generate-tokens", "0", "--no-verify-adapter", "--resume-from", str(out),
         "--output-dir", str(tmp_path / "again")],
        env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert _steps(metrics) == [at + 1, at + 2]


@pytest.fixture
def runs_env(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunsEnv]:
    yield from runs_environment(gpustation_dirs, monkeypatch)


def test_runs_stop_keeps_the_step_the_run_was_in(runs_env: RunsEnv) -> None:
    preset = LORA_PRESET.replace("steps = 4", "steps = 100000").replace(
        "checkpoint_every = 2", "checkpoint_every = 0"
    )
    write_preset = runs_env["write_preset"]
    write_preset("long-lora", preset)
    started = gs("run", "long-lora", "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    (record,) = RunStore().list_runs()
    directory = rundir.run_dir(record.id)
    wait_until(
        lambda: len(_steps(directory / rundir.METRICS_FILE)) >= 3,
        timeout=CHILD_TIMEOUT_S,
        what="3 steps of the run",
    )
    stop = gs("runs", "stop", record.id)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    last = max(_steps(directory / rundir.METRICS_FILE))
    found = latest_checkpoint(directory)
    assert found is not None and found.step == last >= 3

    again = gs("run", "--resume", record.id, "--set", f"steps={last + 1}")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"from its checkpoint at step {last}" in again.stderr
    assert os.path.isdir(found.path)
