"""Writing a user run preset: ``<config dir>/presets/runs/NAME.toml``.

What the launch form's "save as preset" writes: the preset it started from
with the form's arguments and GPUs. The file is the format
:mod:`gpustation.runs.presets` reads (and is read back through it before it
counts as saved), written atomically so the preset list never sees half of it.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from gpustation import paths
from gpustation.errors import UsageError
from gpustation.runs.argvalue import ArgValue
from gpustation.runs.presets import RunPreset, load_preset_file

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
#: preset keys written, in this order, when set
_KEYS = (
    "title",
    "description",
    "runner",
    "command",
    "launcher",
    "nproc_per_node",
    "nnodes",
    "node_rank",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "master_addr",
    "master_port",
    "gpus",
    "tags",
)


def check_name(name: str) -> str:
    """``name`` if it can name a preset file, else a UsageError saying what can."""
    name = name.strip()
    if not _NAME.fullmatch(name):
        raise UsageError(
            f"{name!r} cannot name a preset: use letters, digits, '-', '_' and '.' "
            "(starting with a letter or digit, at most 64)"
        )
    return name


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UsageError(f"{value!r} cannot be written to a preset")
        return repr(value)
    if isinstance(value, str):
        # A JSON string is a TOML basic string (the same escapes).
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise UsageError(f"{value!r} cannot be written to a preset")


def preset_toml(preset: RunPreset, args: dict[str, ArgValue], gpus: list[int] | None) -> str:
    """The TOML text of ``preset`` with ``args`` as its [args] and ``gpus`` as its GPUs."""
    lines = []
    for key in _KEYS:
        value = gpus if key == "gpus" and gpus is not None else getattr(preset, key)
        if value is None or value == "" or value == []:
            continue
        if key == "launcher" and value == "python":
            continue
        lines.append(f"{key} = {_value(value)}")
    if args:
        lines += ["", "[args]"]
        lines += [f"{_key(k)} = {_value(v)}" for k, v in args.items()]
    if preset.env:
        lines += ["", "[env]"]
        lines += [f"{_key(k)} = {_value(v)}" for k, v in preset.env.items()]
    return "\n".join(lines) + "\n"


def write_user_preset(
    name: str,
    preset: RunPreset,
    args: dict[str, ArgValue],
    gpus: list[int] | None,
    directory: Path | None = None,
) -> Path:
    """Write the user preset ``name`` (replacing one of that name) and return its path.

    Raises UsageError when the name is unusable or the file would not load back.
    """
    name = check_name(name)
    directory = directory or paths.user_run_presets_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    text = preset_toml(preset, args, gpus)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".toml", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        loaded, problems = load_preset_file(Path(tmp), origin="user")
        if loaded is None:
            raise UsageError("; ".join(str(p.message) for p in problems) or "does not load")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
