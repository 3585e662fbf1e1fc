"""Command-line entry point: parses arguments and dispatches to the layers.

Each subcommand lives in a module that offers ``add_parser(subparsers)`` and
``run(args) -> int``; this file only lists them. Only the module of the
command being run is imported (the others get a placeholder parser), so
``gpustation snapshot`` pays for nothing but its own imports. With no
subcommand the dashboard opens.
"""

from __future__ import annotations

import importlib
import os
import sys

from gpustation import __version__
from gpustation.errors import EXIT_INTERRUPTED, EXIT_USAGE, GpustationError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any

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


def _columns() -> int:
    """The terminal's width, as ``shutil.get_terminal_size`` tells it."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


def _parser_class() -> type[argparse.ArgumentParser]:
    import argparse

    class _Formatter(argparse.HelpFormatter):
        # argparse imports shutil (and with it zlib, bz2 and lzma) for the
        # terminal's width whenever a parser with subcommands is built: 2-3 ms
        # of every `gpustation snapshot`. The width is given instead.
        def __init__(self, prog: str, *args: Any, **kwargs: Any) -> None:
            if len(args) < 3 and "width" not in kwargs:
                kwargs["width"] = _columns() - 2
            super().__init__(prog, *args, **kwargs)

    class _Parser(argparse.ArgumentParser):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("formatter_class", _Formatter)
            super().__init__(*args, **kwargs)

        def error(self, message: str) -> None:  # type: ignore[override]
            self.print_usage(sys.stderr)
            self.exit(EXIT_USAGE, f"gpustation: error: {message}\n")

    return _Parser


# With any of these, `gpustation snapshot` does not read this machine's GPUs.
_NOT_LOCAL_GPUS = ("--simulate", "--host", "--fleet", "-h", "--help")


def _local_snapshot(argv: Sequence[str]) -> bool:
    """Whether these arguments are a ``gpustation snapshot`` of this
    machine's GPUs read through the built-in NVML binding."""
    if _command_in(argv) != "snapshot":
        return False
    if any(token.startswith(_NOT_LOCAL_GPUS) for token in argv):
        return False
    binding = os.environ.get("GPUSTATION_NVML", "").strip().lower()
    return not os.environ.get("GPUSTATION_SIMULATE") and binding in ("", "lite")


def _start_nvml_early(argv: Sequence[str]) -> bool:
    """For ``gpustation snapshot`` on this machine's GPUs, start NVML now.

    The driver's start (10-14 ms on an H200 machine) then overlaps the
    imports and the argument parsing that come before the backend opens; see
    :func:`gpustation.telemetry.nvml_lite.start_early`.
    """
    if not _local_snapshot(argv):
        return False
    from gpustation.telemetry import nvml_lite

    nvml_lite.start_early()
    return True


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or one where only command ``only`` is fully defined."""
    from gpustation.telemetry.backend import add_gpu_options

    _Parser = _parser_class()
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
    early = _start_nvml_early(argv)
    try:
        return _main(argv, command)
    finally:
        if early:  # never leave while the driver is starting on that thread
            from gpustation.telemetry import nvml_lite

            nvml_lite.wait_early()


def console() -> None:
    """The ``gpustation`` command: :func:`main`, then the process's exit.

    A ``gpustation snapshot`` of this machine's GPUs leaves through
    ``os._exit`` once its output is flushed. A normal exit would run the NVML
    library's teardown and the interpreter's, about 5 ms of a 60 ms snapshot
    on an H200 machine; the kernel releases the same driver resources when
    the process ends, as it does for a process that is killed. By then the
    backend is closed: no thread is running and the static-value cache is
    written.
    """
    argv = sys.argv[1:]
    rc = main(argv)
    if _local_snapshot(argv):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a reader that went away, as in main()
                pass
        os._exit(rc)
    sys.exit(rc)


def _snapshot_args(argv: Sequence[str]) -> Any:
    """The parsed arguments of the plainest ``gpustation snapshot`` command lines.

    ``snapshot``, with ``--json`` and ``--gpus LIST`` at most once each, is
    what scripts, cron and ssh run most; for those the parser is not built:
    argparse brings re, gettext and locale, 8-15 ms of a 60 ms snapshot on an
    H200 machine, while NVML is starting. The result equals the parser's
    (a test compares them); anything else goes to the parser.
    """
    if not argv or argv[0] != "snapshot":
        return None
    as_json = False
    gpus: str | None = None
    rest = list(argv[1:])
    while rest:
        token = rest.pop(0)
        if token == "--json" and not as_json:
            as_json = True
        elif token.startswith("--gpus=") and gpus is None and len(token) > 7:
            gpus = token[7:]
        elif token == "--gpus" and gpus is None and rest and rest[0][:1] not in ("", "-"):
            gpus = rest.pop(0)
        else:
            return None
    from types import SimpleNamespace

    return SimpleNamespace(
        gpus=gpus,
        simulate=None,
        sim_card=None,
        refresh=1.0,
        host=[],
        command="snapshot",
        json=as_json,
        watch=None,
    )


def _main(argv: list[str], command: str | None) -> int:
    args = _snapshot_args(argv) if command == "snapshot" else None
    if args is None:
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
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
