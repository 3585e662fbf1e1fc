"""The dashboard's screens as Textual modes: one :class:`ScreenEntry` per screen
(its mode name, key, footer label and help line), the key that shows it, and
the screen built when its mode is first shown.

``screen`` is a function returning the screen's class; for the runs and
control screens it imports their module when called (the first time the
screen is shown or its keys are listed), so start-up imports neither.
``requires`` names the screen's package: where it is missing the entry is
left out, found without importing anything (a package's own submodule could
not be looked for without importing the package).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from gpustation.errors import GpustationError
from gpustation.tui.screens import AlertLogScreen, DashboardScreen, HelpScreen, TopologyScreen

#: command-palette entries a screen adds: (app, the screen the palette is over) -> commands
Commands = Callable[[App[Any], Screen[Any]], Iterable[SystemCommand]]


@dataclass(frozen=True)
class ScreenEntry:
    """A screen of the dashboard: its mode name, key and how to build it."""

    mode: str
    key: str
    title: str
    help: str
    #: the screen's class (imported when called, for the screens loaded late)
    screen: Callable[[], type[Screen[Any]]]
    #: the package ``screen`` imports from; the entry is left out where it is missing
    requires: str | None = None
    #: the screen's command-palette entries, offered on every screen
    commands: Commands | None = None


def runs_screen() -> type[Screen[Any]]:
    # Imported on first use, for start-up time: the runs screen pulls in the run store.
    from gpustation.tui.runs.screen import (
        RunsScreen,  # start-up time: a screen's modules load when it is first opened
    )

    return RunsScreen


def control_screen() -> type[Screen[Any]]:
    # Imported on first use, for start-up time: the control screen pulls in control/.
    from gpustation.tui.control.screen import (
        ControlScreen,  # start-up time: a screen's modules load when it is first opened
    )

    return ControlScreen


def control_commands(app: App[Any], screen: Screen[Any]) -> Iterable[SystemCommand]:
    # Imported when the palette opens, for start-up time (as control_screen).
    from gpustation.tui.control.screen import (
        system_commands,  # start-up time: a screen's modules load when it is first opened
    )

    return system_commands(app, screen)


SCREENS_BY_MODE: list[ScreenEntry] = [
    ScreenEntry(
        "dashboard",
        "d",
        "Dashboard",
        "GPU cards, history, host, processes",
        lambda: DashboardScreen,
    ),
    ScreenEntry(
        "topology", "t", "Topology", "GPU matrix, P2P, NUMA, PCIe links", lambda: TopologyScreen
    ),
    ScreenEntry("alerts", "a", "Alerts", "the alert log", lambda: AlertLogScreen),
    ScreenEntry("help", "question_mark", "Help", "keys and what they do", lambda: HelpScreen),
    ScreenEntry(
        "control",
        "c",
        "Control",
        "power limits, fan curve, hardware profiles (keys 1-9), journal",
        control_screen,
        requires="gpustation.tui.control",
        commands=control_commands,
    ),
    ScreenEntry(
        "runs",
        "r",
        "Runs",
        "launch presets; follow, stop and compare runs",
        runs_screen,
        requires="gpustation.tui.runs",
    ),
]


#: the screens every dashboard has; the others get a key binding of their own
BUILTIN_MODES = ("dashboard", "topology", "alerts", "help")


def mode_binding(entry: ScreenEntry) -> Binding:
    return Binding(entry.key, f"switch_to('{entry.mode}')", entry.title, id=f"app.{entry.mode}")


def available(entry: ScreenEntry) -> bool:
    """Whether an entry's screen module exists, without importing it (start-up stays quick)."""
    if entry.requires is None:
        return True
    try:
        return importlib.util.find_spec(entry.requires) is not None
    except (ImportError, ValueError):
        return False


def screen_maker(entry: ScreenEntry) -> Callable[[], Screen[Any]]:
    """Build the entry's screen when its mode is first shown (imports it then)."""

    def make() -> Screen[Any]:
        try:
            cls = entry.screen()
        except ImportError as err:
            raise GpustationError(f"the {entry.title} screen could not be loaded: {err}") from err
        return cls()

    return make
