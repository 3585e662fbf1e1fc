"""Modal dialogs: a GPU process's details, the confirmation before a process is
signalled, and the base of the questions with a few answers (quitting with runs
going, or with a fan curve kept)."""

from __future__ import annotations

import signal
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label

from gpustation import timefmt
from gpustation.telemetry import format as fmt
from gpustation.textsafe import safe
from gpustation.tui.procrows import ProcRow


def process_details_text(row: ProcRow) -> Text:
    """Every column of a process row, the command line in full.

    The command is another user's argv: made safe here too, whatever backend
    (or remote host) it came from. A ``Text``, never markup: ``[`` in an argv
    is only a character.
    """
    rss = None if row.rss_bytes is None else row.rss_bytes / (1024 * 1024)
    started = fmt.NA if row.started is None else timefmt.full(row.started)
    t = Text()
    for label, value in (
        ("PID", str(row.pid)),
        ("user", safe(row.user)),
        ("GPU", str(row.gpu)),
        ("GPU memory", f"{fmt.mib(row.gpu_memory_mib)}"),
        ("SM", fmt.num(row.sm_pct, 0, " %")),
        ("GPU power", fmt.num(row.power_w, 0, " W") + (" (estimated)" if row.power_w else "")),
        ("container", safe(row.container or "-")),
        ("CPU", fmt.num(row.cpu_pct, 0, " %")),
        ("RSS", fmt.mib(rss)),
        ("started", started),
    ):
        t.append(f"{label:<11}", style="bold")
        t.append(f"{value}\n")
    t.append("command\n", style="bold")
    t.append(safe(row.command))
    return t


class ProcessDialog(ModalScreen[str | None]):
    """A GPU process's details with its whole command line, wrapped (Enter on a row).

    Dismissed with ``"kill"`` when ``k`` is pressed (the caller then asks as the
    dashboard's ``k`` does), else with None.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,enter,q", "close", "Close", id="process.close"),
        Binding("k", "kill", "Kill", id="process.kill"),
    ]
    DEFAULT_CSS = """
    ProcessDialog { align: center middle; }
    #process-box {
        width: 100; max-width: 95%; height: auto; max-height: 90%;
        border: thick $primary; background: $surface; padding: 1 2;
    }
    #process-title { text-style: bold; margin-bottom: 1; }
    #process-scroll { height: auto; max-height: 50vh; }
    #process-details { width: 100%; }
    #process-hint { color: $text-muted; margin-top: 1; }
    """

    def __init__(self, row: ProcRow, simulated: bool = False) -> None:
        super().__init__()
        self.row = row
        self.simulated = simulated

    def compose(self) -> ComposeResult:
        sim = " (simulated)" if self.simulated else ""
        with Vertical(id="process-box"):
            yield Label(Text(f"Process {self.row.pid}{sim}"), id="process-title")
            with VerticalScroll(id="process-scroll"):  # a small terminal scrolls it (↑ ↓)
                yield Label(process_details_text(self.row), id="process-details")
            hint = "Esc or Enter closes · ↑ ↓ scroll · k signals this process"
            yield Label(hint, id="process-hint")

    def on_mount(self) -> None:
        self.query_one("#process-scroll").focus()

    def action_close(self) -> None:
        self.dismiss(None)

    def action_kill(self) -> None:
        self.dismiss("kill")


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
            yield Label(Text(f"Signal PID {r.pid}{sim}?"), id="kill-title")
            yield Label(Text(f"user {safe(r.user)} · GPU {r.gpu}"), id="kill-who")
            if r.holder:
                yield Label(
                    "holds the GPU's device node open without being in the driver's "
                    "process list: what can keep VRAM in use after its job ended",
                    id="kill-holder",
                )
            yield Label(Text(safe(r.command)[:200]), id="kill-command")
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


class ChoiceDialog(ModalScreen[str | None]):
    """A question with a few answers, dismissed with the chosen answer's id (None: cancel).

    A subclass names its ``BOX`` (the ids ``#BOX-box`` and ``#BOX-buttons``), its
    ``ANSWERS`` (button id, label, variant; ``cancel`` dismisses with None), the
    ``DEFAULT`` button focused on opening (Enter on an unread dialog takes the safe
    answer) and its text in :meth:`lines`; its bindings call ``answer(...)``.
    """

    BOX: ClassVar[str] = "choice"
    ANSWERS: ClassVar[tuple[tuple[str, str, Any], ...]] = ()
    DEFAULT: ClassVar[str] = "cancel"
    DEFAULT_CSS = """
    ChoiceDialog { align: center middle; }
    ChoiceDialog .choice-box {
        width: 76; height: auto; border: thick $warning; background: $surface; padding: 1 2;
    }
    ChoiceDialog .choice-box Label { width: 100%; }
    ChoiceDialog .choice-buttons { height: auto; margin-top: 1; }
    ChoiceDialog .choice-buttons Button { margin-right: 2; }
    """

    def lines(self) -> list[tuple[str, Any]]:
        """(widget id, text) of each line above the buttons."""
        return []

    def compose(self) -> ComposeResult:
        with Vertical(id=f"{self.BOX}-box", classes="choice-box"):
            for line_id, text in self.lines():
                yield Label(text, id=line_id)
            with Horizontal(id=f"{self.BOX}-buttons", classes="choice-buttons"):
                for answer, label, variant in self.ANSWERS:
                    yield Button(label, id=answer, variant=variant)

    def on_mount(self) -> None:
        self.query_one(f"#{self.DEFAULT}", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_answer(event.button.id)

    def action_answer(self, choice: str | None) -> None:
        self.dismiss(None if choice in (None, "cancel") else choice)
