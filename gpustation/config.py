"""``config.toml`` in the config directory: read once, one table per concern.

Each consumer (``[fleet]``, ``[keys]``, ``[notify]``, ``[energy]``,
``[alerts]``) asks for its own table with :func:`section` and validates its
keys itself; a missing file is an empty config. A file that is not TOML, not
a regular file or not readable is a :class:`~gpustation.errors.UsageError`
naming the file, so every command reports it the same way (exit 2).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from gpustation import paths
from gpustation.errors import UsageError
from gpustation.files import read_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def config_path() -> Path:
    return paths.config_dir() / "config.toml"


def read_config(path: Path | None = None) -> dict[str, Any]:
    """The whole file as a dict; ``{}`` when there is none."""
    path = path or config_path()
    if not path.exists() and not path.is_symlink():
        return {}
    text = read_text(path, "the config file")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"{path}: not valid TOML ({err})") from None


def section(name: str, path: Path | None = None) -> dict[str, Any]:
    """Table ``[name]``; ``{}`` when absent, UsageError when it is not a table."""
    path = path or config_path()
    table = read_config(path).get(name, {})
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [{name}] must be a table")
    return table
