"""Host strings, the ssh command line, and config.toml's [fleet] table."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpustation import cli
from gpustation.errors import EXIT_UNREACHABLE, EXIT_USAGE, UsageError
from gpustation.fleet.fleet import Fleet, load_fleet_config
from gpustation.fleet.ssh import parse_host, ssh_argv

INJECTED = [
    "-oProxyCommand=touch /tmp/x",
    "-oProxyCommand=sh",
    "a b",
    "a;b",
    "$(x)",
    "`id`",
    "box|nc",
    "box&",
    "a\nb",
    "host:0",
    "host:99999",
    "user@",
    "@host",
    "::1",
    "",
]


@pytest.mark.parametrize(
    ("text", "user", "host", "port"),
    [
        ("box2", None, "box2", None),
        ("alice@box1", "alice", "box1", None),
        ("gpu-node.lab.example:2222", None, "gpu-node.lab.example", 2222),
        ("bob_x@10.0.0.7:22", "bob_x", "10.0.0.7", 22),
        ("[::1]:2200", None, "::1", 2200),
        ("root@[fe80::1%eth0]", "root", "fe80::1%eth0", None),
    ],
)
def test_valid_hosts_parse(text: str, user: str | None, host: str, port: int | None) -> None:
    spec = parse_host(text)
    assert (spec.user, spec.host, spec.port) == (user, host, port)


@pytest.mark.parametrize("text", INJECTED)
def test_injected_host_strings_are_refused(text: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_host(text)
    assert err.value.exit_code == EXIT_USAGE


def test_ssh_argv_ends_options_before_the_host() -> None:
    argv = ssh_argv("alice@box1:2222", 0.5, command="/opt/venv/bin/gpustation")
    assert argv[0] == "ssh"
    sep = argv.index("--")
    options = argv[:sep]
    for opt in (
        "BatchMode=yes",
        "ConnectTimeout=5",
        "ServerAliveInterval=5",
        "ServerAliveCountMax=2",
    ):
        assert opt in options
    assert options[options.index("-p") + 1] == "2222"
    assert argv[sep + 1 :] == [
        "alice@box1",
        "/opt/venv/bin/gpustation",
        "snapshot",
        "--json",
        "--watch",
        "0.5",
    ]


def test_ssh_argv_takes_config_file_and_remote_command_from_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUSTATION_SSH_CONFIG", "/tmp/cfg")
    monkeypatch.setenv("GPUSTATION_REMOTE_COMMAND", "python3 -m gpustation")
    argv = ssh_argv("box", 2)
    assert argv[1:3] == ["-F", "/tmp/cfg"]
    assert argv[argv.index("--") + 1 :][:2] == ["box", "python3 -m gpustation"]
    assert ssh_argv("box", 2, ssh_config="/other")[1:3] == ["-F", "/other"]


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `ssh` first on PATH that only records that it was started."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "ssh-was-run"
    script = bin_dir / "ssh"
    script.write_text(f'#!/bin/sh\necho "$@" >> {marker}\necho "ssh: refused" >&2\nexit 255\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return marker


@pytest.mark.parametrize("bad", ["-oProxyCommand=touch /tmp/pwned", "a b", "a;b", "$(x)"])
def test_snapshot_refuses_injected_host_and_never_starts_ssh(
    bad: str, fake_ssh: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["snapshot", "--json", "--host", "box1", f"--host={bad}"])
    assert code == EXIT_USAGE
    assert "--host" in capsys.readouterr().err
    assert not fake_ssh.exists()


def test_fake_ssh_is_what_a_valid_host_would_start(fake_ssh: Path) -> None:
    # The counterpart of the test above: the same setup does start ssh for a
    # valid host, so "never started" there means something.
    assert cli.main(["snapshot", "--json", "--host", "box1"]) == EXIT_UNREACHABLE
    recorded = fake_ssh.read_text()
    assert "-- box1 gpustation snapshot --json --watch" in recorded


def test_fleet_refuses_bad_hosts_before_starting_anything() -> None:
    with pytest.raises(UsageError, match="a;b"):
        Fleet(["box1", "a;b"])


def test_config_fleet_table(gpustation_dirs: dict[str, Path]) -> None:
    (gpustation_dirs["config"] / "config.toml").write_text(
        '[fleet]\nhosts = ["alice@box1", "box2:2222"]\ninterval = 2\n'
        'remote_command = "~/venv/bin/gpustation"\nssh_config = "~/.ssh/lab"\n'
    )
    config = load_fleet_config()
    assert config.hosts == ["alice@box1", "box2:2222"]
    assert config.interval == 2.0
    assert config.remote_command == "~/venv/bin/gpustation"
    assert config.ssh_config == str(Path("~/.ssh/lab").expanduser())


def test_config_problems_are_reported_together(gpustation_dirs: dict[str, Path]) -> None:
    (gpustation_dirs["config"] / "config.toml").write_text(
        '[fleet]\nhosts = ["ok", "-oProxyCommand=x"]\ninterval = "fast"\ncolour = 1\n'
    )
    with pytest.raises(UsageError) as err:
        load_fleet_config()
    message = str(err.value)
    assert "starts with '-'" in message
    assert "interval must be a number" in message
    assert "unknown key(s): colour" in message


def test_missing_config_means_no_hosts() -> None:
    assert load_fleet_config().hosts == []


def test_fleet_option_adds_configured_hosts(
    gpustation_dirs: dict[str, Path], fake_ssh: Path
) -> None:
    (gpustation_dirs["config"] / "config.toml").write_text('[fleet]\nhosts = ["box7", "box8"]\n')
    parser = cli.build_parser(only="snapshot")
    args = parser.parse_args(["snapshot", "--host", "box1", "--fleet"])
    assert args.host == ["box1", "box7", "box8"]
    args = parser.parse_args(["--fleet"])
    assert args.host == ["box7", "box8"]


def test_fleet_option_without_hosts_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.build_parser(only="snapshot").parse_args(["snapshot", "--fleet"])
    assert exc.value.code == EXIT_USAGE
    assert "no hosts listed" in capsys.readouterr().err
