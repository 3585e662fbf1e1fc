"""The dashboard's screens as Textual modes: one :class:`ScreenEntry` per screen
(its mode name, key, footer label and help line), the key that shows it, and
the screen built when its mode is first shown.

``factory`` is a class or a ``"module:Class"`` string imported when the screen
is first shown; a missing module leaves the entry out without importing
anything at start-up.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual.binding import Binding
from textual.screen import Screen

from gpustation.errors import GpustationError
from gpustation.tui.screens import AlertLogScreen, DashboardScreen, HelpScreen, TopologyScreen


@dataclass(frozen=True)
class ScreenEntry:
    """A screen of the dashboard: its mode name, key and how to build it."""

    mode: str
    key: str
    title: str
    help: str
    factory: type[Screen[Any]] | str


SCREENS_BY_MODE: list[ScreenEntry] = [
    ScreenEntry(
        "dashboard", "d", "Dashboard", "GPU cards, history, host, processes", DashboardScreen
    ),
    ScreenEntry("topology", "t", "Topology", "GPU matrix, P2P, NUMA, PCIe links", TopologyScreen),
    ScreenEntry("alerts", "a", "Alerts", "the alert log", AlertLogScreen),
    ScreenEntry("help", "question_mark", "Help", "keys and what they do", HelpScreen),
    ScreenEntry(
        "control",
        "c",
        "Control",
        "power limits, fan curve, hardware profiles (keys 1-9), journal",
        "gpustation.tui.control.screen:ControlScreen",
    ),
    ScreenEntry(
        "runs",
        "r",
        "Runs",
        "launch presets; follow, stop and compare runs",
        "gpustation.tui.runs:RunsScreen",
    ),
]


#: the screens every dashboard has; the others get a key binding of their own
BUILTIN_MODES = ("dashboard", "topology", "alerts", "help")


def mode_binding(entry: ScreenEntry) -> Binding:
    return Binding(entry.key, f"switch_to('{entry.mode}')", entry.title, id=f"app.{entry.mode}")


def available(factory: type[Screen[Any]] | str) -> bool:
    """Whether a screen's module exists, without importing it (start-up stays quick)."""
    if not isinstance(factory, str):
        return True
    module = factory.partition(":")[0]
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def screen_maker(entry: ScreenEntry) -> Callable[[], Screen[Any]]:
    """Build the entry's screen when its mode is first shown (imports it then)."""

    def make() -> Screen[Any]:
        cls = resolve(entry.factory)
        if cls is None:
            raise GpustationError(f"the {entry.title} screen could not be loaded")
        screen: Screen[Any] = cls()
        return screen

    return make


def resolve(factory: type[Screen[Any]] | str) -> Any:
    """The class (or function) a ``"module:attr"`` string names; None if missing."""
    if not isinstance(factory, str):
        return factory
    module, _, name = factory.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
