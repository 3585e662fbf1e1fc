"""Modal dialogs: the confirmation before a process is signalled."""

from __future__ import annotations

import signal
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label

from gpustation.tui.widgets import ProcRow


class KillDialog(ModalScreen[int | None]):
    """Asks before sending SIGTERM or SIGKILL; dismisses with the signal or None."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("t", "choose('term')", "SIGTERM", id="kill.term"),
        Binding("K", "choose('kill')", "SIGKILL", id="kill.kill"),
        Binding("escape,n", "choose('cancel')", "Cancel", id="kill.cancel"),
    ]

    def __init__(self, row: ProcRow, simulated: bool = False) -> None:
        super().__init__()
        self.row = row
        self.simulated = simulated

    def compose(self) -> ComposeResult:
        r = self.row
        sim = " (simulated process)" if self.simulated else ""
        with Vertical(id="kill-box"):
            yield Label(f"Signal PID {r.pid}{sim}?", id="kill-title")
            yield Label(f"user {r.user} · GPU {r.gpu}", id="kill-who")
            yield Label(r.command[:200], id="kill-command")
            with Horizontal(id="kill-buttons"):
                yield Button("Terminate (SIGTERM) [t]", id="term", variant="warning")
                yield Button("Kill (SIGKILL) [K]", id="kill", variant="error")
                yield Button("Cancel [Esc]", id="cancel", variant="primary")

    def on_mount(self) -> None:
        # Cancel is the default: Enter on an unread dialog must not kill anything.
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_choose(event.button.id or "cancel")

    def action_choose(self, choice: str) -> None:
        sig = {"term": signal.SIGTERM, "kill": signal.SIGKILL}.get(choice)
        self.dismiss(int(sig) if sig is not None else None)
