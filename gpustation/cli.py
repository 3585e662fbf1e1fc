"""Command-line entry point: parses arguments and dispatches to the layers.

Each subcommand lives in a module that offers ``add_parser(subparsers)`` and
``run(args) -> int``; this file only lists them, so ``gpustation snapshot``
pays for nothing but its own imports. With no subcommand the dashboard opens.
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
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"gpustation: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
