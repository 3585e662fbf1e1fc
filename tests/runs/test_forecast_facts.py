"""What past runs say about themselves, read from run directories as the supervisor leaves them;
damaged ones skipped, never a crash."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpustation.runs import rundir
from gpustation.runs.forecast.facts import history
from gpustation.runs.gputrace import compact_sample
from gpustation.runs.presets import RunPreset, command_preset
from gpustation.runs.rundir import RunState
from gpustation.runs.store.index import sync_run
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend

START = 1_800_000_000.0
PRESET = RunPreset(name="train", runner="resnet", args={"steps": 60, "batch_size": 32})


def write_run(
    root: Path,
    run_id: str,
    preset: RunPreset = PRESET,
    *,
    started_at: float = START,
    steps: int = 60,
    step_s: float = 0.5,
    warmup_s: float = 8.0,
    teardown_s: float = 4.0,
    power_w: float = 300.0,
    limit_w: float | None = 450.0,
    status: str = "succeeded",
    summary: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    counter_every: int = 1,
) -> Path:
    """A finished run: a slow first step (compile), then ``step_s`` a step reported every
    10 steps with a throughput, the GPU at ``power_w`` its counter rising to match, and
    ``teardown_s`` after the last step."""
    directory = root / run_id
    directory.mkdir(parents=True)
    run = {
        "id": run_id,
        "created_at": started_at,
        "preset": {**preset.to_dict(), "args": dict(preset.args)},
        "overrides": {},
        "argv": ["python", "-m", "gpustation.runners.resnet"],
        "gpus": [0],
        "backend": {"kind": "sim", "simulated": True, "simulate": 1},
        **(extra or {}),
    }
    rundir.write_json(directory / rundir.RUN_JSON, run)
    events: list[dict[str, Any]] = [{"t": 1.0, "time": started_at + 1.0, "mem_static_mib": 900.0}]
    for step in (1, *range(10, steps + 1, 10)):
        t = warmup_s + step * step_s
        events.append(
            {
                "t": t,
                "time": started_at + t,
                "step": step,
                "loss": 1.0,
                "throughput": None if step == 1 else 64.0,
                "unit": "img/s",
                "total_steps": steps,
                "mem_peak_mib": 3900.0,
            }
        )
    if summary is not None:
        events.append({"t": warmup_s + steps * step_s, "summary": summary})
    (directory / rundir.METRICS_FILE).write_text("".join(json.dumps(e) + "\n" for e in events))
    duration = warmup_s + steps * step_s + teardown_s
    with open(directory / rundir.TELEMETRY_FILE, "w") as fh:
        for t in range(int(duration) + 1):
            # idle during start-up and teardown, busy while stepping
            busy = warmup_s <= t <= warmup_s + steps * step_s
            gpu = {
                "index": 0,
                "power_w": power_w if busy else 60.0,
                "power_limit_w": limit_w,
                "memory_used_mib": 5000.0,
                "energy_j": 1000.0 + 60.0 * min(t, warmup_s) + power_w * max(0.0, t - warmup_s),
            }
            if t % counter_every:
                gpu["energy_j"] = None  # the counter is read with the slow fields
            fh.write(json.dumps({"t": float(t), "time": started_at + t, "gpus": [gpu]}) + "\n")
    state = RunState(
        id=run_id, status=status, started_at=started_at, ended_at=started_at + duration
    )
    rundir.write_state(directory, state)
    sync_run(directory)
    return directory


@pytest.fixture
def runs_root(gpustation_dirs: dict[str, Path]) -> Path:
    return gpustation_dirs["data"] / "runs"


def test_a_run_s_features_and_parts(runs_root: Path) -> None:
    write_run(runs_root, "20300101-000000-train-aaaa", summary={"batch_size": 32, "world_size": 1})
    found = history(PRESET)
    assert found.skipped == 0
    (f,) = found.facts
    assert (f.steps, f.batch_size, f.seq_len, f.gpu_count) == (60, 32, None, 1)
    assert f.step_s == pytest.approx(0.5)  # the compile-slow first step left out
    assert f.overhead_s == pytest.approx(8.0 + 4.0)
    assert f.power_limit_w == 450.0
    assert f.steady_power_w == pytest.approx(300.0)  # the counters while stepping
    assert f.energy_j is not None and f.overhead_energy_j is not None
    assert f.overhead_energy_j == pytest.approx(f.energy_j - 300.0 * 60 * 0.5)
    # the peak is the run's own on simulated GPUs; what grew after set-up scales
    assert f.peak_mib == 3900.0 and f.static_mib == pytest.approx(900.0)
    assert f.simulated and not f.probe


def test_a_short_stepping_span_takes_the_power_readings(runs_root: Path) -> None:
    """The counter is read every 5 s: over a 5 s span it says little; the readings do."""
    write_run(runs_root, "20300101-000000-train-aaaa", steps=20, step_s=0.3, counter_every=5)
    (f,) = history(PRESET).facts
    assert f.steady_power_w == pytest.approx(300.0)  # not the run's mean, idle start included
    assert f.energy_j is not None and f.energy_j / f.duration_s < 250


def test_only_succeeded_runs_of_the_same_preset_count_newest_first(runs_root: Path) -> None:
    write_run(runs_root, "20300101-000000-train-aaaa", started_at=START)
    write_run(runs_root, "20300101-000100-train-bbbb", started_at=START + 100)
    write_run(runs_root, "20300101-000200-train-cccc", started_at=START + 200, status="failed")
    other = RunPreset(name="other", runner="resnet", args={"steps": 60})
    write_run(runs_root, "20300101-000300-other-dddd", other, started_at=START + 300)
    write_run(
        runs_root,
        "20300101-000400-train-eeee",
        started_at=START + 400,
        extra={"resumed_from": {"run": "x", "step": 30}},
    )
    found = history(PRESET)
    assert [f.run_id for f in found.facts] == [
        "20300101-000100-train-bbbb",
        "20300101-000000-train-aaaa",
    ]


def test_a_command_run_is_like_another_only_with_the_same_argv(runs_root: Path) -> None:
    mine = command_preset(["python", "train.py", "--lr", "3e-4"], None, [])
    theirs = command_preset(["python", "train.py", "--lr", "1e-3"], None, [])
    assert mine.name == theirs.name == "python"
    write_run(runs_root, "20300101-000000-python-aaaa", mine)
    write_run(runs_root, "20300101-000100-python-bbbb", theirs, started_at=START + 100)
    # a preset that happens to have the command's name is another workload
    same_name = RunPreset(name="python", runner="resnet")
    write_run(runs_root, "20300101-000200-python-cccc", same_name, started_at=START + 200)
    assert [f.run_id for f in history(mine).facts] == ["20300101-000000-python-aaaa"]


def test_damaged_runs_are_skipped_and_counted(runs_root: Path) -> None:
    good = write_run(runs_root, "20300101-000000-train-aaaa")
    garbage = write_run(runs_root, "20300101-000100-train-bbbb", started_at=START + 100)
    with open(garbage / rundir.METRICS_FILE, "a") as fh:
        fh.write('{"step": "three"}\nnot json at all\n')
    sync_run(garbage)
    fifo = write_run(runs_root, "20300101-000200-train-cccc", started_at=START + 200)
    (fifo / rundir.TELEMETRY_FILE).unlink()
    os.mkfifo(fifo / rundir.TELEMETRY_FILE)
    unreadable = write_run(runs_root, "20300101-000300-train-dddd", started_at=START + 300)
    (unreadable / rundir.RUN_JSON).write_text("{ not json")
    found = history(PRESET)
    assert [f.run_id for f in found.facts] == [good.name]
    assert found.skipped == 3


def test_runs_without_the_newer_readings_still_count(runs_root: Path) -> None:
    """Runs recorded before the power limit and the static memory were: unknown, not wrong."""
    directory = write_run(runs_root, "20300101-000000-train-aaaa", limit_w=None)
    lines = (directory / rundir.METRICS_FILE).read_text().splitlines()
    kept = [line for line in lines if "mem_static_mib" not in line]
    (directory / rundir.METRICS_FILE).write_text("\n".join(kept) + "\n")
    sync_run(directory)
    (f,) = history(PRESET).facts
    assert f.power_limit_w is None and f.static_mib is None and f.peak_mib == 3900.0
    assert f.step_s == pytest.approx(0.5)


def test_each_telemetry_line_records_the_power_limit_in_force() -> None:
    sim = SimBackend(count=1, card="rtx4090", state_path=None, clock=lambda: 1e6)
    sampler = Sampler(sim, with_host=False, clock=lambda: 1e6)
    assert compact_sample(sampler.sample(), 1.0)["gpus"][0]["power_limit_w"] == 450.0
    sim.control.set_power_limit(0, 300.0)
    assert compact_sample(sampler.sample(), 2.0)["gpus"][0]["power_limit_w"] == 300.0
