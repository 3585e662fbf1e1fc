"""Key bindings from ``config.toml``: the ``[keys]`` table, applied with ``App.set_keymap``.

Every :class:`~textual.binding.Binding` of gpustation's screens carries an id
(``app.quit``, ``dashboard.kill``, ``control.power`` ...). The user's
``config.toml`` in the config directory may map ids to keys::

    [keys]
    "dashboard.kill" = "ctrl+k"          # one key
    "app.quit" = "q,ctrl+q"              # several, comma-separated
    "control.power" = ["w", "p"]         # or a list

A mapped binding answers to the keys given instead of its default ones. A
problem is reported, never fatal: a file that is not TOML or a ``[keys]``
that is not a table leaves every default in place; an entry with an unknown
id or a value that is not a key string is left out (its binding keeps its
default) and named in the report.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from textual.app import App
from textual.binding import Binding
from textual.dom import DOMNode

from gpustation.config import config_path, read_config
from gpustation.errors import UsageError


@dataclass
class KeymapConfig:
    """The keymap to apply and what was wrong with the ``[keys]`` table."""

    keymap: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    path: Path | None = None

    def report(self) -> str:
        """The problems in one message, for a notification."""
        where = f"{self.path}: " if self.path is not None else ""
        return where + "; ".join(self.problems)


def apply_keymap(app: App[Any], config: KeymapConfig) -> None:
    """Apply ``config``'s keymap to ``app`` and report its problems there."""
    if config.keymap:
        app.set_keymap(config.keymap)
    if config.problems:
        app.notify(config.report(), title="Key bindings", severity="error", timeout=20)


def _subclasses(cls: type) -> Iterator[type]:
    sub: type
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def binding_ids(modules: Iterable[str]) -> set[str]:
    """Every binding id of gpustation's Textual classes (imports ``modules`` first)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a screen that is not installed has no keys to map
    ids: set[str] = set()
    for cls in _subclasses(DOMNode):
        if not cls.__module__.startswith("gpustation."):
            continue
        for binding in cls.__dict__.get("BINDINGS", ()):
            if isinstance(binding, Binding) and binding.id:
                ids.add(binding.id)
    return ids


def _keys_value(value: object) -> str | None:
    """A key string from a TOML value (a string or a list of strings), or None."""
    if isinstance(value, str):
        keys = [k.strip() for k in value.split(",")]
    elif isinstance(value, list) and all(isinstance(k, str) for k in value):
        keys = [k.strip() for k in value]
    else:
        return None
    if not keys or not all(keys):
        return None
    return ",".join(keys)


def parse_keys(table: object, known: Callable[[], set[str]] | set[str]) -> KeymapConfig:
    """Check a ``[keys]`` table: the keymap of its good entries and the problems.

    ``known``: the binding ids there are, or what gives them (called only when
    the table has entries: it imports every screen)."""
    config = KeymapConfig()
    if not isinstance(table, dict):
        config.problems.append("[keys] must be a table of binding id = key(s); using the defaults")
        return config
    if not table:
        return config
    ids = known() if callable(known) else known
    for binding_id, value in table.items():
        keys = _keys_value(value)
        if binding_id not in ids:
            config.problems.append(f"unknown binding id {binding_id!r} in [keys]")
        elif keys is None:
            config.problems.append(
                f'[keys] {binding_id!r} must be a key string such as "ctrl+k" '
                f"(or a list of them), not {value!r}"
            )
        else:
            config.keymap[binding_id] = keys
    return config


def load_keymap(known: Callable[[], set[str]] | set[str], path: Path | None = None) -> KeymapConfig:
    """Read ``[keys]`` from config.toml; a missing file or table means the defaults.

    The commands that open an app read it (``tui/keyids.py`` gives ``known``)
    and hand it over: the screens never import the list that names them."""
    path = path or config_path()
    try:
        data = read_config(path)
    except UsageError as err:
        return KeymapConfig(problems=[f"{err}; using the default keys"])
    config = parse_keys(data.get("keys", {}), known)
    config.path = path
    return config
