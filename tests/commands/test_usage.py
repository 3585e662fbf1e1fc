"""What the command line says about a mistake: the usage of the command it was made in."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpustation.cli import main


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["snapshot", "--bogus"], "usage: gpustation snapshot "),
        (["runs", "list", "--bogus"], "usage: gpustation runs list "),
        (["power", "journal", "--bogus"], "usage: gpustation power journal "),
        (["--bogus"], "usage: gpustation [-h]"),
    ],
)
def test_a_wrong_flag_shows_the_usage_of_its_own_command(
    argv: list[str],
    usage: str,
    capsys: pytest.CaptureFixture[str],
    gpustation_dirs: dict[str, Path],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert "unrecognized arguments: --bogus" in err


@pytest.mark.parametrize("command", ["run", "sweep", "snapshot"])
def test_gpu_options_before_the_command_stand(command: str) -> None:
    from gpustation.cli import build_parser

    args, _ = build_parser(only=command).parse_known_args(
        ["--simulate", "3", "--gpus", "1", command, "x"]
    )
    assert (args.simulate, args.gpus) == (3, "1")
    args, _ = build_parser(only=command).parse_known_args([command, "--simulate", "4", "x"])
    assert args.simulate == 4
