"""A run on simulated GPUs says which simulated card it kept from last time."""

from __future__ import annotations

import subprocess

from gpustation.telemetry.registry import open_backend
from tests.conftest import child_env, gpustation_cmd
from tests.runs.conftest import RunsEnv, command_preset


def test_a_run_given_only_a_count_says_the_card_kept_from_last_time(
    runs_env: RunsEnv,
) -> None:
    write_preset = runs_env["write_preset"]
    write_preset("tiny", command_preset("tiny", "train_ok", "--steps", "2", "--sleep", "0"))
    open_backend(simulate=1, sim_card="h200").close()
    done = subprocess.run(
        gpustation_cmd("run", "tiny", "--simulate", "2"),
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 simulated H200, as last time; --sim-card to change" in done.stderr
