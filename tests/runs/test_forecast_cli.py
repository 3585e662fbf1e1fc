"""Forecasts as a user meets them: ``run --dry-run`` after real runs on simulated GPUs, the
forecast beside the actual in ``runs show``, ``--json``, ``--probe``, and what is refused."""

from __future__ import annotations

import json
import signal
import subprocess
from typing import Any

from gpustation.runs import rundir
from gpustation.runs.store.index import RunStore
from gpustation.runs.store.reconcile import list_active_runs
from gpustation.telemetry.sim import SimBackend
from tests.conftest import child_env, gpustation_cmd, run_gpustation
from tests.runs.conftest import RunsEnv, command_preset, wait_until

TIMEOUT = 120.0
#: the workload's steps: their time dominates a run's
STEPS = 8
STEP_S = 0.3


def gs(*args: str) -> subprocess.CompletedProcess[str]:
    return run_gpustation(*args, timeout=TIMEOUT)


def write_work(runs_env: RunsEnv, name: str = "work", **args: Any) -> None:
    values = {"steps": STEPS, "batch_size": 4, "step_s": STEP_S, "setup_s": 0.2, **args}
    text = "\n".join(f"{k} = {v}" for k, v in values.items())
    runs_env["write_preset"](name, command_preset(name, "forecast_work", args=text))


def ran(*args: str) -> dict[str, Any]:
    """Run to the end; the run's ``runs show --json``."""
    result = gs("run", *args)
    assert result.returncode == 0, result.stderr
    show = gs("runs", "show", "last", "--json")
    assert show.returncode == 0, show.stderr
    doc: dict[str, Any] = json.loads(show.stdout)
    return doc


def dry(*args: str) -> dict[str, Any]:
    result = gs("run", *args, "--dry-run", "--json")
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_a_dry_run_forecasts_twice_the_steps_from_three_runs(runs_env: RunsEnv) -> None:
    write_work(runs_env)
    history = [ran("work")["id"] for _ in range(3)]
    doc = dry("work", "--set", f"steps={2 * STEPS}")
    # what would run, as a launch resolves it; nothing started
    assert doc["argv"][-8:-6] == ["--steps", str(2 * STEPS)]
    assert doc["gpus"] == [0] and doc["simulated"] is True and doc["probe_run"] is None
    assert len(RunStore().list_runs()) == 3
    fc = doc["forecast"]
    assert fc["runs"] == 3 and sorted(fc["run_ids"]) == sorted(history)
    assert fc["duration_runs"] == fc["memory_runs"] == 3
    assert fc["extrapolated"] == [f"steps {STEPS} -> {2 * STEPS}"]
    assert fc["peak_vram_mib"] == 1400.0  # 1000 static + 4 x 100: steps do not change it
    assert fc["gpus"][0]["index"] == 0 and fc["gpus"][0]["fits"] is True and fc["fits"] is True
    assert fc["simulated"] is True and "SIMULATED" in fc["text"]
    assert f"from 3 past runs of work, steps {STEPS} -> {2 * STEPS} extrapolated" in fc["text"]

    # the real run of 2N: the forecast made at its launch is the dry run's, and close
    actual = ran("work", "--set", f"steps={2 * STEPS}")
    kept = actual["forecast"]
    assert kept["run_ids"] == fc["run_ids"]
    versus = {row["figure"]: row for row in kept["versus"]}
    assert versus["duration_s"]["actual"] == actual["duration_s"]
    # sleeps make the steps; a loaded machine only stretches the start a little
    assert abs(versus["duration_s"]["error_pct"]) < 20, versus
    assert versus["peak_vram_mib"]["error_pct"] == 0.0

    # runs show sets the forecast beside what happened
    show = gs("runs", "show", actual["id"])
    assert show.returncode == 0, show.stderr
    assert f"forecast from 3 past runs of work, steps {STEPS} -> {2 * STEPS}" in show.stdout
    table = show.stdout.split("forecast from", 1)[1]
    row = next(line for line in table.splitlines() if line.startswith("duration "))
    assert row.rstrip().endswith("%"), show.stdout
    assert "FORECAST" in show.stdout and "ACTUAL" in show.stdout


def test_the_text_says_what_fits_and_what_will_not(runs_env: RunsEnv) -> None:
    # Idle simulated cards: a simulated job of their own (up to 85 % of the card) would
    # decide what fits, whenever it came.
    sim = SimBackend.open(count=2, card=None)
    for index in range(2):
        sim.poke(index, load=0.0)
    # 1000 MiB held before the first step, 1000 more a sample: 5 GiB at batch 4
    write_work(runs_env, steps=3, step_s=0.05, mib_per_sample=1000.0)
    ran("work")
    plain = gs("run", "work", "--dry-run")
    assert plain.returncode == 0, plain.stderr
    assert "nothing started" in plain.stderr
    assert plain.stdout.startswith("command: CUDA_VISIBLE_DEVICES=0 ")
    assert "fits, 4.9 GiB of 24.0 GiB free on GPU 0" in plain.stdout, plain.stdout
    # batch 32 needs about 32 GiB: more than the simulated RTX 4090 has at all
    big = gs("run", "work", "--dry-run", "--set", "batch_size=32", "--gpus", "1")
    assert big.returncode == 0, big.stderr
    forecast = big.stdout.splitlines()[-1]
    assert "peak 32.2 GiB: will not fit: needs about 32.2 GiB, " in forecast
    assert "free on GPU 1" in forecast and "batch 4 -> 32 extrapolated" in forecast
    assert "throughput taken as constant" in forecast


def test_a_preset_that_never_ran_here_says_so_and_a_probe_makes_history(
    runs_env: RunsEnv,
) -> None:
    write_work(runs_env, "fresh", steps=50, step_s=0.1)
    never = gs("run", "fresh", "--dry-run")
    assert never.returncode == 0, never.stderr
    assert "fresh never ran here: no forecast" in never.stdout and "--probe" in never.stdout
    probed = gs("run", "fresh", "--dry-run", "--probe", "6", "--json")
    assert probed.returncode == 0, probed.stderr
    assert "gpustation: probing fresh title" in probed.stderr and "6 steps" in probed.stderr
    doc = json.loads(probed.stdout)  # stdout holds the JSON alone
    (probe,) = RunStore().list_runs()
    assert doc["probe_run"] == probe.id and "probe" in probe.tags
    assert probe.status == "succeeded" and probe.steps == 6
    fc = doc["forecast"]
    assert fc["run_ids"] == [probe.id] and fc["probe_runs"] == 1
    assert fc["extrapolated"] == ["steps 6 -> 50"]
    assert "from 1 past run of fresh (1 a probe)" in fc["text"]
    # the probe's steps scale: 50 steps of 0.1 s, more than the probe's whole run took
    assert fc["duration_s"] > probe.duration_s


def test_ctrl_c_stops_a_probe_and_forecasts_nothing(runs_env: RunsEnv) -> None:
    write_work(runs_env, steps=10000, step_s=0.05)
    proc = subprocess.Popen(
        gpustation_cmd("run", "work", "--dry-run", "--probe", "5000"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        runs_root = runs_env["dirs"]["data"] / "runs"
        wait_until(
            lambda: any(
                (s := rundir.read_state(p.parent)) is not None and s.status == "running"
                for p in runs_root.glob(f"*/{rundir.STATE_JSON}")
            ),
            TIMEOUT,
            "the probe to start",
        )
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert out == ""  # no forecast: the probe did not finish
    (probe,) = RunStore().list_runs()
    assert probe.status == "stopped" and "probe" in probe.tags
    assert list_active_runs() == []


def test_what_a_dry_run_refuses(runs_env: RunsEnv) -> None:
    write_work(runs_env)
    for args, words in (
        (("--probe",), "--probe and --json go with --dry-run"),
        (("--json",), "--probe and --json go with --dry-run"),
        (("--dry-run", "--detach"), "--detach does not go with it"),
        (("--dry-run", "--queue"), "--queue does not go with it"),
        (("--dry-run", "--probe", "0"), "--probe: from 1 to 10000 steps, got 0"),
    ):
        result = gs("run", "work", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert words in result.stderr, (args, result.stderr)
    runs_env["write_preset"]("bare", command_preset("bare", "train_ok"))
    result = gs("run", "bare", "--dry-run", "--probe")
    assert result.returncode == 2 and "has no steps argument" in result.stderr
    assert RunStore().list_runs() == []
    # a probe that fails: exit 1, naming its run
    runs_env["write_preset"]("crashy", command_preset("crashy", "crash", args="steps = 5"))
    crashed = gs("run", "crashy", "--dry-run", "--probe", "3")
    (probe,) = RunStore().list_runs()
    assert crashed.returncode == 1 and crashed.stdout == ""
    assert f"the probe run {probe.id} failed (exit 3)" in crashed.stderr
