"""The binding ids of every gpustation screen, for checking a ``[keys]`` table.

The commands that open an app read the keymap (:func:`keymap_from_config`)
and hand it to the app. The screens it names import the keymap reader
(``tui/keys.py``), never this module, so no import leads back to them.
"""

from __future__ import annotations

from gpustation.tui.keys import KeymapConfig, binding_ids, load_keymap

#: the modules whose screens and widgets define gpustation's bindings
BINDING_MODULES = (
    "gpustation.tui.app",
    "gpustation.tui.fleet.screen",
    "gpustation.tui.control.screen",
    "gpustation.tui.runs",
    "gpustation.tui.replay.screen",
)


def known_binding_ids() -> set[str]:
    """Every binding id of gpustation's screens (imports them all)."""
    return binding_ids(BINDING_MODULES)


def keymap_from_config() -> KeymapConfig:
    """``[keys]`` from config.toml, its ids checked against every screen's (imported
    only when the table has entries)."""
    return load_keymap(known_binding_ids)
