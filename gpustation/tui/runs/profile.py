"""The selected run's top kernels and ops, in place of its plots and log (``P``).

The poller reads ``profile/top_ops.json`` with the run's other files and the
view keeps it (``{}``: the run was not profiled); this pane lays it out with
:func:`gpustation.runs.kernel_profile.profile_tables`, as ``gpustation runs show``
prints it.
"""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console, Group
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from gpustation.runs.kernel_profile import HOW_TO_PROFILE, profile_tables
from gpustation.tui.runs.model import RunView


class ProfilePane(VerticalScroll):
    """The top CUDA kernels and CPU ops of the selected run, their share of a step."""

    DEFAULT_CSS = """
    ProfilePane { border: round $panel; }
    ProfilePane:focus { border: round $accent; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key: object = None
        #: what the pane says, as plain text (read by tests)
        self.plain = ""

    def compose(self) -> ComposeResult:
        yield Static(id="run-profile-body")

    def show(self, view: RunView | None) -> None:
        key = (view.id, id(view.profile)) if view is not None else None
        if key == self._key:
            return
        self._key = key
        body = self.query_one("#run-profile-body", Static)
        self.border_title = f"Profile · {view.id}" if view is not None else "Profile"
        if view is None:
            shown: Any = Text("Select a run to see its top kernels.", style="dim")
            self.plain = shown.plain
        elif view.profile is None:
            shown = Text("reading the run's profile…", style="dim")
            self.plain = shown.plain
        elif not view.profile:
            shown = Text(HOW_TO_PROFILE, style="dim")
            self.plain = shown.plain
        else:
            parts = profile_tables(view.profile, view.run_dir, name_width=60)
            shown = Group(*parts)
            self.plain = "\n".join(_plain(p) for p in parts)
        body.update(shown)


def _plain(renderable: Any) -> str:
    """A renderable's text without styles (what the pane says, for tests)."""
    console = Console(width=200, color_system=None, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()
