"""No run can hang the history: a run (or anyone) that puts a FIFO or a link to
/dev/zero where its metrics, log or annotations should be gets that file skipped
and named, never a reader that waits forever or reads without end; the same for
the presets folder and the simulator's state. Every command runs as a child
process with a deadline and a cap on its memory, as a user would meet it."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpustation import paths
from gpustation.runs import rundir
from gpustation.runs.store.index import db_path
from tests.conftest import child_env, gpustation_cmd, run_gpustation
from tests.runs.conftest import RunsEnv, command_preset, wait_until

TIMEOUT = 60.0
#: a reader that reads /dev/zero to its end meets this long before the machine does
MEMORY_CAP = 2 << 30

KINDS = ("fifo", "devzero")


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def gs(
    *args: str, timeout: float = TIMEOUT, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return run_gpustation(*args, timeout=timeout, cwd=cwd, preexec_fn=_cap_memory)


def plant(path: Path, kind: str) -> None:
    """Put a FIFO, or a link to /dev/zero, where ``path`` was."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


def finished_run(name: str) -> Path:
    result = gs("run", "--name", name, "--", sys.executable, "-c", "print('trained')")
    assert result.returncode == 0, result.stderr
    (directory,) = paths.runs_dir().iterdir()
    state = rundir.read_state(directory)
    assert state is not None and state.status == "succeeded"
    wait_until(
        lambda: not rundir.process_matches(state.supervisor_pid, state.supervisor_create_time),
        TIMEOUT,
        "the supervisor to go",
    )
    return directory


def as_lost(directory: Path) -> None:
    """As if the machine had restarted mid-run, its index gone: every reader reads
    every file of the run (the log's tail for its error, the metrics, the notes)."""
    state = rundir.read_state(directory)
    assert state is not None
    state.status, state.ended_at, state.exit_code = "running", None, None
    rundir.write_state(directory, state)
    rundir.prepare_exit_status(directory)  # no end there either
    db_path().unlink()


def assert_finished_naming(result: subprocess.CompletedProcess[str], path: Path) -> None:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert f"skipped run file {path}" in result.stderr or f"skipped metrics file {path}" in (
        result.stderr
    ), result.stderr


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", [rundir.METRICS_FILE, rundir.OUTPUT_LOG, rundir.ANNOTATIONS_JSON])
def test_a_run_file_that_is_a_fifo_or_dev_zero_hangs_no_reader(
    runs_env: RunsEnv, name: str, kind: str
) -> None:
    directory = finished_run("planted")
    as_lost(directory)
    plant(directory / name, kind)

    listed = gs("runs", "list")
    assert_finished_naming(listed, directory / name)
    assert directory.name in listed.stdout and "lost" in listed.stdout
    as_json = gs("runs", "list", "--json")
    assert_finished_naming(as_json, directory / name)
    (row,) = json.loads(as_json.stdout)
    assert (row["id"], row["status"]) == (directory.name, "lost")
    shown = gs("runs", "show", directory.name)
    assert_finished_naming(shown, directory / name)
    assert directory.name in shown.stdout


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_that_plants_a_fifo_or_dev_zero_does_not_hang_gpustation_run(
    runs_env: RunsEnv, kind: str
) -> None:
    # The run itself puts them there while `gpustation run` follows it: its metrics and
    # notes, and where its supervisor (its parent) writes the end and the next state.
    code = (
        "import os, pathlib\n"
        "d = pathlib.Path(os.environ['GPUSTATION_RUN_DIR'])\n"
        "(d / 'exit-status').unlink()\n"
        "names = ('metrics.jsonl', 'annotations.json', 'exit-status')\n"
        "for name in (*names, f'.state.json.{os.getppid()}.tmp'):\n"
        f"    os.mkfifo(d / name) if {kind!r} == 'fifo' else os.symlink('/dev/zero', d / name)\n"
        "print('planted', flush=True)\n"
    )
    result = gs("run", "--name", "planter", "--", sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert "planted" in result.stdout and "succeeded" in result.stderr
    (directory,) = paths.runs_dir().iterdir()
    assert f"skipped metrics file {directory / rundir.METRICS_FILE}" in result.stderr
    listed = gs("runs", "list", "--json")
    assert [r["status"] for r in json.loads(listed.stdout)] == ["succeeded"], listed.stderr


def test_a_run_that_replaces_its_log_while_followed_does_not_keep_gpustation_run_waiting(
    runs_env: RunsEnv, tmp_path: Path
) -> None:
    # `gpustation run` reads output.log through the file it opened; the run then
    # puts a link to a larger file in its place: the end is the end of what was read.
    bigger, release = tmp_path / "bigger.log", tmp_path / "release"
    bigger.write_bytes(b"x" * (1 << 20))
    code = (
        "import os, pathlib, time\n"
        "d = pathlib.Path(os.environ['GPUSTATION_RUN_DIR'])\n"
        "print('ready', flush=True)\n"
        f"while not os.path.exists({str(release)!r}):\n"
        "    time.sleep(0.02)\n"
        "os.unlink(d / 'output.log')\n"
        f"os.symlink({str(bigger)!r}, d / 'output.log')\n"
    )
    argv = gpustation_cmd("run", "--name", "swapper", "--", sys.executable, "-c", code)
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()
    ) as proc:
        try:

            def following_the_log() -> bool:
                for fd in Path(f"/proc/{proc.pid}/fd").iterdir():
                    try:
                        if os.readlink(fd).endswith(f"/{rundir.OUTPUT_LOG}"):
                            return True
                    except OSError:
                        continue
                return False

            wait_until(following_the_log, TIMEOUT, "gpustation run to open the run's log")
            release.touch()
            out, err = proc.communicate(timeout=TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, err
    assert "ready" in out and "succeeded" in err


def _cpu_s(pid: int) -> float:
    """The process's user + system CPU time, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_live_supervisor_whose_metrics_become_dev_zero_does_not_spin_and_ends(
    runs_env: RunsEnv, tmp_path: Path
) -> None:
    from gpustation.runs.launch.start import launch
    from gpustation.runs.presets import load_presets

    release = tmp_path / "release"
    runs_env["write_preset"]("waits", command_preset("waits", "wait_file", str(release)))
    presets, problems = load_presets()
    assert "waits" in presets, problems
    handle = launch(presets["waits"])
    metrics = handle.run_dir / rundir.METRICS_FILE
    wait_until(metrics.exists, TIMEOUT, "the run's first metrics")
    state = rundir.read_state(handle.run_dir)
    assert state is not None and state.supervisor_pid
    supervisor = state.supervisor_pid
    plant(metrics, "devzero")
    before = _cpu_s(supervisor)
    release.touch()  # the run ends: its supervisor folds the metrics into the history

    deadline = time.monotonic() + 20.0
    spent = 0.0
    while rundir.process_matches(supervisor, state.supervisor_create_time):
        try:
            spent = _cpu_s(supervisor) - before
        except (FileNotFoundError, ProcessLookupError):
            break
        assert time.monotonic() < deadline, f"the supervisor still runs, {spent:.1f} s of CPU on"
        time.sleep(0.1)  # polling the supervisor's CPU time
    assert spent < 5.0, f"the supervisor spent {spent:.1f} s of CPU ending the run"
    final = rundir.read_state(handle.run_dir)
    assert final is not None and final.status == "succeeded"
    supervisor_log = (handle.run_dir / rundir.SUPERVISOR_LOG).read_text()
    assert f"skipped metrics file {metrics}" in supervisor_log


@pytest.mark.parametrize("kind", KINDS)
def test_a_fifo_or_dev_zero_in_the_presets_folder_is_named_and_skipped(
    runs_env: RunsEnv, kind: str
) -> None:
    runs_env["write_preset"](
        "good", command_preset("good", "train_ok", args="steps = 2\nsleep = 0.0")
    )
    planted = runs_env["preset_dir"] / "planted.toml"
    plant(planted, kind)
    what = "a FIFO" if kind == "fifo" else "a character device"

    listed = gs("presets")
    assert listed.returncode == 0, listed.stderr
    assert "good" in listed.stdout and f"{planted}" in listed.stderr and what in listed.stderr
    dry = gs("sweep", "good", "--set", "steps=1,2", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "2 points" in dry.stdout and f"skipped preset {planted}" in dry.stderr
    ran = gs("run", "good")
    assert ran.returncode == 0, ran.stderr
    assert f"skipped preset {planted}" in ran.stderr
    asked = gs("run", "planted")
    assert asked.returncode == 2 and f"{planted}" in asked.stderr and what in asked.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_a_fifo_or_dev_zero_as_the_simulator_state_is_started_afresh(
    gpustation_dirs: dict[str, Path], kind: str
) -> None:
    from gpustation.telemetry.sim import machine_path

    first = gs("snapshot", "--simulate", "2", "--json")
    assert first.returncode == 0, first.stderr
    state = machine_path("rtx4090", 2)
    assert state.is_file()
    plant(state, kind)
    again = gs("snapshot", "--simulate", "2", "--json")
    assert again.returncode == 0, again.stderr
    assert len(json.loads(again.stdout)["gpus"]) == 2
    assert state.is_file() and not state.is_symlink()  # written afresh in its place


@pytest.mark.parametrize("kind", KINDS)
def test_a_recording_that_is_a_fifo_or_dev_zero_is_refused_naming_it_and_set_aside(
    gpustation_dirs: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    recording = tmp_path / "r.zst"
    plant(recording, kind)
    what = "a FIFO" if kind == "fifo" else "a character device"
    replayed = gs("replay", str(recording))
    assert replayed.returncode == 2, replayed.stderr
    assert f"recording {recording}: {what}" in replayed.stderr
    # Recording there is refused, naming it: what is not a recording is never
    # written to, nor rotated away, and nothing waits on it.
    recorded = gs("record", "--simulate", "1", "--duration", "1", str(recording))
    assert recorded.returncode == 2, recorded.stderr
    assert f"{recording} exists and is not a gpustation recording" in recorded.stderr
    assert recording.is_fifo() if kind == "fifo" else recording.is_symlink()
