"""Run presets: TOML files that say what to run, how, and on which GPUs.

Presets are read from the package (``gpustation/presets/runs/*.toml``) and then
from the user's config dir (``<config dir>/presets/runs/*.toml``); a user preset
with the same name replaces the shipped one. Keys::

    name = "resnet50-bf16"          # defaults to the file name
    title = "ResNet-50, bf16"
    description = "..."
    runner = "resnet"               # a module under gpustation.runners ...
    command = ["python", "x.py"]    # ... or any argv list instead (no shell)
    launcher = "python"             # python | torchrun | accelerate
    nproc_per_node = 2              # torchrun / accelerate processes per node
    nnodes = 1                      # multi-node settings, passed through:
    node_rank = 0                   #   node_rank, rdzv_backend, rdzv_endpoint,
    rdzv_endpoint = "host:29400"    #   rdzv_id, master_addr, master_port
    gpus = 2                        # a count (first N) or a list: [0, 2]
    tags = ["vision", "bench"]

    [args]                          # passed as --key value (underscores -> dashes)
    batch_size = 256
    compile = true                  # true -> --compile, false -> --no-compile

    [env]
    NCCL_DEBUG = "WARN"

A bad file never stops the others from loading: :func:`load_presets` returns
the good presets and a list of :class:`PresetProblem` naming file, line or key
and what was expected.
"""

from __future__ import annotations

import difflib
import importlib
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpustation import paths
from gpustation.errors import UsageError
from gpustation.files import NotRegularFile, read_text, say_skipped
from gpustation.runs.argvalue import RUNNER_PACKAGE, ArgValue, parse_bool
from gpustation.runs.launch.runner_args import RunnerArgsError, parse_text, runner_args
from gpustation.textsafe import safe_doc

if TYPE_CHECKING:
    from gpustation.runs.launch.runner_args import RunnerArg

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

LAUNCHERS = ("python", "torchrun", "accelerate")


@dataclass
class RunPreset:
    """One run preset, validated. ``source`` is the file it came from."""

    name: str
    title: str = ""
    description: str = ""
    runner: str | None = None
    command: list[str] | None = None
    launcher: str = "python"
    nproc_per_node: int | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    gpus: int | list[int] | None = None
    tags: list[str] = field(default_factory=list)
    args: dict[str, ArgValue] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    source: str = ""
    #: "package" or "user"
    origin: str = "package"

    def __post_init__(self) -> None:
        # A preset's words are shown in every view, so they are cleaned as it is
        # made (from a file, run.json or a command line); what it runs is kept
        # exactly as written (rule 8).
        self.name = safe_doc(self.name)
        self.title = safe_doc(self.title)
        self.description = safe_doc(self.description)
        self.tags = safe_doc(self.tags)

    @property
    def display_title(self) -> str:
        return self.title or self.name

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what ``presets show --json`` and ``run.json`` hold)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunPreset:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class PresetProblem:
    """Why one preset file (or one key in it) could not be used."""

    path: str
    message: str
    line: int | None = None
    key: str | None = None

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        key = f" [{self.key}]" if self.key else ""
        return f"{where}:{key} {self.message}"


# key -> (accepted python types, description of what is expected)
_SCALAR_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "name": ((str,), "a string"),
    "title": ((str,), "a string"),
    "description": ((str,), "a string"),
    "runner": ((str,), 'a module name under gpustation.runners, e.g. "resnet"'),
    "launcher": ((str,), "one of " + ", ".join(LAUNCHERS)),
    "nproc_per_node": ((int,), "a whole number of processes (1 or more)"),
    "nnodes": ((int,), "a whole number of nodes (1 or more)"),
    "node_rank": ((int,), "a whole number (0 or more)"),
    "rdzv_backend": ((str,), 'a string, e.g. "c10d"'),
    "rdzv_endpoint": ((str,), "a string host:port"),
    "rdzv_id": ((str, int), "a string"),
    "master_addr": ((str,), "a host name or address"),
    "master_port": ((int,), "a port number"),
}
_OTHER_KEYS = ("command", "gpus", "tags", "args", "env")
ALL_KEYS = tuple(_SCALAR_KEYS) + _OTHER_KEYS


def preset_dirs() -> list[tuple[str, Path]]:
    """Where presets are read from, in order; later ones win on a name clash."""
    return [
        ("package", paths.package_dir() / "presets" / "runs"),
        ("user", paths.user_run_presets_dir()),
    ]


def _key_line(text: str, key: str, table: str | None = None) -> int | None:
    """The line a key is written on (best effort; tomllib gives no positions)."""
    current: str | None = None
    pattern = re.compile(r"^\s*(\"?)" + re.escape(key) + r"\1\s*=")
    for number, line in enumerate(text.splitlines(), start=1):
        header = re.match(r"^\s*\[\s*([^\]]+?)\s*\]", line)
        if header:
            current = header.group(1)
            continue
        if current == table and pattern.match(line):
            return number
    return None


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _check_type(value: Any, types: tuple[type, ...]) -> bool:
    # bool is an int subclass; a preset saying `nnodes = true` is a mistake.
    if _is_bool(value) and bool not in types:
        return False
    return isinstance(value, types)


def _runners_package() -> Any:
    # Imported by name: gpustation.runners' own __init__ imports nothing heavy
    # (it lists runner modules on disk), while its runner modules import torch,
    # which the UI (a user of this module) must never do.
    return importlib.import_module(RUNNER_PACKAGE)


def runner_problem(runner: str) -> str | None:
    """Why ``runner`` names no runner module (None when it does), without importing it.

    A runner is one of ``gpustation.runners.runner_names()``: a module of the
    package that is not one of its libraries (``common``, ``data`` ...).
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", runner):
        return f"{runner!r} is not a module name"
    package = _runners_package()
    names = package.runner_names()
    if runner in names:
        return None
    listed = ", ".join(names)
    top = runner.split(".")[0]
    if top == "lib":
        return (
            f"gpustation.runners.{runner} is a library the runners share, not a runner "
            f"(runners: {listed})"
        )
    return (
        f"no runner module gpustation.runners.{runner} "
        f"(expected a file gpustation/runners/{runner}.py; runners: {listed})"
    )


def runner_exists(runner: str) -> bool:
    """Whether ``runner`` is one of the runners (``gpustation.runners.runner_names()``)."""
    return runner_problem(runner) is None


def parse_preset(
    data: dict[str, Any], path: Path, text: str = "", origin: str = "package"
) -> tuple[RunPreset | None, list[PresetProblem]]:
    """Validate one decoded TOML document; every problem in it is reported."""
    problems: list[PresetProblem] = []
    where = str(path)

    def problem(message: str, key: str, table: str | None = None) -> None:
        problems.append(
            PresetProblem(where, message, line=_key_line(text, key.split(".")[-1], table), key=key)
        )

    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in _SCALAR_KEYS:
            types, expected = _SCALAR_KEYS[key]
            if not _check_type(value, types):
                problem(f"expected {expected}, got {value!r}", key)
                continue
            values[key] = str(value) if key == "rdzv_id" else value
        elif key == "command":
            if (
                not isinstance(value, list)
                or not value
                or not all(isinstance(v, str) and v for v in value)
            ):
                problem(
                    f"expected a non-empty list of strings (an argv list; no shell), got {value!r}",
                    key,
                )
                continue
            values[key] = list(value)
        elif key == "gpus":
            if _check_type(value, (int,)) and value >= 0:
                values[key] = value
            elif isinstance(value, list) and all(_check_type(v, (int,)) and v >= 0 for v in value):
                values[key] = list(value)
            else:
                problem(f"expected a GPU count or a list of GPU indices, got {value!r}", key)
        elif key == "tags":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                problem(f"expected a list of strings, got {value!r}", key)
                continue
            values[key] = list(value)
        elif key == "args":
            if not isinstance(value, dict):
                problem("expected a table [args] of option = value", key)
                continue
            args: dict[str, ArgValue] = {}
            for name, arg in value.items():
                ok = _check_type(arg, (str, int, float, bool)) or (
                    isinstance(arg, list)
                    and all(_check_type(v, (str, int, float, bool)) for v in arg)
                )
                if not ok:
                    problem(
                        f"expected a string, number, true/false or a list of those, got {arg!r}",
                        f"args.{name}",
                        table="args",
                    )
                    continue
                if any(
                    isinstance(v, float) and not math.isfinite(v)
                    for v in (arg if isinstance(arg, list) else [arg])
                ):
                    # TOML has nan and inf; JSON (run.json, every --json output) has not.
                    problem(f"expected a finite number, got {arg!r}", f"args.{name}", table="args")
                    continue
                args[name] = arg
            values[key] = args
        elif key == "env":
            if not isinstance(value, dict):
                problem('expected a table [env] of NAME = "value"', key)
                continue
            env: dict[str, str] = {}
            for name, var in value.items():
                if not isinstance(var, str):
                    problem(
                        f'expected a string (quote numbers: "{var}"), got {var!r}',
                        f"env.{name}",
                        table="env",
                    )
                    continue
                env[name] = var
            values[key] = env
        else:
            close = difflib.get_close_matches(key, ALL_KEYS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problem(f"unknown key {key!r} (known keys: {', '.join(ALL_KEYS)}){hint}", key)

    values.setdefault("name", path.stem)
    if "launcher" in values and values["launcher"] not in LAUNCHERS:
        problem(
            f"expected one of {', '.join(LAUNCHERS)}, got {values.pop('launcher')!r}",
            "launcher",
        )
    for key in ("nproc_per_node", "nnodes"):
        if key in values and values[key] < 1:
            problem(f"expected 1 or more, got {values.pop(key)}", key)
    has_runner = "runner" in values or "runner" in data
    has_command = "command" in values or "command" in data
    if has_runner and has_command:
        problem("give either runner or command, not both", "runner")
    elif not has_runner and not has_command:
        problems.append(
            PresetProblem(
                where,
                'missing runner: give runner = "<module under gpustation.runners>" '
                'or command = ["argv", ...]',
                key="runner",
            )
        )
    elif "runner" in values and (why := runner_problem(values["runner"])) is not None:
        problem(why, "runner")
    if problems:
        return None, problems
    return RunPreset(source=where, origin=origin, **values), []


def load_preset_file(
    path: Path, origin: str = "user"
) -> tuple[RunPreset | None, list[PresetProblem]]:
    """Read and validate one preset file."""
    try:
        text = read_text(path, "preset")
    except NotRegularFile as err:
        say_skipped(err)  # also for the commands that list no problems (run, sweep)
        return None, [PresetProblem(str(path), f"skipped: {err.kind}, not a regular file")]
    except UsageError as err:
        return None, [PresetProblem(str(path), str(err))]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        # The message ends with "(at line N, column M)"; keep the line apart.
        message = str(err)
        match = re.search(r"\(at line (\d+), column (\d+)\)", message)
        line = int(match.group(1)) if match else None
        if match is None and "end of document" in message:
            line = max(1, len(text.splitlines()))
        if match:
            message = message[: match.start()].strip() + f" (column {match.group(2)})"
        return None, [PresetProblem(str(path), f"TOML syntax error: {message}", line=line)]
    return parse_preset(data, path, text, origin=origin)


def load_presets(
    dirs: list[tuple[str, Path]] | None = None,
) -> tuple[dict[str, RunPreset], list[PresetProblem]]:
    """Load every preset; the good ones by name, and the problems of the bad ones."""
    presets: dict[str, RunPreset] = {}
    problems: list[PresetProblem] = []
    for origin, directory in dirs if dirs is not None else preset_dirs():
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.toml")):
            preset, found = load_preset_file(path, origin=origin)
            problems.extend(found)
            if preset is not None:
                presets[preset.name] = preset
    return dict(sorted(presets.items())), problems


def find_preset(
    name: str, presets: dict[str, RunPreset], problems: list[PresetProblem] | None = None
) -> RunPreset:
    """The preset called ``name``, or a UsageError: why its file was refused
    (from ``problems``), else the near names."""
    if name in presets:
        return presets[name]
    bad = [p for p in problems or () if Path(p.path).stem == name]
    if bad:
        raise UsageError(f"preset {name!r} has problems:\n  " + "\n  ".join(str(p) for p in bad))
    near = difflib.get_close_matches(name, list(presets), n=5, cutoff=0.4)
    near += [p for p in presets if name in p and p not in near]
    if near:
        hint = "did you mean: " + ", ".join(near[:5])
    elif presets:
        hint = "presets: " + ", ".join(presets)
    else:
        hint = "no presets found; see `gpustation presets list`"
    raise UsageError(f"no run preset named {name!r}; {hint}")


def _typed(key: str, text: str, default: ArgValue) -> ArgValue:
    expected: str
    if isinstance(default, bool):
        value = parse_bool(text)
        if value is not None:
            return value
        expected = "true or false"
    elif isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            expected = "a whole number"
    elif isinstance(default, float):
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if math.isfinite(number):
            return number
        expected = "a finite number"
    elif isinstance(default, list):
        items = [p.strip() for p in text.split(",") if p.strip()]
        if not default:
            return list(items)
        return [_typed(key, item, default[0]) for item in items]  # type: ignore[misc]
    else:
        return text
    raise UsageError(
        f"expected {expected} (the preset's default is {default!r})",
        field="set",
        subject=f"{key}={text}",
    )


def _runner_option(runner: str | None, dest: str) -> RunnerArg | None:
    """The runner's own option ``dest``, or None when it has none
    or its parser cannot be read; the parser is read once, only for a key the
    preset does not set."""
    if runner is None:
        return None
    try:
        options = runner_args(runner)
    except RunnerArgsError:
        return None
    return next((o for o in options if o.dest == dest), None)


def _typed_by_runner(raw_key: str, text: str, option: RunnerArg) -> ArgValue:
    try:
        return parse_text(option.kind, text, option.choices)
    except ValueError as err:
        raise UsageError(
            f"{err} (the runner's {option.flag})", field="set", subject=f"{raw_key}={text}"
        ) from None


def parse_sets(items: Sequence[str]) -> dict[str, str]:
    """``--set key=value`` items as ``{key: text}`` (a later one wins), read once."""
    out: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise UsageError(
                "expected key=value, e.g. --set batch_size=64", field="set", subject=repr(item)
            )
        raw_key, text = item.split("=", 1)
        raw_key = raw_key.strip()
        if not raw_key:
            raise UsageError("the key is empty", field="set", subject=repr(item))
        out[raw_key] = text
    return out


def apply_values(
    preset: RunPreset, values: Mapping[str, ArgValue]
) -> tuple[RunPreset, dict[str, ArgValue], list[str]]:
    """Set ``values`` in a preset's ``[args]``: the one place values meet a preset.

    A text (what ``--set`` gives) is typed by the preset's own default (int,
    float, bool, list or string), or for a key the preset does not set by the
    runner's own parser; a key neither has is passed as a string (``true`` and
    the like as a switch), with a warning. A value already typed (the launch
    form's, read by the runner's parser) is taken as it is. Returns the new
    preset, the values as set and the warnings.
    """
    args = dict(preset.args)
    parsed: dict[str, ArgValue] = {}
    warnings: list[str] = []
    by_norm = {k.replace("-", "_"): k for k in args}
    for raw_key, given in values.items():
        key = by_norm.get(raw_key.replace("-", "_"))
        value: ArgValue
        if not isinstance(given, str):
            value = given
            key = key or raw_key.replace("-", "_")
        elif key is not None:
            value = _typed(raw_key, given, args[key])
        else:
            key = raw_key.replace("-", "_")
            value, warning = _typed_outside_the_preset(preset, raw_key, given)
            if warning:
                warnings.append(warning)
        args[key] = value
        parsed[key] = value
    return replace(preset, args=args), parsed, warnings


def _typed_outside_the_preset(
    preset: RunPreset, raw_key: str, text: str
) -> tuple[ArgValue, str | None]:
    """A value for a key the preset does not set, and the warning it needs (if any)."""
    if preset.runner is not None and (
        "--" + raw_key.replace("_", "-") in _runners_package().SHARED_OPTIONS
    ):
        return text, None  # every runner takes the shared options (--device, --seed ...)
    key = raw_key.replace("-", "_")
    option = _runner_option(preset.runner, key)
    if option is not None:
        return _typed_by_runner(raw_key, text, option), None
    near = difflib.get_close_matches(key, list(preset.args), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    value: ArgValue = text
    word = text.strip().lower()
    if word in ("true", "false", "yes", "no", "on", "off"):
        # a switch: --flag or --no-flag, as for the preset's own booleans
        value = word in ("true", "yes", "on")
    return value, (
        f"--set {raw_key}: preset {preset.name!r} has no argument {raw_key!r}{hint}; "
        f"passing it as {'a switch' if isinstance(value, bool) else 'a string'}"
    )


def apply_overrides(
    preset: RunPreset, overrides: Sequence[str]
) -> tuple[RunPreset, dict[str, ArgValue], list[str]]:
    """Apply ``--set key=value`` items to a preset's ``[args]`` (see :func:`apply_values`)."""
    return apply_values(preset, parse_sets(overrides))


def command_preset(command: list[str], name: str | None, env: list[str]) -> RunPreset:
    """A preset for any command: its argv as given (no shell), its environment.

    ``gpustation run -- COMMAND`` and the runs screen's command form build their
    run from this; the messages use the command line's words (``--name``, ``--env``).
    """
    if not command or not command[0]:
        raise UsageError("give the command to run after --, e.g. -- python train.py")
    variables: dict[str, str] = {}
    for item in env:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UsageError(f"--env {item!r}: expected KEY=VALUE with a variable name as KEY")
        variables[key] = value
    label = name or Path(command[0]).name
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", label):
        raise UsageError(f"--name {label!r}: letters, digits, '.', '_' and '-', at most 64")
    return RunPreset(
        name=label,
        title=" ".join(command),
        command=list(command),
        env=variables,
        tags=["command"],
        origin="command",
    )
