"""A runner's own arguments, read from its argparse parser in a child process.

The launch form is built from the parser each runner provides
(``build_parser()``, see :mod:`gpustation.runners`): a choice per
``choices``, a switch per boolean flag, a checked number per ``type=int`` or
``float``, the ``help`` as each field's description. The parser lives in the
runner's module, which imports torch, so it is read in a child interpreter
that prints its actions as JSON; the result is kept per runner for the life of
the process. The UI calls :func:`runner_args` from a worker thread, never from
its own.
"""

from __future__ import annotations

import json
import math
import subprocess
import threading
from dataclasses import dataclass
from typing import Any

from gpustation import privs
from gpustation.errors import GpustationError
from gpustation.pyargv import python_argv
from gpustation.runs.argvalue import RUNNER_PACKAGE, ArgValue, parse_bool

#: the child: import the module, call build_parser(), print each option as JSON
_DUMP = r"""
import argparse, importlib, json, sys
parser = importlib.import_module(sys.argv[1]).build_parser()
BOOLS = (argparse.BooleanOptionalAction, argparse._StoreTrueAction, argparse._StoreFalseAction)
out = []
for a in parser._actions:
    if isinstance(a, argparse._HelpAction) or not a.option_strings or a.help == argparse.SUPPRESS:
        continue
    default = a.default
    try:
        json.dumps(default)
    except (TypeError, ValueError):
        default = str(default)
    kind = getattr(a.type, "__name__", None) if a.type is not None else None
    text = a.help or ""
    if "%(" in text:
        text = text % {"default": a.default}
    out.append({
        "dest": a.dest,
        "flags": list(a.option_strings),
        "type": kind,
        "choices": [str(c) for c in a.choices] if a.choices is not None else None,
        "default": default,
        "help": text,
        "nargs": a.nargs if isinstance(a.nargs, (int, str)) else None,
        "boolean": isinstance(a, BOOLS),
        "required": bool(a.required),
    })
json.dump(out, sys.stdout)
"""


class RunnerArgsError(GpustationError):
    """A runner's parser could not be read."""


@dataclass(frozen=True)
class RunnerArg:
    """One option of a runner's parser, as the launch form shows it."""

    dest: str
    flags: tuple[str, ...]
    #: "bool", "choice", "int", "float", "list" or "str"
    kind: str
    choices: tuple[str, ...] | None = None
    default: ArgValue | None = None
    help: str = ""
    required: bool = False

    @property
    def flag(self) -> str:
        """The long option (``--batch-size``), else the first one."""
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunnerArg:
        nargs = data.get("nargs")
        choices = data.get("choices")
        if data.get("boolean"):
            kind = "bool"
        elif nargs in ("+", "*") or (isinstance(nargs, int) and nargs > 1):
            kind = "list"
        elif choices:
            kind = "choice"
        elif data.get("type") in ("int", "float"):
            kind = data["type"]
        else:
            kind = "str"
        default = data.get("default")
        if not isinstance(default, (str, int, float, bool, list)):
            default = None
        return cls(
            dest=data["dest"],
            flags=tuple(data.get("flags") or ()),
            kind=kind,
            choices=tuple(choices) if choices else None,
            default=default,
            help=data.get("help") or "",
            required=bool(data.get("required")),
        )


_CACHE: dict[str, list[RunnerArg]] = {}
_LOCK = threading.Lock()


def read_parser(module: str, python: str | None = None, timeout_s: float = 60.0) -> list[RunnerArg]:
    """Run ``module.build_parser()`` in a child interpreter and return its options."""
    try:
        done = subprocess.run(
            python_argv("-c", _DUMP, module, python=python),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            **privs.child_kwargs(),  # the runner's code is read as the user, never as root
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RunnerArgsError(f"reading the options of {module}: {err}") from err
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise RunnerArgsError(f"reading the options of {module}: {tail}")
    try:
        return [RunnerArg.from_json(item) for item in json.loads(done.stdout)]
    except (ValueError, KeyError, TypeError) as err:
        raise RunnerArgsError(f"reading the options of {module}: {err}") from err


def runner_args(runner: str) -> list[RunnerArg]:
    """The options of runner ``runner``, read once per process (slow the first time)."""
    with _LOCK:
        cached = _CACHE.get(runner)
    if cached is not None:
        return cached
    found = read_parser(f"{RUNNER_PACKAGE}.{runner}")
    with _LOCK:
        _CACHE[runner] = found
    return found


def cached_runner_args(runner: str) -> list[RunnerArg] | None:
    """The options of ``runner`` if they have been read already, else None (never waits)."""
    with _LOCK:
        return _CACHE.get(runner)


def remember(runner: str, args: list[RunnerArg]) -> None:
    """Keep ``args`` as ``runner``'s options (what :func:`runner_args` then returns)."""
    with _LOCK:
        _CACHE[runner] = list(args)


# ---- typing what a field holds ------------------------------------------------------------


def parse_text(kind: str, text: str, choices: tuple[str, ...] | None = None) -> ArgValue:
    """``text`` as a value of ``kind``; ValueError says what was expected."""
    text = text.strip()
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            raise ValueError("expected a whole number") from None
    if kind == "float":
        try:
            value = float(text)
        except ValueError:
            raise ValueError("expected a number") from None
        if not math.isfinite(value):
            raise ValueError("expected a finite number")
        return value
    if kind == "bool":
        flag = parse_bool(text)
        if flag is None:
            raise ValueError("expected true or false")
        return flag
    if kind == "choice" and choices and text not in choices:
        raise ValueError("expected one of " + ", ".join(choices))
    if kind == "list":
        return [p.strip() for p in text.split(",") if p.strip()]
    return text


def kind_of(value: ArgValue | None) -> str:
    """The field kind a preset's own value implies (for commands, which have no parser)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, list):
        return "list"
    return "str"


def value_text(value: ArgValue | None) -> str:
    """A value as a field shows it (lists comma-separated)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(value_text(v) for v in value)
    return str(value)
