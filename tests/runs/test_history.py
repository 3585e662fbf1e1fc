"""Keeping the history tidy: delete, prune, notes and tags, and listing by them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpustation.runs import rundir
from gpustation.runs.store.index import RunStore
from tests.conftest import child_env, gpustation_cmd
from tests.runs.conftest import RunsEnv, command_preset

TIMEOUT = 120.0


def gs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpustation_cmd(*args), capture_output=True, text=True, env=child_env(), timeout=TIMEOUT
    )


def _run(name: str, code: str = "print('hi')") -> str:
    result = gs("run", "--name", name, "--detach", "--", sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.strip()
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        state = rundir.read_state(rundir.run_dir(run_id))
        if state is not None and not state.active:
            return run_id
        time.sleep(0.1)  # polling the run's state file
    raise AssertionError(f"run {run_id} did not end")


def test_notes_and_tags_live_in_the_run_directory_and_filter_the_list(runs_env: RunsEnv) -> None:
    a, b = _run("alpha"), _run("beta")
    assert gs("runs", "tag", a, "baseline", "lr:3e-4").returncode == 0
    assert gs("runs", "note", a, "the run before the fix").returncode == 0
    shown = json.loads(gs("runs", "show", a, "--json").stdout)
    assert (
        shown["tags"][-2:] == ["baseline", "lr:3e-4"] and shown["note"] == "the run before the fix"
    )
    notes = json.loads((rundir.run_dir(a) / rundir.ANNOTATIONS_JSON).read_text())
    assert notes["tags"] == ["baseline", "lr:3e-4"]
    listed = json.loads(gs("runs", "list", "--tag", "baseline", "--json").stdout)
    assert [r["id"] for r in listed] == [a]
    by_preset = json.loads(gs("runs", "list", "--preset", "beta", "--json").stdout)
    assert [r["id"] for r in by_preset] == [b]
    # the index is rebuilt from the run directories: tags and notes come back
    RunStore().db.unlink()
    again = json.loads(gs("runs", "show", a, "--json").stdout)
    assert again["note"] == "the run before the fix" and "baseline" in again["tags"]
    assert gs("runs", "tag", a, "baseline", "--remove").returncode == 0
    assert "baseline" not in json.loads(gs("runs", "show", a, "--json").stdout)["tags"]
    bad = gs("runs", "tag", a, "no spaces")
    assert bad.returncode == 2 and "tag" in bad.stderr


def test_delete_and_prune_remove_directories_and_rows(runs_env: RunsEnv) -> None:
    ok, failed, other = _run("keep"), _run("bad", "import sys; sys.exit(1)"), _run("old")
    dry = gs("runs", "prune", "--older-than", "0h", "--status", "failed", "--dry-run")
    assert dry.returncode == 0 and failed in dry.stdout and ok not in dry.stdout
    assert rundir.run_dir(failed).exists()
    result = gs("runs", "prune", "--older-than", "0h", "--status", "failed")
    assert result.returncode == 0, result.stderr
    assert not rundir.run_dir(failed).exists() and RunStore().get(failed) is None
    assert gs("runs", "delete", other).returncode == 0
    assert not rundir.run_dir(other).exists()
    left = [r["id"] for r in json.loads(gs("runs", "list", "--json").stdout)]
    assert left == [ok]
    assert gs("runs", "prune", "--older-than", "soon").returncode == 2


def test_a_run_still_going_is_not_deleted(runs_env: RunsEnv) -> None:
    result = gs(
        "run",
        "--name",
        "long",
        "--detach",
        "--",
        sys.executable,
        "-c",
        "import time; time.sleep(60)",
    )
    run_id = result.stdout.strip()
    try:
        refused = gs("runs", "delete", run_id)
        assert refused.returncode == 2 and "stop it first" in refused.stderr
        assert rundir.run_dir(run_id).exists()
    finally:
        gs("runs", "stop", run_id, "--grace", "1")


@pytest.fixture(autouse=True)
def _simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSTATION_SIMULATE", "1")


def test_runs_show_lists_a_profiled_run_s_top_kernels_and_ops(runs_env: RunsEnv) -> None:
    run_id = _run("profiled")
    profile = rundir.run_dir(run_id) / "profile"
    profile.mkdir()
    (profile / "top_ops.json").write_text(
        json.dumps(
            {
                "profiled_steps": 5,
                "step_ms": 37.0,
                "gpu_idle_pct": 23.4,
                "cuda_kernels": [
                    {
                        "name": "cudnn::bn_fw_tr_1C11_kernel",
                        "self_ms": 40.5,
                        "calls": 265,
                        "share": 0.219,
                    },
                ],
                "cpu_ops": [
                    {"name": "cudaLaunchKernel", "self_ms": 12.0, "calls": 900, "share": 0.065}
                ],
            }
        )
    )
    out = gs("runs", "show", run_id).stdout
    assert "GPU idle 23.4 %" in out and "cudnn::bn_fw_tr_1C11_kernel" in out
    assert "21.9 %" in out and "cudaLaunchKernel" in out and "trace.json" in out


def test_profile_needs_a_shipped_runner(runs_env: RunsEnv) -> None:
    result = gs("run", "--profile", "--", sys.executable, "-c", "pass")
    assert result.returncode == 2 and "--profile" in result.stderr
    bad = gs("run", "resnet50-bf16", "--profile", "--profile-steps", "0", "--detach")
    assert bad.returncode == 2 and "--profile-steps" in bad.stderr


def test_launcher_nsys_wraps_the_run_or_says_it_is_missing(
    runs_env: RunsEnv, tmp_path: Path
) -> None:
    import stat

    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = child_env(PATH=f"{empty}:/usr/bin:/bin")
    missing = subprocess.run(
        gpustation_cmd("run", "resnet50-bf16", "--launcher", "nsys", "--detach"),
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert missing.returncode == 2 and "nsys" in missing.stderr and "PATH" in missing.stderr
    fake = empty / "nsys"  # records how it was called, then runs the program it was given
    fake.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "args = sys.argv[1:]\n"
        "out = args[args.index('--output') + 1]\n"
        "open(out + '.called', 'w').write(' '.join(args))\n"
        "program = args[args.index('--output') + 2:]\n"
        "os.execvp(program[0], program)\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    runs_env["write_preset"]("wrapped", command_preset("wrapped", "train_ok", args="steps = 2"))
    result = subprocess.run(
        gpustation_cmd("run", "wrapped", "--launcher", "nsys"),
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    run_id = json.loads(gs("runs", "show", "last", "--json").stdout)["id"]
    called = (rundir.run_dir(run_id) / "profile" / "nsys.called").read_text()
    assert called.startswith("profile --trace cuda,nvtx,osrt")
    program = called.split()[called.split().index("--output") + 2 :]
    assert program[1].endswith("train_ok.py")  # the run's own program, then its args


def test_a_note_with_bytes_that_are_not_utf8_leaves_the_run_and_its_history_sound(
    runs_env: RunsEnv, tmp_path: Path
) -> None:
    from tests.runs.conftest import wait_until

    release = tmp_path / "release"
    runs_env["write_preset"]("wait", command_preset("wait", "wait_file", str(release)))
    started = gs("run", "wait", "--detach")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    wait_until(lambda: getattr(RunStore().get(run_id), "status", None) == "running", TIMEOUT)
    # as a shell passes it: the bytes themselves; Python sees them surrogate-escaped
    noted = subprocess.run(
        [*gpustation_cmd("runs", "note", run_id), b"caf\xe9 \xff ok"],
        capture_output=True,
        env=child_env(),
        timeout=TIMEOUT,
    )
    assert noted.returncode == 0, noted.stderr
    assert "caf\ufffd \ufffd ok" in noted.stdout.decode()
    tagged = gs("runs", "tag", run_id, "keep")
    assert tagged.returncode == 0 and "keep" in tagged.stdout, tagged.stderr
    release.touch()
    # the supervisor's last word reaches the history: the run is not left running
    wait_until(lambda: getattr(RunStore().get(run_id), "status", None) == "succeeded", TIMEOUT)
    record = RunStore().get(run_id)
    assert record is not None and record.note == "caf\ufffd \ufffd ok" and "keep" in record.tags
    listed = gs("runs", "list", "--tag", "keep")
    assert listed.returncode == 0 and run_id in listed.stdout, listed.stderr
    shown = gs("runs", "show", run_id)
    assert shown.returncode == 0 and "caf\ufffd \ufffd ok" in shown.stdout, shown.stderr
    kept = json.loads((rundir.run_dir(run_id) / rundir.ANNOTATIONS_JSON).read_text())
    assert kept["note"] == "caf\ufffd \ufffd ok"


def test_a_note_left_with_a_lone_surrogate_no_longer_breaks_the_run(runs_env: RunsEnv) -> None:
    run_id = _run("old-note")
    # what an older version wrote for `runs note ID $'\xff'`
    (rundir.run_dir(run_id) / rundir.ANNOTATIONS_JSON).write_text('{"note": "x\\udcff"}')
    tagged = gs("runs", "tag", run_id, "keep")
    assert tagged.returncode == 0, tagged.stderr
    shown = gs("runs", "show", run_id)
    assert shown.returncode == 0 and "x\ufffd" in shown.stdout, shown.stderr


def test_deleting_a_run_whose_directory_is_a_link_says_so_and_touches_nothing(
    runs_env: RunsEnv, tmp_path: Path
) -> None:
    run_id = _run("linked")
    directory = rundir.run_dir(run_id)
    target = tmp_path / "moved-away"
    directory.rename(target)
    directory.symlink_to(target)
    before = sorted(p.name for p in target.iterdir())
    result = gs("runs", "delete", run_id)
    assert result.returncode == 2, result.stderr
    assert "symbolic link" in result.stderr and "Traceback" not in result.stderr
    assert directory.is_symlink() and sorted(p.name for p in target.iterdir()) == before
    assert RunStore().get(run_id) is not None  # nothing was forgotten either
    directory.unlink()  # the link removed by hand: the run is gone from the history
    assert RunStore().get(run_id) is None
    assert target.is_dir() and sorted(p.name for p in target.iterdir()) == before
