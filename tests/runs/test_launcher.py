"""Real runs of small child scripts through the supervisor."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from gpustation.runs import rundir
from gpustation.runs.launch.start import launch
from gpustation.runs.launch.stop import stop_run, stop_runs, wait_for_end
from gpustation.runs.presets import RunPreset, load_presets
from gpustation.runs.store.index import RunStore
from gpustation.runs.store.reconcile import check_run, list_active_runs, record_lost_runs
from tests.runs.conftest import RunsEnv, assert_no_process, command_preset, wait_until

TIMEOUT = 60.0


def preset_named(name: str) -> RunPreset:
    presets, problems = load_presets()
    assert not [p for p in problems if name in p.path], problems
    return presets[name]


def test_normal_completion(runs_env: RunsEnv) -> None:
    runs_env["write_preset"](
        "ok", command_preset("ok", "train_ok", args='steps = 4\nsleep = 0.05\ntag = "a"')
    )
    handle = launch(preset_named("ok"), {"tag": "b"})
    assert handle.state is not None and handle.state.child_pid
    state = wait_for_end(handle.run_dir, TIMEOUT)
    assert state is not None and state.status == "succeeded" and state.exit_code == 0

    log = handle.output_log.read_text()
    # stdout and stderr both land in output.log; the override reached the argv.
    assert "step 4 loss 0.500 tag=b" in log and "warning on stderr 4" in log
    run = rundir.read_run(handle.run_dir)
    assert run is not None
    assert run["argv"][-6:] == ["--steps", "4", "--sleep", "0.05", "--tag", "b"]
    assert run["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert run["gpus"] == [0] and run["overrides"] == {"tag": "b"}

    record = RunStore().get(handle.id)
    assert record is not None
    assert record.status == "succeeded" and record.steps == 4 and record.total_steps == 4
    assert record.final_loss == 0.5 and record.best_throughput == 400.0
    assert record.summary == {"accuracy": 0.54}
    # The simulated GPU was sampled while the run went on.
    assert record.energy_j is not None and record.energy_j > 0
    assert record.peak_power_w is not None and record.peak_temp_c is not None
    assert (handle.run_dir / rundir.TELEMETRY_FILE).stat().st_size > 0


def test_crash_is_failed_with_exit_code_and_log_tail(runs_env: RunsEnv) -> None:
    runs_env["write_preset"]("crash", command_preset("crash", "crash"))
    handle = launch(preset_named("crash"))
    state = wait_for_end(handle.run_dir, TIMEOUT)
    assert state is not None
    assert state.status == "failed" and state.exit_code == 3 and not state.oom
    assert state.reason == "exited with code 3"
    assert any("RuntimeError: the dataset is missing" in line for line in state.error_tail)
    record = RunStore().get(handle.id)
    assert record is not None and record.status == "failed" and record.exit_code == 3
    assert any("Traceback" in line for line in record.error_tail)


def test_cuda_out_of_memory_is_named(runs_env: RunsEnv) -> None:
    runs_env["write_preset"]("oom", command_preset("oom", "cuda_oom"))
    state = wait_for_end(launch(preset_named("oom")).run_dir, TIMEOUT)
    assert state is not None and state.status == "failed"
    assert state.oom and "out of memory" in (state.reason or "")


def test_missing_program_is_a_failed_run(runs_env: RunsEnv) -> None:
    runs_env["write_preset"]("nope", 'command = ["/no/such/program-xyz"]\n')
    handle = launch(preset_named("nope"))
    state = wait_for_end(handle.run_dir, TIMEOUT)
    assert state is not None and state.status == "failed"
    assert "/no/such/program-xyz" in (state.reason or "")


@pytest.mark.parametrize("own_session", [False, True], ids=["same-group", "setsid-grandchild"])
def test_stubborn_child_ends_by_sigkill_with_nothing_left(
    runs_env: RunsEnv, tmp_path: Path, own_session: bool
) -> None:
    pids_file = tmp_path / "pids"
    extra = ["--setsid"] if own_session else []
    runs_env["write_preset"](
        "stubborn", command_preset("stubborn", "stubborn", str(pids_file), *extra)
    )
    handle = launch(preset_named("stubborn"), stop_grace_s=0.5)
    wait_until(pids_file.exists, TIMEOUT, "the child to start its grandchild")
    child, grandchild = map(int, pids_file.read_text().split())
    state = stop_run(handle.id, grace_s=0.5)
    assert state is not None
    assert state.status == "stopped" and state.signal == "SIGKILL"
    assert state.reason == "stopped by user (SIGKILL)"
    assert rundir.group_members(state.pgid) == []
    assert_no_process([child, grandchild])
    record = RunStore().get(handle.id)
    assert record is not None and record.status == "stopped"


def test_grandchild_in_its_own_session_dies_with_its_run(runs_env: RunsEnv, tmp_path: Path) -> None:
    # The child exits on its own, leaving a worker that escaped its process group.
    pids_file = tmp_path / "pids"
    runs_env["write_preset"](
        "orphan",
        command_preset("orphan", "stubborn", str(pids_file), "--setsid", "--exit-after", "1.5"),
    )
    handle = launch(preset_named("orphan"))
    wait_until(pids_file.exists, TIMEOUT, "the child")
    child, grandchild = map(int, pids_file.read_text().split())
    state = wait_for_end(handle.run_dir, TIMEOUT)
    assert state is not None and state.status == "failed" and state.exit_code == 1
    assert [int(pid) for pid, *_ in state.descendants] == [grandchild]
    wait_until(
        lambda: not rundir.process_matches(grandchild, None), TIMEOUT, "the orphan to be killed"
    )
    assert_no_process([child, grandchild])


def test_graceful_stop_is_stopped_not_failed(runs_env: RunsEnv, tmp_path: Path) -> None:
    runs_env["write_preset"]("wait", command_preset("wait", "wait_file", str(tmp_path / "never")))
    handle = launch(preset_named("wait"))
    wait_until(lambda: "ready" in handle.output_log.read_text(), TIMEOUT, "the child")
    state = stop_run(handle.id, grace_s=5)
    assert state is not None and state.status == "stopped"
    # The child caught SIGINT and left by itself: no SIGTERM or SIGKILL was needed.
    assert state.exit_code == 0 and state.reason == "stopped by user (SIGINT)"
    assert "interrupted: saving and leaving" in handle.output_log.read_text()


def test_killing_the_supervisor_stops_the_child(runs_env: RunsEnv, tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    runs_env["write_preset"]("stubborn", command_preset("stubborn", "stubborn", str(pids_file)))
    handle = launch(preset_named("stubborn"), stop_grace_s=0.3)
    wait_until(pids_file.exists, TIMEOUT, "the child")
    child, grandchild = map(int, pids_file.read_text().split())
    assert handle.state is not None and handle.state.supervisor_pid
    os.kill(handle.state.supervisor_pid, signal.SIGTERM)
    state = wait_for_end(handle.run_dir, TIMEOUT)
    assert state is not None and state.status == "stopped"
    assert_no_process([child, grandchild])
    # The supervisor exits right after recording the end.
    supervisor = handle.state.supervisor_pid
    wait_until(lambda: not rundir.process_matches(supervisor, None), TIMEOUT, "the supervisor")


def test_reattach_after_restart(runs_env: RunsEnv, tmp_path: Path) -> None:
    release = tmp_path / "release"
    runs_env["write_preset"]("wait", command_preset("wait", "wait_file", str(release)))
    run_id = launch(preset_named("wait")).id
    # A restarted UI knows nothing but what is on disk.
    active = list_active_runs()
    assert [a.id for a in active] == [run_id]
    assert active[0].supervised and active[0].state.status == "running"
    assert active[0].run["preset"]["name"] == "wait"
    # The history has the run too (the supervisor writes its row just after its state).
    wait_until(lambda: getattr(RunStore().get(run_id), "status", None) == "running", TIMEOUT)

    release.touch()
    state = wait_for_end(rundir.run_dir(run_id), TIMEOUT)
    assert state is not None and state.status == "succeeded"
    assert list_active_runs() == []
    record = RunStore().get(run_id)
    assert record is not None and record.status == "succeeded" and record.ended_at


def test_reused_pid_is_not_taken_for_the_run(runs_env: RunsEnv, tmp_path: Path) -> None:
    release = tmp_path / "release"
    runs_env["write_preset"]("wait", command_preset("wait", "wait_file", str(release)))
    handle = launch(preset_named("wait"))
    state = rundir.read_state(handle.run_dir)
    assert state is not None and state.supervisor_create_time is not None
    # Same PIDs, other start times: as if the machine had restarted.
    forged = rundir.RunState.from_dict(state.to_dict())
    forged.supervisor_create_time = state.supervisor_create_time - 1000
    forged.child_create_time = (state.child_create_time or 0) - 1000
    release.touch()
    # The supervisor writes exit-status, then state.json: forge only once it is gone.
    supervisor = state.supervisor_pid
    wait_until(lambda: not rundir.process_matches(supervisor, None), TIMEOUT, "the supervisor")
    rundir.write_state(handle.run_dir, forged)
    rundir.prepare_exit_status(handle.run_dir)  # no end written there either
    checked = check_run(handle.run_dir)
    assert checked is not None and checked.status == "lost"
    assert "supervisor" in (checked.reason or "")
    # A reader only finds it lost; the launcher records it before its next run.
    assert (rundir.read_state(handle.run_dir) or state).status == "running"
    assert [s.id for s in record_lost_runs()] == [handle.id]
    record = RunStore().get(handle.id)
    assert record is not None and record.status == "lost"
    assert (rundir.read_state(handle.run_dir) or state).status == "lost"


def test_lost_when_supervisor_and_child_die_unrecorded(runs_env: RunsEnv, tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    runs_env["write_preset"]("stubborn", command_preset("stubborn", "stubborn", str(pids_file)))
    handle = launch(preset_named("stubborn"))
    wait_until(pids_file.exists, TIMEOUT, "the child")
    state = handle.state
    assert state is not None and state.supervisor_pid and state.pgid
    os.kill(state.supervisor_pid, signal.SIGKILL)  # no chance to record anything
    os.killpg(state.pgid, signal.SIGKILL)
    wait_until(lambda: not rundir.group_members(state.pgid), TIMEOUT, "the group to die")
    wait_until(
        lambda: not rundir.process_matches(state.supervisor_pid, state.supervisor_create_time),
        TIMEOUT,
    )
    assert list_active_runs() == []
    # Found lost, not yet recorded: the next launch records it.
    assert (rundir.read_state(handle.run_dir) or state).active
    runs_env["write_preset"]("ok", command_preset("ok", "train_ok", args="steps = 1"))
    wait_for_end(launch(preset_named("ok")).run_dir, TIMEOUT)
    lost = rundir.read_state(handle.run_dir)
    assert lost is not None and lost.status == "lost"
    record = RunStore().get(handle.id)
    assert record is not None and record.status == "lost"


@pytest.mark.parametrize("gpus", [[1], None])
def test_gpu_choice_reaches_the_child(runs_env: RunsEnv, gpus: list[int] | None) -> None:
    runs_env["write_preset"]("ok", command_preset("ok", "train_ok", args="steps = 1"))
    handle = launch(preset_named("ok"), gpus=gpus)
    end = wait_for_end(handle.run_dir, TIMEOUT)
    assert end is not None and end.status == "succeeded"
    run = rundir.read_run(handle.run_dir)
    assert run is not None
    expected = "1" if gpus else "0"  # the preset asks for 1 GPU: the first
    assert run["env"]["CUDA_VISIBLE_DEVICES"] == expected


def test_garbage_and_partial_metric_lines(runs_env: RunsEnv) -> None:
    runs_env["write_preset"]("garbage", command_preset("garbage", "garbage_metrics"))
    handle = launch(preset_named("garbage"))
    state = wait_for_end(handle.run_dir, TIMEOUT)
    assert state is not None and state.status == "succeeded"
    record = RunStore().get(handle.id)
    assert record is not None
    assert record.steps == 3 and record.final_loss == 1.5 and record.best_loss == 1.5
    assert record.best_throughput == 50.0 and record.throughput_unit == "tokens/s"
    assert record.malformed_metrics == 3


@pytest.mark.slow
def test_torchrun_run_stops_with_all_its_workers(runs_env: RunsEnv, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pids_file = tmp_path / "pids"
    script = str(Path(__file__).resolve().parent / "children" / "ddp_wait.py")
    runs_env["write_preset"](
        "ddp",
        f'command = ["{script}", "{pids_file}"]\nlauncher = "torchrun"\nnproc_per_node = 2\n'
        "gpus = 0\n",
    )
    handle = launch(preset_named("ddp"), stop_grace_s=2)
    assert "--standalone" in handle.argv
    wait_until(pids_file.exists, 120, "both workers to join")
    workers = [int(p) for p in pids_file.read_text().split()]
    assert len(workers) == 2
    state = stop_run(handle.id, grace_s=2)
    assert state is not None and state.status == "stopped"
    assert_no_process(workers)
    assert rundir.group_members(state.pgid) == []


def test_runner_reported_out_of_memory_is_named(runs_env: RunsEnv) -> None:
    # gpustation's runners exit 75 after an {"error": "out_of_memory"} event.
    code = (
        "from gpustation.runs.metrics import MetricsWriter\n"
        "MetricsWriter.from_env().log(error='out_of_memory', "
        "message='out of memory while training.\\\\nTry: --batch-size 64')\n"
        "raise SystemExit(75)\n"
    )
    runs_env["write_preset"]("oom2", f'command = ["{sys.executable}", "-c", """{code}"""]\n')
    state = wait_for_end(launch(preset_named("oom2")).run_dir, TIMEOUT)
    assert state is not None and state.status == "failed" and state.exit_code == 75
    assert state.oom and state.reason == "out of memory: out of memory while training."


def test_stop_several_runs_at_once(runs_env: RunsEnv, tmp_path: Path) -> None:
    pids_file = tmp_path / "pids"
    runs_env["write_preset"]("stubborn", command_preset("stubborn", "stubborn", str(pids_file)))
    runs_env["write_preset"]("wait", command_preset("wait", "wait_file", str(tmp_path / "never")))
    stubborn = launch(preset_named("stubborn"))
    waiting = launch(preset_named("wait"))
    wait_until(pids_file.exists, TIMEOUT, "the stubborn child")
    start = time.monotonic()
    states = stop_runs([a.id for a in list_active_runs()], grace_s=1.0)
    # In parallel: the stubborn run's SIGINT and SIGTERM waits are not added to the other's.
    assert time.monotonic() - start < 10
    assert {k: v.status for k, v in states.items() if v} == {
        stubborn.id: "stopped",
        waiting.id: "stopped",
    }
    assert list_active_runs() == []


def test_signal_names_for_every_signal_a_process_can_die_of() -> None:
    import signal as signals

    from gpustation.runs.launch.stop import signal_name

    assert signal_name(signals.SIGTERM) == "SIGTERM"
    # real-time signals other than the first and last have no name in Python
    assert signal_name(signals.SIGRTMIN + 1) == str(int(signals.SIGRTMIN) + 1)
