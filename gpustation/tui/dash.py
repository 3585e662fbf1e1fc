"""What the dashboard's screens and controllers use of the app, as a Protocol.

Screens and controllers are handed the running app; they read it through
:class:`Dashboard` rather than importing :class:`~gpustation.tui.app.DashboardApp`,
so the app can import its screens without the screens importing it back.
``tui/app.py`` checks (for mypy) that the app is a :class:`Dashboard`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from textual.app import App
    from textual.binding import Binding
    from textual.screen import Screen

    from gpustation.telemetry.alerts import AlertLog
    from gpustation.telemetry.backend import Backend
    from gpustation.telemetry.model import Snapshot
    from gpustation.telemetry.rings import History
    from gpustation.tui.procrows import ProcRow
    from gpustation.tui.source import Frame


class Dashboard(Protocol):
    """The dashboard app as its screens and controllers see it (beside Textual's ``App``)."""

    frame: Frame | None
    read_only: bool
    metric: str
    graph_window_s: float
    history: History
    alerts: AlertLog
    #: asked on quitting; True: one of them asked the user first
    quit_hooks: list[Callable[[], bool]]
    #: True from any: the GPM fields are read
    gpm_hooks: list[Callable[[], bool]]

    @property
    def latest(self) -> Snapshot | None: ...

    @property
    def backend(self) -> Backend | None: ...

    def update_chrome(self, screen: Screen[Any]) -> None: ...

    def sample_now(self) -> None: ...

    def set_metric(self, metric: str) -> None: ...

    def confirm_kill(self, row: ProcRow) -> None: ...

    def show_process(self, row: ProcRow) -> None: ...

    def all_bindings(self) -> list[Binding]: ...

    def screen_bindings(self) -> list[tuple[str, list[Binding]]]: ...

    def remapped(self, binding: Binding) -> Binding: ...


def dashboard(app: App[Any]) -> Dashboard:
    """``app`` as the dashboard (screens and controllers only run inside one)."""
    return cast("Dashboard", app)
