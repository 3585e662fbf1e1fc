"""``config.toml`` in the config directory: read once, one table per concern.

Each consumer (``[fleet]``, ``[keys]``, ``[notify]``, ``[energy]``,
``[alerts]``) asks for its own table with :func:`section` and validates its
keys itself; a missing file is an empty config. A file that is not TOML, not
a regular file or not readable is a :class:`~gpustation.errors.UsageError`
naming the file, so every command reports it the same way (exit 2). A file
holding a secret (a notification URL with a password or token, a password)
that other users can read is said once, with the ``chmod`` that fixes it.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path
from typing import Any

from gpustation import paths
from gpustation.errors import UsageError
from gpustation.files import read_text
from gpustation.redact import has_secret, secret_name

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
        doc: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise UsageError(f"{path}: not valid TOML ({err})") from None
    _warn_if_shared(path, doc)
    return doc


_warned: set[str] = set()


def _warn_if_shared(path: Path, doc: dict[str, Any]) -> None:
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if not mode & (stat.S_IRGRP | stat.S_IROTH) or str(path) in _warned:
        return
    found = secret_settings(doc)
    if found:
        _warned.add(str(path))
        print(
            f"gpustation: warning: {path} holds secrets ({', '.join(found)}) and other users "
            f"can read it; make it private with `chmod 600 {path}`",
            file=sys.stderr,
        )


def secret_settings(doc: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted names of the settings in ``doc`` that hold a secret: a URL with
    a password or token in it, or a value whose name says it is one."""
    found = []
    for key, value in doc.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            found += secret_settings(value, f"{name}.")
            continue
        values = value if isinstance(value, list) else [value]
        for i, table in enumerate(v for v in values if isinstance(v, dict)):  # [[arrays]]
            found += secret_settings(table, f"{name}[{i}].")
        texts = [v for v in values if isinstance(v, str)]
        if (texts and secret_name(str(key))) or any(has_secret(t) for t in texts if "://" in t):
            found.append(name)
    return found


def section(name: str, path: Path | None = None) -> dict[str, Any]:
    """Table ``[name]``; ``{}`` when absent, UsageError when it is not a table."""
    path = path or config_path()
    table = read_config(path).get(name, {})
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [{name}] must be a table")
    return table
