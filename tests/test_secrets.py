"""Secrets never land where others can read them: URLs are redacted wherever they
are logged or shown, a run's variables are kept by name only, run directories
and state files are the user's alone, and a config.toml holding secrets that
others can read is said."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpustation import config
from gpustation.cli import main
from gpustation.redact import REDACTED, redact_text, redact_url
from gpustation.runs import rundir
from tests.conftest import child_env, gpustation_cmd

TIMEOUT = 120.0
PASSWORD = "hunter2-horse-battery"
#: apprise has no use for a mail URL without a host: it is refused, and reported
BAD_URL = f"mailto://alice:{PASSWORD}@"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("mailto://alice:pw@example.com", "mailto://alice:***@example.com"),
        ("ntfy://ntfy.sh/my-gpus", "ntfy://ntfy.sh/my-gpus"),
        ("ntfy://ntfy.sh/t?token=tk_abc&priority=high", "ntfy://ntfy.sh/t?token=***&priority=high"),
        ("json://127.0.0.1:8080/hook", "json://127.0.0.1:8080/hook"),
        ("tgram://123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/42", "tgram://123456789:***/42"),
        ("discord://4174216298/JHMHI8qBe7bk2ZwO5U711o3dV_js", "discord://4174216298/***"),
        ("https://h/x?sig=a1b2#frag", "https://h/x?sig=***#***"),
    ],
)
def test_a_url_keeps_its_shape_and_loses_its_secrets(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_urls_inside_a_message_are_redacted() -> None:
    text = f"ValueError: apprise cannot use the URL {BAD_URL!r}; also foo://bob:h...2@x"
    assert redact_text(text) == (
        "ValueError: apprise cannot use the URL 'mailto://alice:***@'; also foo://bob:***@x"
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _wait_for(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_real_run_keeps_its_env_values_and_the_notify_password_out_of_its_files(
    gpustation_dirs: dict[str, Path],
) -> None:
    cfg = gpustation_dirs["config"] / "config.toml"
    cfg.write_text(f'[notify]\nurls = ["{BAD_URL}"]\nbell = false\n')
    cfg.chmod(0o600)
    secret = "sk-live-0123456789abcdef"
    # the child proves it got the value without the value being on its command line
    code = (
        "import os, sys\n"
        "got = os.environ.get('API_TOKEN', '')[::-1] == sys.argv[1]\n"
        "sys.exit(0 if got and 'GPUSTATION_RUN_PRIVATE_ENV' not in os.environ else 5)\n"
    )
    result = subprocess.run(
        gpustation_cmd(
            "run", "--env", f"API_TOKEN={secret}", "--", sys.executable, "-c", code, secret[::-1]
        ),
        env=child_env(GPUSTATION_SIMULATE="1"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    # the command that will notify says the URL is bad, redacted
    assert "apprise cannot use the URL 'mailto://alice:***@'" in result.stderr
    assert PASSWORD not in result.stderr
    (directory,) = (gpustation_dirs["data"] / "runs").iterdir()
    log = directory / rundir.SUPERVISOR_LOG
    # the supervisor notifies once the end is written: wait for its word on it
    _wait_for(lambda: "not sent" in log.read_text(), "the supervisor to try to notify")
    assert "mailto://alice:***@" in log.read_text()
    run = json.loads((directory / rundir.RUN_JSON).read_text())
    assert run["env"]["API_TOKEN"] == REDACTED and run["preset"]["env"] == {"API_TOKEN": REDACTED}
    for path in directory.rglob("*"):
        data = path.read_bytes()
        assert secret.encode() not in data and PASSWORD.encode() not in data, path
        assert _mode(path) == 0o600, path
    assert _mode(directory) == 0o700
    assert _mode(directory.parent) == 0o700


def test_the_state_files_are_the_users_alone(gpustation_dirs: dict[str, Path]) -> None:
    for kind in ("data", "state"):
        gpustation_dirs[kind].rmdir()  # made by gpustation, as on a first start
    ran = subprocess.run(
        gpustation_cmd("run", "--", sys.executable, "-c", "pass"),
        env=child_env(GPUSTATION_SIMULATE="1"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert ran.returncode == 0, ran.stderr
    changed = subprocess.run(
        gpustation_cmd("--simulate", "1", "power", "set", "300"),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert changed.returncode == 0, changed.stderr
    state, data = gpustation_dirs["state"], gpustation_dirs["data"]
    assert _mode(state) == 0o700 and _mode(data) == 0o700
    files = [p for p in (*state.rglob("*"), *data.glob("runs.db*")) if p.is_file()]
    names = {p.name for p in files}
    assert {"control-journal.jsonl", "control.lock", "runs.db", "runs.db.lock"} <= names
    assert any(n.startswith("sim-") and n.endswith(".json") for n in names)
    assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        (f'[notify]\nurls = ["ntfy://ntfy.sh/a", "{BAD_URL}"]\n', "notify.urls"),
        ('[fleet]\nprometheus = "http://grafana:s3cret@prom:9090"\n', "fleet.prometheus"),
        ('[notify]\nurls = ["ntfy://ntfy.sh/t?token=tk_live_abc123"]\n', "notify.urls"),
    ],
)
def test_a_config_holding_secrets_that_others_can_read_is_said(
    gpustation_dirs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    toml: str,
    named: str,
) -> None:
    monkeypatch.setattr(config, "_warned", set())
    path = gpustation_dirs["config"] / "config.toml"
    path.write_text(toml)
    path.chmod(0o640)
    config.read_config()
    config.read_config()
    err = capsys.readouterr().err
    assert err.count("warning") == 1  # once a process
    assert str(path) in err and f"chmod 600 {path}" in err and named in err
    assert PASSWORD not in err and "s3cret" not in err
    monkeypatch.setattr(config, "_warned", set())
    path.chmod(0o600)
    config.read_config()
    assert capsys.readouterr().err == ""


def test_a_config_without_secrets_is_not_warned_of(
    gpustation_dirs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(config, "_warned", set())
    path = gpustation_dirs["config"] / "config.toml"
    path.write_text(
        '[notify]\nurls = ["ntfy://ntfy.sh/my-gpus"]\n'
        '[fleet]\nprometheus_user = "me"\nprometheus_password_file = "~/.config/pw"\n'
        '[keys]\n"app.quit" = "q"\n'
    )
    path.chmod(0o644)
    config.read_config()
    assert capsys.readouterr().err == ""


def test_record_says_a_bad_notify_url_redacted(
    gpustation_dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = gpustation_dirs["config"] / "config.toml"
    path.write_text(f'[notify]\nurls = ["{BAD_URL}"]\nbell = false\n')
    path.chmod(0o600)
    out = tmp_path / "gpus.jsonl.zst"
    argv = ["record", "--simulate", "1", "--interval", "0.1", "--duration", "0.3", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"{path} [notify]: apprise cannot use the URL 'mailto://alice:***@'" in err
    assert PASSWORD not in err


def test_a_bad_notify_table_is_said_too(
    gpustation_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from gpustation.notify import notify_warnings

    (gpustation_dirs["config"] / "config.toml").write_text('[notify]\nurls = "ntfy://x"\n')
    (warning,) = notify_warnings()
    assert "urls must be a list" in warning and "nothing is notified" in warning


def test_a_resumed_run_takes_the_values_run_json_leaves_out_from_its_preset(
    gpustation_dirs: dict[str, Path],
) -> None:
    from gpustation.runs.launch.resume import _restore_env
    from gpustation.runs.presets import RunPreset

    presets = gpustation_dirs["config"] / "presets" / "runs"
    presets.mkdir(parents=True)
    (presets / "tune.toml").write_text(
        'title = "tune"\nrunner = "lora"\n[env]\nHF_TOKEN = "hf_abc"\n'
    )
    old = RunPreset(name="tune", runner="lora", env={"HF_TOKEN": REDACTED, "GONE": REDACTED})
    preset, warnings = _restore_env(old, "20261201-1")
    assert preset.env == {"HF_TOKEN": "hf_abc"}
    (warning,) = warnings
    assert "GONE" in warning and "HF_TOKEN" not in warning


def test_the_child_never_gets_a_redacted_value() -> None:
    from gpustation.runs.launch.argv import PRIVATE_ENV, child_env

    base = {"PATH": "/bin", PRIVATE_ENV: json.dumps({"A": "real"})}
    env = child_env(base, {"A": REDACTED, "B": REDACTED, "GPUSTATION_RUN_ID": "x"})
    assert env == {"PATH": "/bin", "A": "real", "GPUSTATION_RUN_ID": "x"}


def test_a_runs_directory_an_older_version_left_open_is_made_private(
    gpustation_dirs: dict[str, Path],
) -> None:
    runs = gpustation_dirs["data"] / "runs"
    old = runs / "20250101-000000-old-0000"
    old.mkdir(parents=True)
    runs.chmod(0o755)
    old.chmod(0o755)
    result = subprocess.run(
        gpustation_cmd("run", "--", sys.executable, "-c", "pass"),
        env=child_env(GPUSTATION_SIMULATE="1"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stderr
    assert _mode(runs) == 0o700  # nobody else reaches the old run's files through it
    assert _mode(old) == 0o755  # what is inside is left as it was


def test_words_of_a_command_line_lose_their_secrets() -> None:
    from gpustation.redact import redact_words

    line = (
        "python train.py --api-key sk-live --lr 0.1 HF_TOKEN=hf_x --out /data/run1 "
        "https://user:pw@example.org/x ghp_16charsAndDigits0123"
    )
    assert redact_words(line) == (
        "python train.py --api-key *** --lr 0.1 HF_TOKEN=*** --out /data/run1 "
        "https://user:***@example.org/x ***"
    )
