"""Every input either works or is refused with exit 2 and its name: no
traceback, no hang, no silent empty selection. Ctrl-C is exit 130."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from gpustation.fleet.ssh import _parse_line
from tests.conftest import child_env, gpustation_cmd
from tests.control.conftest import RecordingSim, cli
from tests.fleet.sshd import free_port

BAD = [
    (("snapshot", "--simulate", "--gpus", "3-1"), "--gpus"),
    (("snapshot", "--simulate", "--gpus", "0-999999999"), "--gpus"),
    (("snapshot", "--simulate", "--gpus", "1,,2"), "--gpus"),
    (("power", "set", "300", "--simulate", "--gpus", "3-1"), "--gpus"),
    (("power", "set", "-5W", "--simulate"), "-5W"),
    (("power", "set", "-80%", "--simulate"), "-80%"),
    (("fan", "run", "balanced", "--simulate", "--duration", "nan"), "--duration"),
    (("fan", "run", "balanced", "--simulate", "--duration", "inf"), "--duration"),
    (("fan", "run", "/dev/zero", "--simulate"), "/dev/zero"),
    (("snapshot", "--simulate", "--watch", "nan"), "--watch"),
    (("--refresh", "nan", "--simulate"), "--refresh"),
    (("serve", "--simulate", "--listen", "no..such..host:9400"), "--listen"),
    (("serve", "--simulate", "--listen", "127.0.0.1:99999"), "--listen"),
]


@pytest.mark.parametrize(
    ("argv", "named"), BAD, ids=lambda v: " ".join(v) if isinstance(v, tuple) else ""
)
def test_a_bad_input_exits_2_and_names_itself(
    argv: tuple[str, ...], named: str, sim: RecordingSim, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, *argv)
    assert code == 2, (out, err)
    assert named in err
    assert "Traceback" not in err
    assert sim.set_calls == []  # nothing was changed on the way


def _wait_for_line(stream: object, what: str) -> str:
    for line in stream:  # type: ignore[attr-defined]
        if what in line:
            return str(line)
    raise AssertionError(f"the process ended before printing {what!r}")


@pytest.mark.parametrize(
    ("argv", "ready", "on"),
    [
        (("snapshot", "--simulate", "1", "--json", "--watch", "0.2"), '"schema"', "stdout"),
        (("serve", "--simulate", "1", "--listen", "127.0.0.1:{port}"), "serving", "stderr"),
    ],
)
def test_ctrl_c_is_exit_130(argv: tuple[str, ...], ready: str, on: str) -> None:
    argv = tuple(a.format(port=free_port()) for a in argv)
    proc = subprocess.Popen(
        gpustation_cmd(*argv),
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for_line(proc.stdout if on == "stdout" else proc.stderr, ready)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()
        proc.communicate()


def test_one_absurd_line_from_a_host_is_garbage_not_the_end_of_its_stream() -> None:
    for line in (b"[" * 5000, b"{" * 5000, b'{"schema": 1e999999}', b"\xff\xfe"):
        snapshot, message = _parse_line(line)
        assert snapshot is None and message.startswith("garbage")


def test_a_remote_host_cannot_write_to_the_terminal() -> None:
    doc = {
        "schema": "gpustation.snapshot/1",
        "hostname": "box\x1b]0;owned\x07",
        "time": 1.0,
        "gpus": [
            {
                "index": 0,
                "name": "\x1b]52;c;aGk=\x07H200",
                "processes": [{"pid": 1, "command": "python \x1b[2J\x9b31mtrain.py", "user": "u"}],
            }
        ],
    }
    snapshot, message = _parse_line(json.dumps(doc).encode())
    assert snapshot is not None, message
    text = json.dumps(snapshot.to_dict(), ensure_ascii=False)
    assert "\x1b" not in text and "\x9b" not in text and "\x07" not in text
    assert snapshot.hostname == "box" and snapshot.gpus[0].name == "H200"
    assert snapshot.gpus[0].processes[0].command == "python train.py"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"GPUSTATION_SIMULATE": "abc"}, "GPUSTATION_SIMULATE"),
        ({"GPUSTATION_SIMULATE": "-3"}, "GPUSTATION_SIMULATE"),
        ({"GPUSTATION_SIM_SEED": "abc"}, "GPUSTATION_SIM_SEED"),
    ],
)
def test_a_bad_environment_variable_exits_2_and_names_itself(
    env: dict[str, str], named: str
) -> None:
    result = subprocess.run(
        gpustation_cmd("snapshot", *(() if "GPUSTATION_SIMULATE" in env else ("--simulate",))),
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert named in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("which", ["GPUSTATION_STATE_DIR", "GPUSTATION_DATA_DIR"])
def test_a_directory_that_is_a_file_exits_2_and_names_its_variable(
    which: str, tmp_path: Path
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    for argv in (("snapshot", "--simulate"), ("runs", "list"), ("power", "show", "--simulate")):
        result = subprocess.run(
            gpustation_cmd(*argv),
            env=child_env(**{which: str(afile)}),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, (argv, result.stderr)
        assert f"{which}={afile}: not a directory" in result.stderr
