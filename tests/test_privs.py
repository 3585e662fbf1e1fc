"""Under sudo nothing of the user's runs as root: the workload, its supervisor and every
file in the user's directories are the invoking user's; only the driver's calls keep root.

These tests start real processes as root with ``SUDO_UID``/``SUDO_GID`` naming uid
65534, a uid that needs no account (its home and directories are the test's own).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest

from gpustation import paths
from gpustation.control.journal import read_journal
from gpustation.errors import EXIT_USAGE
from tests.conftest import FAKE_NVML_DIR, REPO
from tests.tools import missing

NOBODY = 65534

# The workload: its own ids and its parent's (the supervisor), real/effective/saved.
WHOAMI = """\
import json, os

def ids(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Uid:"):
            return [int(x) for x in line.split()[1:4]]

print("IDS " + json.dumps({"workload": ids(os.getpid()), "supervisor": ids(os.getppid())}))
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acting for another user needs root")


class NobodyHome(TypedDict):
    python: str
    home: Path
    env: dict[str, str]
    extra: list[str]


def _user_python() -> tuple[str, list[str]]:
    """An interpreter uid 65534 can run (this one may live in root's home), and the
    import path it needs to find this checkout's dependencies."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates: list[tuple[str, list[str]]] = [(sys.executable, [])]
    system = shutil.which(version, path="/usr/bin:/usr/local/bin")
    if system:
        candidates.append((system, site.getsitepackages()))
    for exe, extra in candidates:
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join([str(REPO), *extra])}
        try:
            done = subprocess.run(
                [exe, "-c", "import psutil, rich, gpustation.cli"],
                user=NOBODY,
                group=NOBODY,
                extra_groups=[],
                env=env,
                cwd="/",
                capture_output=True,
                timeout=60,
            )
        except OSError:
            continue
        if done.returncode == 0:
            return exe, extra
    missing(f"a {version} that uid {NOBODY} can run, with gpustation's dependencies")
    raise AssertionError  # not reached


@pytest.fixture
def nobody_home() -> Iterator[NobodyHome]:
    """uid 65534's home (outside root's private tmp) with a preset that says who runs it."""
    python, extra = _user_python()
    base = Path(tempfile.mkdtemp(prefix="gpustation-sudo-"))
    try:
        home = base / "home"
        presets = home / ".config" / "gpustation" / "presets" / "runs"
        presets.mkdir(parents=True)
        (home / "whoami.py").write_text(WHOAMI)
        (presets / "whoami.toml").write_text(
            f'title = "who am I"\ncommand = [{json.dumps(python)}, '
            f"{json.dumps(str(home / 'whoami.py'))}]\ngpus = 1\n"
        )
        for path in [base, *base.rglob("*")]:
            os.chown(path, NOBODY, NOBODY)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GPUSTATION_", "XDG_", "SUDO_", "FAKE_NVML"))
        }
        env.update(HOME=str(home), PYTHONPATH=os.pathsep.join([str(REPO), *extra]))
        yield {"python": python, "home": home, "env": env, "extra": extra}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _sudo(env: dict[str, str]) -> dict[str, str]:
    return {**env, "SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY), "SUDO_USER": "nobody"}


def _gpustation(
    ctx: NobodyHome, *args: str, env: dict[str, str], as_nobody: bool = False
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ctx["python"], "-m", "gpustation", *args],
        env=env,
        cwd=ctx["home"],
        capture_output=True,
        text=True,
        timeout=180,
        user=NOBODY if as_nobody else None,
        group=NOBODY if as_nobody else None,
        extra_groups=[] if as_nobody else None,
    )


def _not_nobodys(root: Path) -> list[str]:
    return [
        f"{p} (uid {p.lstat().st_uid})"
        for p in [root, *root.rglob("*")]
        if p.lstat().st_uid != NOBODY or p.lstat().st_gid != NOBODY
    ]


def _ids_of(run_dir: Path) -> dict[str, Any]:
    for line in (run_dir / "output.log").read_text().splitlines():
        if line.startswith("IDS "):
            ids: dict[str, Any] = json.loads(line[4:])
            return ids
    raise AssertionError(f"no IDS line in {run_dir / 'output.log'}")


def test_a_sweep_under_sudo_runs_and_writes_as_the_user_and_sets_limits_as_root(
    nobody_home: NobodyHome,
) -> None:
    ctx = nobody_home
    # A simulated card that, like the driver, refuses a limit not set as root.
    env = _sudo({**ctx["env"], "GPUSTATION_SIM_REQUIRE_ROOT": "1"})
    done = _gpustation(
        ctx, "sweep", "whoami", "--power-limit", "80%,100%", "--simulate", "1", env=env
    )
    assert done.returncode == 0, done.stderr + done.stdout

    home = ctx["home"]
    data, state = home / ".local/share/gpustation", home / ".local/state/gpustation"
    runs = sorted((data / "runs").iterdir())
    assert len(runs) == 2
    for run_dir in runs:
        # the workload and its supervisor: the user's, real, effective and saved uid
        assert _ids_of(run_dir) == {"workload": [NOBODY] * 3, "supervisor": [NOBODY] * 3}
        assert json.loads((run_dir / "run.json").read_text())["user"]["uid"] == NOBODY
    # the limits were set (as root: the card refuses otherwise) and put back, journalled
    journal = read_journal(state / "control-journal.jsonl").entries
    # 80 % then 100 %; the restore finds the card at its limit of before
    assert [(e.what, e.outcome) for e in journal] == [("power_limit", "made")] * 2
    sweep_json = json.loads(next((data / "sweeps").glob("*/sweep.json")).read_text())
    assert [p["status"] for p in sweep_json["points"]] == ["succeeded", "succeeded"]
    assert sweep_json["restored"]
    # every file and directory in the user's home is the user's: runs.db, the run
    # directories, the sweep, the journal and its lock, the simulated card's state
    assert (data / "runs.db").exists()
    assert _not_nobodys(home) == []

    # The user's own next command works in those directories, and says who ran what.
    shown = _gpustation(ctx, "runs", "show", runs[0].name, env=ctx["env"], as_nobody=True)
    assert shown.returncode == 0, shown.stderr
    assert "ran as" in shown.stdout and "nobody (uid 65534, through sudo)" in shown.stdout
    again = _gpustation(ctx, "run", "whoami", "--simulate", "1", env=ctx["env"], as_nobody=True)
    assert again.returncode == 0, again.stderr + again.stdout
    assert _not_nobodys(home) == []


def test_a_power_limit_under_sudo_reaches_the_driver_as_root_and_journals_as_the_user(
    nobody_home: NobodyHome,
) -> None:
    ctx = nobody_home
    scenario = ctx["home"] / "nvml.json"
    scenario.write_text(json.dumps({"require_root": "euid"}))
    env = _sudo(
        {
            **ctx["env"],
            "PYTHONPATH": os.pathsep.join([str(FAKE_NVML_DIR), ctx["env"]["PYTHONPATH"]]),
            "FAKE_NVML_SCENARIO": str(scenario),
        }
    )
    done = _gpustation(ctx, "power", "set", "300W", "--gpus", "0", env=env)
    assert done.returncode == 0, done.stderr + done.stdout
    state = ctx["home"] / ".local/state/gpustation"
    entries = read_journal(state / "control-journal.jsonl").entries
    assert [(e.what, e.new, e.outcome) for e in entries] == [("power_limit", 300.0, "made")]
    os.chown(scenario, NOBODY, NOBODY)
    assert _not_nobodys(ctx["home"]) == []

    # The same call without sudo's user, as that user: the fake driver refuses it.
    refused = _gpustation(
        ctx, "power", "set", "300W", "--gpus", "0", env={**env, "SUDO_UID": ""}, as_nobody=True
    )
    assert refused.returncode == 4, refused.stderr


def test_plain_root_runs_stay_root_and_say_so(tmp_path: Path) -> None:
    preset_dir = paths.user_run_presets_dir()
    preset_dir.mkdir(parents=True)
    script = tmp_path / "whoami.py"
    script.write_text(WHOAMI)
    (preset_dir / "whoami.toml").write_text(
        f"command = [{json.dumps(sys.executable)}, {json.dumps(str(script))}]\ngpus = 1\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUDO_")}
    done = subprocess.run(
        [sys.executable, "-m", "gpustation", "run", "whoami", "--simulate", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    (run_dir,) = paths.runs_dir().iterdir()
    assert _ids_of(run_dir) == {"workload": [0, 0, 0], "supervisor": [0, 0, 0]}
    shown = subprocess.run(
        [sys.executable, "-m", "gpustation", "runs", "show", run_dir.name],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "root (uid 0, no invoking user)" in shown.stdout, shown.stdout + shown.stderr


def test_under_sudo_the_users_directories_come_from_their_account_when_home_is_roots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for kind in ("CONFIG", "DATA", "STATE"):
        monkeypatch.delenv(f"GPUSTATION_{kind}_DIR", raising=False)
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        monkeypatch.delenv(var, raising=False)
    import pwd

    account = pwd.getpwuid(NOBODY)
    monkeypatch.setenv("HOME", pwd.getpwuid(0).pw_dir)  # what sudo leaves by default
    monkeypatch.setenv("SUDO_UID", str(NOBODY))
    monkeypatch.setenv("SUDO_GID", str(NOBODY))
    assert paths.data_dir() == Path(account.pw_dir) / ".local/share/gpustation"
    assert paths.config_dir() == Path(account.pw_dir) / ".config/gpustation"
    # sudo -E (HOME kept): the user's HOME stands
    monkeypatch.setenv("HOME", "/somewhere/else")
    assert paths.state_dir() == Path("/somewhere/else/.local/state/gpustation")
    # no invoking user: root's own
    monkeypatch.delenv("SUDO_UID")
    monkeypatch.setenv("HOME", pwd.getpwuid(0).pw_dir)
    assert paths.data_dir() == Path(pwd.getpwuid(0).pw_dir) / ".local/share/gpustation"


def test_a_sudo_uid_that_is_not_a_number_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpustation import cli, privs

    monkeypatch.setenv("SUDO_UID", "alice")
    assert cli.main(["snapshot", "--simulate", "1"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "SUDO_UID='alice'" in err and "Unset SUDO_UID" in err
    assert privs.dropped() is None


def test_a_python_the_user_cannot_run_is_named_and_the_run_recorded_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpustation.errors import GpustationError
    from gpustation.runs import rundir
    from gpustation.runs.launch.start import launch
    from gpustation.runs.presets import RunPreset

    private = tmp_path / "private"  # root's own, as a Python installed in /root is
    private.mkdir(mode=0o700)
    (private / "python").symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(private / "python"))
    monkeypatch.setenv("SUDO_UID", str(NOBODY))
    monkeypatch.setenv("SUDO_GID", str(NOBODY))
    with pytest.raises(GpustationError) as err:
        launch(
            RunPreset(name="never", command=["true"]),
            device_count=None,
            backend_info={"kind": "none", "simulated": False},
        )
    message = str(err.value)
    assert f"cannot start the run's supervisor as nobody (uid {NOBODY})" in message
    assert "Permission denied" in message and "must be able to run this Python" in message
    (run_dir,) = paths.runs_dir().iterdir()
    state = rundir.read_state(run_dir)
    assert state is not None and state.status == "failed" and state.reason == message


def test_under_sudo_a_directory_root_left_in_the_users_home_is_named_not_written(
    nobody_home: NobodyHome,
) -> None:
    ctx = nobody_home
    left = ctx["home"] / ".local" / "share" / "gpustation"
    left.mkdir(parents=True)  # root's, as an older `sudo gpustation` left it
    os.chown(left.parent.parent, NOBODY, NOBODY)
    os.chown(left.parent, NOBODY, NOBODY)
    # a command that writes there (a reader such as snapshot starts on such a directory)
    done = _gpustation(ctx, "runs", "list", env=_sudo(ctx["env"]))
    assert done.returncode == EXIT_USAGE, done.stdout + done.stderr
    assert f"{left} (set GPUSTATION_DATA_DIR to move it): not writable" in done.stderr
    assert f"it belongs to uid 0; `sudo chown -R nobody {left}`" in done.stderr


def test_under_sudo_the_fleets_ssh_runs_as_the_user(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpustation.fleet.ssh import DOWN, HostStream

    monkeypatch.setenv("SUDO_UID", str(NOBODY))
    monkeypatch.setenv("SUDO_GID", str(NOBODY))
    # in ssh's place, a command that says who it runs as (its keys and known hosts follow)
    stream = HostStream("h", ["/bin/sh", "-c", "id -u >&2; exit 3"], retry=False).start()
    try:
        state = stream.wait(lambda s: s.state == DOWN, 30)
    finally:
        stream.close()
    assert state.state == DOWN and state.error == str(NOBODY)


def test_under_sudo_the_launch_forms_parser_reader_runs_as_the_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpustation.runs.launch.runner_args import read_parser

    python, extra = _user_python()
    where = Path(tempfile.mkdtemp(prefix="gpustation-parser-"))
    try:
        where.chmod(0o755)
        (where / "uid_parser.py").write_text(
            "import argparse, os\n\ndef build_parser():\n"
            "    parser = argparse.ArgumentParser()\n"
            "    parser.add_argument('--uid', type=int, default=os.getuid())\n"
            "    return parser\n"
        )
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(where), str(REPO), *extra]))
        monkeypatch.setenv("SUDO_UID", str(NOBODY))
        monkeypatch.setenv("SUDO_GID", str(NOBODY))
        monkeypatch.chdir(where)
        (option,) = [o for o in read_parser("uid_parser", python=python) if o.dest == "uid"]
        assert option.default == NOBODY
    finally:
        shutil.rmtree(where, ignore_errors=True)
