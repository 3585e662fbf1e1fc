"""Command-line entry point: parses arguments and dispatches to the layers.

Each subcommand lives in a module that offers ``add_parser(subparsers)`` and
``run(args) -> int``; this file only lists them. Only the module of the
command being run is imported (the others get a placeholder parser), so
``gpustation snapshot`` pays for nothing but its own imports. With no
subcommand the dashboard opens.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpustation import __version__
from gpustation.errors import EXIT_INTERRUPTED, EXIT_USAGE, GpustationError

# subcommand -> module that implements it
COMMANDS: dict[str, str] = {
    "snapshot": "gpustation.telemetry.cmd",
    "power": "gpustation.control.cmd_power",
    "fan": "gpustation.control.cmd_fan",
    "profile": "gpustation.control.cmd_profile",
    "serve": "gpustation.telemetry.serve_cmd",
    "presets": "gpustation.runs.presets_cmd",
    "runs": "gpustation.runs.runs_cmd",
    "run": "gpustation.runs.run_cmd",
}


# Top-level options that take a value (so a value is not mistaken for a command).
_VALUE_OPTIONS = {"--gpus", "--refresh", "--host", "--sim-card", "--ssh-config"}


def _command_in(argv: Sequence[str]) -> str | None:
    previous = ""
    for token in argv:
        if token == "--":
            return None
        if token in COMMANDS and previous not in _VALUE_OPTIONS:
            return token
        previous = token
    return None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"gpustation: error: {message}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or one where only command ``only`` is fully defined."""
    from gpustation.telemetry.backend import add_gpu_options

    parser = _Parser(
        prog="gpustation",
        description="GPU dashboard, hardware control and run launcher. "
        "With no command, opens the dashboard.",
    )
    parser.add_argument("--version", action="version", version=f"gpustation {__version__}")
    add_gpu_options(parser)
    parser.set_defaults(gpus=None, simulate=None, sim_card=None)
    parser.add_argument(
        "--refresh",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="dashboard refresh interval (0.25 to 10, default 1)",
    )
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="[USER@]HOST",
        help="show a fleet of hosts read over ssh (repeatable)",
    )
    from gpustation.telemetry.fleet_cli import add_fleet_options

    add_fleet_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).add_parser(sub)
        else:
            sub.add_parser(name, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_in(argv)
    if command is None and ({"-h", "--help"} & set(argv)):
        parser = build_parser()  # the full help lists every command
    else:
        parser = build_parser(only=command or "")
    args = parser.parse_args(argv)
    try:
        if args.command is None:
            # Imported by name so the headless commands never load textual.
            dashboard = importlib.import_module("gpustation.tui.app")
            return int(dashboard.run_dashboard(args) or 0)
        return int(importlib.import_module(COMMANDS[args.command]).run(args) or 0)
    except GpustationError as err:
        print(f"gpustation: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("gpustation: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `gpustation snapshot --watch 1 | head` ends quietly, like any Unix tool.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
