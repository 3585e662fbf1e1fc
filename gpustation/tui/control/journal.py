"""The control journal as a modal screen: every change gpustation made, newest first."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Static

from gpustation import timefmt
from gpustation.control import journal

#: the newest entries shown
MAX_ENTRIES = 500


def journal_text() -> Text:
    """The journal, newest first (reads a growing file: never on the UI thread)."""
    entries = list(journal.read_entries())
    text = Text()
    text.append(f"Control journal ({journal.journal_path()}), newest first\n\n", style="bold")
    if not entries:
        text.append("No changes recorded yet.", style="dim")
    for e in reversed(entries[-MAX_ENTRIES:]):
        stamp = timefmt.full(e.time)
        fan = f" fan {e.fan}" if e.fan is not None else ""
        text.append(f"{stamp} ", style="dim")
        text.append(f"GPU {e.gpu}{fan} {e.what}: ")
        text.append(
            f"{journal.describe_value(e.what, e.previous)} -> "
            f"{journal.describe_value(e.what, e.new)}",
            style="bold",
        )
        text.append(f"  {e.command}" + (" [SIMULATED]" if e.simulated else "") + "\n", style="dim")
    return text


class JournalScreen(ModalScreen[None]):
    """The control journal, read in a worker that posts :class:`JournalScreen.Loaded`."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,j,q", "close", "Close", id="journal.close"),
    ]
    DEFAULT_CSS = """
    JournalScreen { align: center middle; }
    #journal-box { width: 90%; height: 80%; border: thick $primary; background: $surface; }
    """

    class Loaded(Message):
        """The journal's text, read off the UI thread."""

        def __init__(self, text: Text) -> None:
            super().__init__()
            self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="journal-box"):
            yield Static("reading the journal…", id="journal-text")

    def on_mount(self) -> None:
        self._load()

    @work(thread=True, exit_on_error=False, group="journal")
    def _load(self) -> None:
        try:
            text = journal_text()
        except OSError as err:
            text = Text(f"The journal could not be read: {err}", style="red")
        self.post_message(self.Loaded(text))

    def on_journal_screen_loaded(self, event: Loaded) -> None:
        self.query_one("#journal-text", Static).update(event.text)

    def action_close(self) -> None:
        self.dismiss(None)
