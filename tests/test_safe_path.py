"""Children start from a safe path: a ``gpustation/`` (or ``torch/``) package planted in
the working directory of each kind of Python child gpustation starts is never imported.

The planted packages write a mark and exit 97; each child runs for real in the planted
directory, and must reach gpustation's own code instead.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpustation.control.live import fan_controller_argv
from gpustation.pyargv import SAFE_PATH_ENV, python_argv
from gpustation.runs.launch.argv import build_env
from gpustation.runs.launch.start import supervisor_argv
from gpustation.runs.multinode.launch import agent_command, node_argv, node_env
from gpustation.runs.multinode.node_agent import torchrun_argv
from gpustation.runs.presets import RunPreset
from gpustation.serve.web import dashboard_command
from tests.conftest import child_env
from tests.runs.conftest import wait_until

PLANTED_EXIT = 97
PLANTED = """\
import os, sys
with open(os.environ["PLANTED_MARK"], "a") as f:
    f.write("planted {name} imported by " + " ".join(sys.argv) + "\\n")
sys.exit(97)
"""


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding a planted ``gpustation`` and ``torch``."""
    where = tmp_path / "planted"
    for name in ("gpustation", "torch"):
        (where / name).mkdir(parents=True)
        (where / name / "__init__.py").write_text(PLANTED.format(name=name))
    mark = tmp_path / "mark"
    monkeypatch.setenv("PLANTED_MARK", str(mark))
    return where


def _mark(planted: Path) -> str:
    path = planted.parent / "mark"
    return path.read_text() if path.exists() else ""


def _run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=child_env(**env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_planted_package_is_what_a_plain_python_child_imports(planted: Path) -> None:
    # the hazard itself: without the safe path the planted package wins over PYTHONPATH
    done = _run([sys.executable, "-m", "gpustation", "--version"], planted)
    assert done.returncode == PLANTED_EXIT and "planted gpustation" in _mark(planted)


@pytest.mark.parametrize("safe_flag", [True, False], ids=["-P", "bootstrap"])
def test_both_forms_of_a_safe_child_import_the_real_package(planted: Path, safe_flag: bool) -> None:
    module = _run(python_argv("-m", "gpustation", "--version", safe_flag=safe_flag), planted)
    assert module.returncode == 0 and module.stdout.startswith("gpustation "), module.stderr
    code = "import sys, gpustation; print(gpustation.__file__, sys.argv[1:])"
    done = _run(python_argv("-u", "-c", code, "x", safe_flag=safe_flag), planted)
    assert done.returncode == 0, done.stderr
    assert not done.stdout.startswith(str(planted)) and done.stdout.endswith("['x']\n")
    assert _mark(planted) == ""


def test_the_supervisor_the_fan_controller_and_web_sessions_start_from_a_safe_path(
    planted: Path,
) -> None:
    # The supervisor of a run directory that holds no run says so (exit 2).
    supervisor = _run(supervisor_argv(planted.parent / "no-run"), planted)
    assert supervisor.returncode == 2 and "no readable run.json" in supervisor.stderr
    # The fan controller left behind by a dashboard, asked for its usage.
    fan = _run([*fan_controller_argv("quiet", "0"), "--help"], planted)
    assert fan.returncode == 0 and "usage: gpustation fan run" in fan.stdout, fan.stderr
    # A web session's command, as textual-serve runs it (through a shell).
    web = _run(["sh", "-c", dashboard_command(["--help"], read_only=True)], planted)
    assert web.returncode == 0 and "usage: gpustation" in web.stdout, web.stderr
    assert _mark(planted) == ""


def test_the_launch_forms_parser_reader_reads_the_real_runner(
    planted: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpustation.runs.launch.runner_args import read_parser

    monkeypatch.chdir(planted)
    options = read_parser("gpustation.runners.healthcheck")
    assert "matmul_size" in [o.dest for o in options]
    assert _mark(planted) == ""


def test_the_node_agent_starts_from_a_safe_path_on_any_python(planted: Path) -> None:
    # No spec on its input: the real agent says so (exit 2), whichever Python runs it.
    done = _run(["sh", "-c", agent_command(shlex.quote(sys.executable))], planted)
    assert done.returncode == 2 and "gpustation node" in done.stderr, done.stderr
    assert _mark(planted) == ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_torchrun_on_a_node_and_its_workers_import_the_real_packages(planted: Path) -> None:
    preset = RunPreset(name="h", runner="healthcheck", args={"help": True})
    args = node_argv(preset, 1, 1, f"127.0.0.1:{_free_port()}", "safe-path", is_host=True)
    env = node_env(preset, "safe-path", None)
    assert env[SAFE_PATH_ENV] == "1"
    done = _run(torchrun_argv(args), planted, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "usage: python -m gpustation.runners.healthcheck" in done.stdout + done.stderr
    assert _mark(planted) == ""


def test_a_users_script_keeps_its_own_directory_on_its_path(tmp_path: Path) -> None:
    runner = build_env(RunPreset(name="r", runner="healthcheck"), [], "id", tmp_path, False)
    command = build_env(RunPreset(name="c", command=["python", "t.py"]), [], "id", tmp_path, False)
    assert runner[SAFE_PATH_ENV] == "1" and SAFE_PATH_ENV not in command


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["python", "torchrun"])
def test_a_runs_runner_started_in_a_planted_directory_is_gpustations(
    planted: Path, gpustation_dirs: dict[str, Path], launcher: str
) -> None:
    presets = gpustation_dirs["config"] / "presets" / "runs"
    presets.mkdir(parents=True)
    (presets / "usage.toml").write_text(
        f'runner = "healthcheck"\nlauncher = "{launcher}"\n[args]\nhelp = true\n'
    )
    # started as the `gpustation` script is: its own directory, not this one, on its path
    done = _run(
        [sys.executable, "-P", "-m", "gpustation", "run", "usage", "--simulate", "1"], planted
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (gpustation_dirs["data"] / "runs").iterdir()
    log = wait_until(lambda: (run_dir / "output.log").read_text(), what="the run's log")
    assert "usage: python -m gpustation.runners.healthcheck" in str(log)
    assert _mark(planted) == ""


@pytest.mark.slow
def test_the_children_runners_start_themselves_import_the_real_runner(
    planted: Path, tmp_path: Path
) -> None:
    from gpustation.runners import contention, fsdp
    from gpustation.runners.lib import fsdp_search

    role = contention._child_argv(contention.build_parser().parse_args([]), "train")
    trial = fsdp_search.trial_argv(fsdp.build_parser().parse_args([]), 2, 64, False, str(tmp_path))
    for argv, runner in ((role, "contention"), (trial, "fsdp")):
        done = _run([*argv, "--help"], planted)
        assert done.returncode == 0, done.stderr
        assert f"usage: python -m gpustation.runners.{runner}" in done.stdout
    assert _mark(planted) == ""
