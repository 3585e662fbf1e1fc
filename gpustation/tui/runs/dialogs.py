"""The runs screen's dialogs: stop a run, quit with runs going (the launch forms: :mod:`.form`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label

from gpustation.tui.dialogs import ChoiceDialog
from gpustation.tui.runs.model import RunView

# ---- dialogs --------------------------------------------------------------------------------


class StopRunDialog(ModalScreen[bool]):
    """Asks before stopping a run; Cancel is the default."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y,s", "answer(True)", "Stop", id="runs.stop.yes"),
        Binding("n,escape", "answer(False)", "Cancel", id="runs.stop.no"),
    ]
    DEFAULT_CSS = """
    StopRunDialog { align: center middle; }
    #stop-box {
        width: 72; height: auto; border: thick $warning; background: $surface; padding: 1 2;
    }
    #stop-box Label { width: 100%; }
    #stop-buttons { height: auto; margin-top: 1; }
    #stop-buttons Button { margin-right: 2; }
    """

    def __init__(self, view: RunView) -> None:
        super().__init__()
        self.view = view

    def compose(self) -> ComposeResult:
        v = self.view
        with Vertical(id="stop-box"):
            yield Label(Text(f"Stop {v.title or v.preset}?", style="bold"), id="stop-title")
            yield Label(f"run {v.id}", id="stop-id")
            yield Label(
                "It gets SIGINT (to save and leave), then SIGTERM, then SIGKILL if it "
                "does not end.",
                id="stop-how",
            )
            with Horizontal(id="stop-buttons"):
                yield Button("Stop run (y)", id="stop", variant="warning")
                yield Button("Cancel (n)", id="cancel", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "stop")

    def action_answer(self, stop: bool) -> None:
        self.dismiss(stop)


class QuitRunsDialog(ChoiceDialog):
    """ "Stop N runs or leave them running?" when quitting with runs going."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "answer('stop')", "Stop runs", id="runs.quit.stop"),
        Binding("l", "answer('leave')", "Leave running", id="runs.quit.leave"),
        Binding("escape,c", "answer(None)", "Cancel", id="runs.quit.cancel"),
    ]
    BOX = "quit"
    ANSWERS = (
        ("stop", "Stop (s)", "warning"),
        ("leave", "Leave running (l)", "primary"),
        ("cancel", "Cancel (Esc)", "default"),
    )

    def __init__(self, views: Sequence[RunView]) -> None:
        super().__init__()
        self.views = list(views)

    def lines(self) -> list[tuple[str, Any]]:
        n = len(self.views)
        runs = f"{n} run{'s' if n != 1 else ''}"
        names = ", ".join(v.preset or v.id for v in self.views[:6])
        if n > 6:
            names += f" +{n - 6}"
        question = f"Stop {runs} or leave {'them' if n != 1 else 'it'} running?"
        return [
            ("quit-question", Text(question, style="bold")),
            ("quit-runs", names),
            (
                "quit-note",
                "A run left running goes on without the dashboard; the next start "
                "finds it again (r).",
            ),
        ]
