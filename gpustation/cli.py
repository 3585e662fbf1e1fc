"""Command-line entry point: a table of subcommands and the parser built from it.

Each subcommand is a module of :mod:`gpustation.commands` offering
``add_parser(subparsers)`` and ``run(args) -> int``. Only the module of the
command being run is imported (the others get a placeholder parser), so a
command pays for nothing but its own imports. With no subcommand the
dashboard opens (:mod:`gpustation.commands.dashboard`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, TypeVar, overload

from gpustation import __version__, paths, privs
from gpustation.commands.options import add_fleet_options, add_gpu_options
from gpustation.errors import EXIT_INTERRUPTED, EXIT_USAGE, GpustationError, UsageError

# subcommand -> module that implements it
COMMANDS: dict[str, str] = {
    "snapshot": "gpustation.commands.snapshot",
    "power": "gpustation.commands.power",
    "fan": "gpustation.commands.fan",
    "profile": "gpustation.commands.profile",
    "serve": "gpustation.commands.serve",
    "web": "gpustation.commands.web",
    "presets": "gpustation.commands.presets",
    "runs": "gpustation.commands.runs",
    "run": "gpustation.commands.run",
    "sweep": "gpustation.commands.sweep",
    "sweeps": "gpustation.commands.sweeps",
    "energy": "gpustation.commands.energy",
    "record": "gpustation.commands.record",
    "replay": "gpustation.commands.replay",
    "queue": "gpustation.commands.queue",
    "doctor": "gpustation.commands.doctor",
}
DASHBOARD = "gpustation.commands.dashboard"

# Commands that only read: they start on a read-only data or state directory
# (ProtectHome=read-only, a read-only container) and say what they cannot keep.
_READERS = {"snapshot", "serve", "doctor"}

# Commands that take a command of the user's after `--`.
_TAKES_A_COMMAND = {"run"}

# Top-level options that take a value (so a value is not mistaken for a command).
_VALUE_OPTIONS = {"--gpus", "--refresh", "--host", "--sim-card", "--ssh-config", "--prometheus"}


def _command_in(argv: Sequence[str]) -> str | None:
    previous = ""
    for token in argv:
        if token == "--":
            return None
        if token in COMMANDS and previous not in _VALUE_OPTIONS:
            return token
        previous = token
    return None


_P = TypeVar("_P", bound=argparse.ArgumentParser)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the subcommands' action, kept so the innermost parser can be found
        self.commands: argparse._SubParsersAction[Any] | None = None

    # ArgumentParser's own two forms: the subparsers are of this parser's class, or
    # of the parser_class given
    @overload
    def add_subparsers(
        self: _P,
        *,
        title: str = "subcommands",
        description: str | None = None,
        prog: str | None = None,
        action: str | type[argparse.Action] = ...,
        option_string: str = ...,
        dest: str | None = None,
        required: bool = False,
        help: str | None = None,
        metavar: str | None = None,
    ) -> argparse._SubParsersAction[_P]: ...
    @overload
    def add_subparsers(
        self,
        *,
        title: str = "subcommands",
        description: str | None = None,
        prog: str | None = None,
        parser_class: type[_P],
        action: str | type[argparse.Action] = ...,
        option_string: str = ...,
        dest: str | None = None,
        required: bool = False,
        help: str | None = None,
        metavar: str | None = None,
    ) -> argparse._SubParsersAction[_P]: ...
    def add_subparsers(self, **kwargs: Any) -> argparse._SubParsersAction[Any]:
        self.commands = super().add_subparsers(**kwargs)
        return self.commands

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"gpustation: error: {message}\n")

    def innermost(self, args: argparse.Namespace) -> argparse.ArgumentParser:
        """The (sub)command's own parser for ``args``, so its usage is the one shown."""
        parser: argparse.ArgumentParser = self
        while isinstance(parser, _Parser) and parser.commands is not None:
            name = getattr(args, parser.commands.dest, None)
            chosen = parser.commands.choices.get(name) if isinstance(name, str) else None
            if chosen is None:
                break
            parser = chosen
        return parser


def build_parser(only: str | None = None) -> _Parser:
    """The full parser, or one where only command ``only`` is fully defined."""

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
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="a dashboard that shows everything and changes nothing: no signals to "
        "processes, no power, fan or profile change, no launching or stopping runs",
    )
    add_fleet_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).add_parser(sub)
        else:
            sub.add_parser(name, add_help=False)
    return parser


# "-5W", "-80%": a negative value argparse would take for an unknown option.
_NEGATIVE_VALUE = re.compile(r"-\d[\d.]*\s*[a-zA-Z%]+")

# Options that take a time, where "-3s" is a time before another one.
_TIME_OPTIONS = {"--at", "--start", "--since"}


def _join_time_values(argv: list[str]) -> list[str]:
    """``--at -3s`` as ``--at=-3s``, so argparse reads the value, not an unknown option."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return out + argv[i:]
        if token in _TIME_OPTIONS and i + 1 < len(argv) and argv[i + 1].startswith(("-", "+")):
            out.append(f"{token}={argv[i + 1]}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def _refuse_negative_values(argv: Sequence[str]) -> None:
    for token in argv:
        if token == "--":
            return
        if _NEGATIVE_VALUE.fullmatch(token):
            raise UsageError(
                f"{token!r}: a negative value; limits, speeds and durations are 0 or more "
                "(e.g. 300W, 80%)"
            )


def _restart_queue() -> None:
    """Runs wait in the queue and no scheduler holds it (a reboot, a kill): start one."""
    from gpustation.runs.queue.folder import (
        has_queued,  # start-up time: the queue's modules only where runs wait in it
    )

    if not has_queued():
        return
    from gpustation.runs.queue.scheduler import (
        ensure_running,  # start-up time: the queue's modules only where runs wait in it
    )

    try:
        ensure_running()
    except OSError as err:
        print(f"gpustation: warning: cannot start the queue's scheduler: {err}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    argv = _join_time_values(list(sys.argv[1:] if argv is None else argv))
    command = _command_in(argv)
    try:
        # Under sudo: the invoking user's from here on, root only for driver calls.
        privs.drop()
        _refuse_negative_values(argv)
        if not ({"-h", "--help", "--version"} & set(argv)):
            paths.check_writable_dirs(only_read=command in _READERS)
            if command not in _READERS:
                _restart_queue()
    except GpustationError as err:
        print(f"gpustation: error: {err}", file=sys.stderr)
        return err.exit_code
    # Everything after a bare `--` is the caller's, untouched by the parser
    # (`gpustation run -- python train.py --lr 3e-4`).
    after: list[str] = []
    if "--" in argv and command in _TAKES_A_COMMAND:
        cut = argv.index("--")
        argv, after = argv[:cut], argv[cut + 1 :]
    if command is None and ({"-h", "--help"} & set(argv)):
        parser = build_parser()  # the full help lists every command
    else:
        parser = build_parser(only=command or "")
    # Elsewhere a `--` ends the options as usual (`power set -- -5W` is a value).
    args, extra = parser.parse_known_args(argv)
    if extra:
        if "--" not in argv:
            parser.innermost(args).error(f"unrecognized arguments: {' '.join(extra)}")
        extra = [a for a in extra if a != "--"]
        parser.error(f"arguments after -- are only for `gpustation run`: {' '.join(extra)}")
    args.after_dashes = after
    module = DASHBOARD if args.command is None else COMMANDS[args.command]
    try:
        return int(importlib.import_module(module).run(args) or 0)
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


def console() -> None:
    """The ``gpustation`` command."""
    sys.exit(main())
