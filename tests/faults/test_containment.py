"""Every process a run starts ends with it: a worker that double-forks into a
session of its own is re-parented to the supervisor (a child subreaper) and
signalled with the run, when the run ends and on `runs stop`."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpustation.runs import rundir
from gpustation.runs.launch.start import launch
from gpustation.runs.launch.stop import stop_run, wait_for_end
from gpustation.runs.presets import RunPreset, load_presets
from tests.conftest import child_env, gpustation_cmd
from tests.runs.conftest import RunsEnv, command_preset, runs_environment, wait_until

TIMEOUT = 60.0


@pytest.fixture
def runs_env(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunsEnv]:
    yield from runs_environment(gpustation_dirs, monkeypatch)


@pytest.fixture
def marker() -> Iterator[str]:
    """A token in the escaped process's argv; whatever is left with it is killed after."""
    token = f"gpustation-escapee-{secrets.token_hex(6)}"
    yield token
    for proc in with_marker(token):
        proc.kill()


def with_marker(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            argv = proc.info["cmdline"] or []
            # The escaped sleeper (python -c ... TOKEN), not the run's child (which has it too).
            if (
                proc.info["status"] != psutil.STATUS_ZOMBIE
                and argv[-1:] == [token]
                and "-c" in argv
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def preset(name: str) -> RunPreset:
    presets, problems = load_presets()
    assert name in presets, problems
    return presets[name]


def test_a_double_forked_worker_ends_with_its_run(runs_env: RunsEnv, marker: str) -> None:
    runs_env["write_preset"]("escape", command_preset("escape", "double_fork", marker))
    handle = launch(preset("escape"))
    state = wait_for_end(handle.run_dir, TIMEOUT)
    assert state is not None and state.status == "succeeded", state
    assert "forked" in (handle.run_dir / rundir.OUTPUT_LOG).read_text()
    # The run has ended: nothing it started is left (sleep 600 would be).
    wait_until(lambda: not with_marker(marker), 10, "the escaped worker to be gone")
    assert any(int(pid) for pid, *_ in state.descendants), "the worker was tracked"


def test_runs_stop_ends_a_double_forked_worker(
    runs_env: RunsEnv, marker: str, tmp_path: Path
) -> None:
    release = tmp_path / "never"
    runs_env["write_preset"](
        "escape", command_preset("escape", "double_fork", marker, "--wait", str(release))
    )
    handle = launch(preset("escape"))
    log = handle.run_dir / rundir.OUTPUT_LOG
    wait_until(lambda: log.exists() and "forked" in log.read_text(), TIMEOUT, "the fork")
    (escaped,) = wait_until(lambda: with_marker(marker), TIMEOUT, "the escaped worker")
    running = rundir.read_state(handle.run_dir)
    assert running is not None
    assert escaped.ppid() == running.supervisor_pid, "re-parented to the supervisor"
    result = subprocess.run(
        gpustation_cmd("runs", "stop", handle.id, "--grace", "2"),
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    state = rundir.read_state(handle.run_dir)
    assert state is not None and state.status == "stopped"
    wait_until(lambda: not with_marker(marker), 10, "the escaped worker to be gone")


def test_a_stop_without_the_supervisor_still_finds_the_worker(
    runs_env: RunsEnv, marker: str, tmp_path: Path
) -> None:
    # The supervisor is gone (SIGKILL): the worker it had listed is found by the stop.
    import os
    import signal

    release = tmp_path / "never"
    runs_env["write_preset"](
        "escape", command_preset("escape", "double_fork", marker, "--wait", str(release))
    )
    handle = launch(preset("escape"))
    wait_until(lambda: with_marker(marker), TIMEOUT, "the escaped worker")
    (worker,) = with_marker(marker)

    def is_listed() -> bool:
        state = rundir.read_state(handle.run_dir) or handle.state
        return state is not None and worker.pid in [int(p) for p, *_ in state.descendants]

    wait_until(
        is_listed,
        TIMEOUT,
        "the worker to be listed",
    )
    listed = rundir.read_state(handle.run_dir)
    assert listed is not None
    supervisor = listed.supervisor_pid
    os.kill(supervisor or 0, signal.SIGKILL)
    final = stop_run(handle.id, grace_s=1.0, wait_s=10.0)
    assert final is not None and final.status == "stopped"
    wait_until(lambda: not with_marker(marker), 10, "the escaped worker to be gone")
