"""The presets, runs and run commands, run as a user would (a child process)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

from gpustation.runs import rundir
from gpustation.runs.launch.stop import wait_for_end
from gpustation.runs.store.index import RunStore
from gpustation.runs.store.reconcile import list_active_runs
from tests.conftest import child_env, gpustation_cmd
from tests.runs.conftest import RunsEnv, command_preset, wait_until

TIMEOUT = 60.0


def gs(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpustation_cmd(*args), capture_output=True, text=True, env=child_env(), timeout=timeout
    )


def test_presets_list_json_and_bad_presets(runs_env: RunsEnv) -> None:
    write = runs_env["write_preset"]
    write("ok", command_preset("ok", "train_ok", args="steps = 2"))
    write("broken", 'title = "x"\ncommand = ["a", \n')
    write("typo", 'command = ["x"]\ntags = "not-a-list"\n')
    result = gs("presets", "list", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    ours = {p["name"]: p for p in doc["presets"] if p["origin"] == "user"}
    assert set(ours) == {"ok"}
    assert ours["ok"]["title"] == "ok title" and ours["ok"]["gpus"] == 1
    problems = {Path(p["path"]).stem: p for p in doc["problems"]}
    assert problems["broken"]["line"] == 2
    assert problems["typo"]["key"] == "tags" and "list of strings" in problems["typo"]["message"]
    # The plain listing names the bad files on stderr and still lists the good.
    plain = gs("presets", "list")
    assert plain.returncode == 0 and "ok" in plain.stdout
    assert "broken.toml:2:" in plain.stderr and "typo.toml:2: [tags]" in plain.stderr


def test_presets_show_with_overrides(runs_env: RunsEnv) -> None:
    runs_env["write_preset"]("ok", command_preset("ok", "train_ok", args="steps = 2\nlr = 0.1"))
    result = gs("presets", "show", "ok", "--set", "lr=0.5", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["args"] == {"steps": 2, "lr": 0.5}
    assert doc["argv"][-4:] == ["--steps", "2", "--lr", "0.5"]
    bad = gs("presets", "show", "ok", "--set", "steps=many")
    assert bad.returncode == 2 and "steps=many" in bad.stderr and "whole number" in bad.stderr


def test_run_streams_log_and_exits_0(runs_env: RunsEnv) -> None:
    runs_env["write_preset"]("ok", command_preset("ok", "train_ok", args="steps = 3"))
    result = gs("run", "ok", "--set", "tag=cli")
    assert result.returncode == 0, result.stderr
    assert "step 3 loss 0.667 tag=cli" in result.stdout and "done" in result.stdout
    # Not a terminal: plain progress lines, then the outcome.
    assert "step 3/3 (100 %)" in result.stderr
    assert "succeeded" in result.stderr
    (record,) = RunStore().list_runs()
    assert record.status == "succeeded" and record.overrides == {"tag": "cli"}


def test_run_of_a_crash_exits_1(runs_env: RunsEnv) -> None:
    runs_env["write_preset"]("crash", command_preset("crash", "crash"))
    result = gs("run", "crash")
    assert result.returncode == 1
    assert "RuntimeError: the dataset is missing" in result.stdout
    assert "failed" in result.stderr and "exited with code 3" in result.stderr


def test_unknown_preset_exits_2_with_near_names(runs_env: RunsEnv) -> None:
    runs_env["write_preset"]("resnet-bf16", command_preset("a", "train_ok"))
    runs_env["write_preset"]("resnet-fp32", command_preset("b", "train_ok"))
    result = gs("run", "resnet")
    assert result.returncode == 2
    assert "resnet-bf16" in result.stderr and "resnet-fp32" in result.stderr
    assert not (runs_env["dirs"]["data"] / "runs").exists() or not any(
        (runs_env["dirs"]["data"] / "runs").iterdir()
    )


def test_ctrl_c_stops_the_run_and_exits_130(runs_env: RunsEnv, tmp_path: Path) -> None:
    runs_env["write_preset"]("wait", command_preset("wait", "wait_file", str(tmp_path / "never")))
    proc = subprocess.Popen(
        gpustation_cmd("run", "wait"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        runs_root = runs_env["dirs"]["data"] / "runs"
        wait_until(
            lambda: any("ready" in p.read_text() for p in runs_root.glob("*/output.log")),
            TIMEOUT,
            "the run to start",
        )
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "interrupted: saving and leaving" in out
    assert "stopped" in err
    (record,) = RunStore().list_runs()
    assert record.status == "stopped"
    assert list_active_runs() == []


def test_detach_returns_the_id_and_the_run_goes_on(runs_env: RunsEnv, tmp_path: Path) -> None:
    release = tmp_path / "release"
    runs_env["write_preset"]("wait", command_preset("wait", "wait_file", str(release)))
    result = gs("run", "wait", "--detach")
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.strip()
    assert [a.id for a in list_active_runs()] == [run_id]
    listed = json.loads(gs("runs", "list", "--json").stdout)
    assert [(r["id"], r["status"]) for r in listed] == [(run_id, "running")]
    release.touch()
    state = wait_for_end(rundir.run_dir(run_id), TIMEOUT)
    assert state is not None and state.status == "succeeded"


def test_runs_stop_command(runs_env: RunsEnv, tmp_path: Path) -> None:
    runs_env["write_preset"]("wait", command_preset("wait", "wait_file", str(tmp_path / "never")))
    run_id = gs("run", "wait", "--detach").stdout.strip()
    result = gs("runs", "stop", run_id[-4:], "--grace", "2", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "stopped"
    assert list_active_runs() == []


def test_runs_list_show_and_compare(runs_env: RunsEnv) -> None:
    runs_env["write_preset"]("ok", command_preset("ok", "train_ok", args="steps = 2\nsleep = 0.2"))
    first = gs("run", "ok", "--detach").stdout.strip()
    second = gs("run", "ok", "--detach", "--set", "steps=4").stdout.strip()
    for run_id in (first, second):
        state = wait_for_end(rundir.run_dir(run_id), TIMEOUT)
        assert state is not None and state.status == "succeeded"

    listed = gs("runs", "list")
    assert listed.returncode == 0
    assert listed.stdout.index(second) < listed.stdout.index(first), "newest first"

    shown = json.loads(gs("runs", "show", first, "--json").stdout)
    assert shown["id"] == first and shown["steps"] == 2 and shown["final_loss"] == 1.0
    assert shown["energy_j"] is not None and shown["gpus"] == [0]

    doc = json.loads(gs("runs", "compare", first, second, "--json").stdout)
    rows = {row["name"]: row for row in doc["rows"]}
    assert rows["steps"]["values"] == [2, 4]
    assert rows["steps"]["change_pct"] == [0.0, 100.0]
    assert rows["final loss"]["values"] == [1.0, 0.5]
    assert rows["final loss"]["change_pct"][1] == -50.0
    assert rows["throughput (img/s)"]["values"] == [200.0, 400.0]
    assert rows["accuracy"]["values"] == [0.52, 0.54]
    for name in ("avg power (W)", "peak temp (°C)", "peak VRAM (MiB)", "energy per img (J)"):
        assert name in rows, name
    assert any(name.startswith("energy (") for name in rows)
    # The setting the second run changed is a row; the one both kept is said once.
    assert rows["set steps"]["values"] == [2, 4] and rows["set steps"]["setting"]
    assert doc["same"] == {"sleep": 0.2}

    table = gs("runs", "compare", first, second)
    assert table.returncode == 0
    assert "+100.0 %" in table.stdout and "-50.0 %" in table.stdout
    assert "same: sleep=0.2" in table.stdout and "+0.0 %" not in table.stdout
    assert first in table.stdout and second in table.stdout


def test_follow_reattaches_and_ctrl_c_leaves_the_run_going(
    runs_env: RunsEnv, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    runs_env["write_preset"]("wait", command_preset("wait", "wait_file", str(release)))
    run_id = gs("run", "wait", "--detach").stdout.strip()
    log = rundir.run_dir(run_id) / rundir.OUTPUT_LOG
    wait_until(lambda: log.exists() and "ready" in log.read_text(), TIMEOUT, "the run")
    proc = subprocess.Popen(
        gpustation_cmd("runs", "follow", run_id),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"  # following from the start of the log
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert [a.id for a in list_active_runs()] == [run_id], "the run goes on"

    release.touch()
    done = gs("runs", "follow", "last")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["ready", "released"]
    assert "succeeded" in done.stderr


def test_any_command_runs_supervised_with_no_preset(runs_env: RunsEnv) -> None:
    import sys

    code = "import os, time; time.sleep(1.5); print('FOO is', os.environ['FOO'])"
    result = gs(
        "run",
        "--name",
        "mytrain",
        "--env",
        "FOO=bar",
        "--gpus",
        "1",
        "--",
        sys.executable,
        "-c",
        code,
    )
    assert result.returncode == 0, result.stderr
    assert "FOO is bar" in result.stdout
    shown = gs("runs", "show", "last", "--json")
    run = json.loads(shown.stdout)
    assert run["preset"] == "mytrain" and run["status"] == "succeeded" and run["gpus"] == [1]
    assert run["argv"][-2:] == ["-c", code]  # as given, no shell
    assert run["duration_s"] > 1.0
    # no metrics protocol, yet the run has its GPU figures
    assert run["peak_power_w"] is not None and run["simulated"] is True


def test_a_command_run_refuses_bad_names_and_environment(runs_env: RunsEnv) -> None:
    for argv, named in (
        (("run", "--env", "1BAD=x", "--", "true"), "--env"),
        (("run", "--name", "../escape", "--", "true"), "--name"),
        (("run", "somepreset", "--", "true"), "not both"),
        (("run",), "give a preset"),
        (("snapshot", "--simulate", "--", "true"), "only for `gpustation run`"),
    ):
        result = gs(*argv)
        assert result.returncode == 2, (argv, result.stderr)
        assert named in result.stderr
