"""Rules of the run history that a slip would break silently, each stated by a test:
which runs prune may delete, what --status and --limit accept, the working
directory a run records (and one that was deleted), --set and --env values with
`=` inside, tags of the wrong shape, and a CUDA_VISIBLE_DEVICES the GPU choice
replaces. Every command runs as a child process, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpustation import paths
from gpustation.runs import rundir
from gpustation.runs.store.index import RunStore, db_path
from tests.conftest import child_env, gpustation_cmd, run_gpustation
from tests.runs.conftest import RunsEnv, command_preset, wait_until

TIMEOUT = 60.0


def gs(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_gpustation(*args, timeout=TIMEOUT, cwd=cwd)


def ended_run(name: str, code: str = "print('hi')") -> str:
    result = gs("run", "--name", name, "--detach", "--", sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.strip()
    wait_until(
        lambda: (s := rundir.read_state(rundir.run_dir(run_id))) is not None and not s.active,
        TIMEOUT,
        f"run {run_id} to end",
    )
    return run_id


def listed_ids(*args: str) -> list[str]:
    result = gs("runs", "list", "--json", *args)
    assert result.returncode == 0, result.stderr
    return [r["id"] for r in json.loads(result.stdout)]


def test_prune_never_deletes_a_run_still_going(runs_env: RunsEnv) -> None:
    old = ended_run("old")
    started = gs(
        "run",
        "--name",
        "long",
        "--detach",
        "--",
        sys.executable,
        "-c",
        "import time; time.sleep(60)",
    )
    assert started.returncode == 0, started.stderr
    going = started.stdout.strip()
    try:
        dry = gs("runs", "prune", "--older-than", "0h", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert old in dry.stdout and going not in dry.stdout
        # Its row says it failed (an index that lags): its own directory says it runs.
        row = RunStore().get(going)
        assert row is not None
        row.status = "failed"
        RunStore().upsert(row)
        assert json.loads(gs("runs", "show", going, "--json").stdout)["status"] == "failed"
        dry = gs("runs", "prune", "--older-than", "0h", "--dry-run")
        assert old in dry.stdout and going not in dry.stdout
        pruned = gs("runs", "prune", "--older-than", "0h")
        assert pruned.returncode == 0, pruned.stderr
        assert "deleted 1 runs" in pruned.stdout
        assert rundir.run_dir(going).is_dir() and not rundir.run_dir(old).exists()
        refused = gs("runs", "delete", going)
        assert refused.returncode == 2 and "stop it first" in refused.stderr
        assert rundir.run_dir(going).is_dir()
    finally:
        gs("runs", "stop", going, "--grace", "1")


def test_status_and_limit_are_checked_and_no_run_is_dropped(runs_env: RunsEnv) -> None:
    first, second = ended_run("one"), ended_run("two")
    bogus = gs("runs", "prune", "--older-than", "1d", "--status", "bogus")
    assert bogus.returncode == 2
    assert "'bogus'" in bogus.stderr and "succeeded, failed, stopped, lost" in bogus.stderr
    going = gs("runs", "prune", "--older-than", "1d", "--status", "running")
    assert going.returncode == 2 and "succeeded, failed, stopped, lost" in going.stderr
    listed = gs("runs", "list", "--status", "bogus")
    assert listed.returncode == 2 and "running" in listed.stderr and "lost" in listed.stderr

    negative = gs("runs", "list", "--limit", "-1")
    assert negative.returncode == 2 and "--limit" in negative.stderr
    assert listed_ids() == [second, first]
    assert listed_ids("--limit", "0") == [second, first]  # 0: all of them
    assert listed_ids("--limit", "1") == [second]
    assert listed_ids("--limit", "0", "--preset", "one") == [first]


def test_a_run_records_and_runs_in_the_directory_it_was_started_from(
    runs_env: RunsEnv, tmp_path: Path
) -> None:
    here = tmp_path / "project"
    here.mkdir()
    code = "import os; print('cwd', os.getcwd())"
    result = gs("run", "--name", "where", "--", sys.executable, "-c", code, cwd=here)
    assert result.returncode == 0, result.stderr
    assert f"cwd {here}" in result.stdout
    (directory,) = paths.runs_dir().iterdir()
    run = rundir.read_run(directory)
    assert run is not None and run["cwd"] == str(here)


def test_a_run_from_a_deleted_directory_exits_2_and_leaves_no_run_directory(
    runs_env: RunsEnv, tmp_path: Path
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    # The shell enters the directory, then deletes it, then becomes gpustation.
    argv = ["sh", "-c", 'cd "$0" && rmdir "$0" && exec "$@"', str(gone)]
    argv += gpustation_cmd("run", "--", sys.executable, "-c", "pass")
    result = subprocess.run(argv, capture_output=True, text=True, env=child_env(), timeout=TIMEOUT)
    assert result.returncode == 2, result.stderr
    assert "current directory no longer exists" in result.stderr
    assert "Traceback" not in result.stderr
    root = paths.runs_dir()
    assert not root.exists() or not any(root.iterdir())


def test_set_and_env_values_keep_every_equals_sign(runs_env: RunsEnv) -> None:
    runs_env["write_preset"](
        "ok", command_preset("ok", "train_ok", args='steps = 1\nsleep = 0.0\ntag = "x"')
    )
    result = gs("run", "ok", "--set", "tag=a=b")
    assert result.returncode == 0, result.stderr
    assert "tag=a=b" in result.stdout
    (directory,) = paths.runs_dir().iterdir()
    run = rundir.read_run(directory)
    assert run is not None and run["overrides"] == {"tag": "a=b"}

    code = "import os; print('value', os.environ['SPEC'])"
    env_run = gs("run", "--env", "SPEC=k=v=w", "--", sys.executable, "-c", code)
    assert env_run.returncode == 0, env_run.stderr
    assert "value k=v=w" in env_run.stdout


def test_tags_of_the_wrong_shape_are_no_tags(runs_env: RunsEnv) -> None:
    run_id = ended_run("shaped")
    notes = rundir.run_dir(run_id) / rundir.ANNOTATIONS_JSON
    notes.write_text(json.dumps({"tags": "notalist", "note": ["not", "text"]}))
    db_path().unlink()  # every reader reads the run's files
    shown = json.loads(gs("runs", "show", run_id, "--json").stdout)
    assert shown["tags"] == ["command"] and shown["note"] is None
    tagged = gs("runs", "tag", run_id, "good")
    assert tagged.returncode == 0, tagged.stderr
    assert json.loads(notes.read_text())["tags"] == ["good"]
    assert json.loads(gs("runs", "show", run_id, "--json").stdout)["tags"] == ["command", "good"]
    notes.write_text(json.dumps({"tags": ["kept", 7, None, "also"]}))
    db_path().unlink()
    assert json.loads(gs("runs", "show", run_id, "--json").stdout)["tags"] == [
        "command",
        "kept",
        "also",
    ]


def test_cuda_visible_devices_in_env_warns_that_the_gpu_choice_replaces_it(
    runs_env: RunsEnv,
) -> None:
    code = "import os; print('visible', os.environ['CUDA_VISIBLE_DEVICES'])"
    result = gs(
        "run", "--gpus", "1", "--env", "CUDA_VISIBLE_DEVICES=7", "--", sys.executable, "-c", code
    )
    assert result.returncode == 0, result.stderr
    assert "visible 1" in result.stdout
    assert "warning: --env CUDA_VISIBLE_DEVICES=7 is replaced by the run's GPUs (1)" in (
        result.stderr
    )
    assert "--gpus" in result.stderr.split("CUDA_VISIBLE_DEVICES=7", 1)[1]
    same = ["--gpus", "1", "--env", "CUDA_VISIBLE_DEVICES=1"]
    quiet = gs("run", *same, "--", sys.executable, "-c", code)
    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr
