"""Runs side by side, as ``gpustation runs compare`` prints them."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Static


class CompareRead(Message):
    """The comparison table, read from the history on a worker thread."""

    def __init__(self, table: Table, run_ids: list[str]) -> None:
        super().__init__()
        self.table = table
        self.run_ids = run_ids


class CompareScreen(ModalScreen[None]):
    """Runs side by side (as ``gpustation runs compare``), read in a worker."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,v,q", "close", "Close", id="runs.compare.close"),
    ]
    DEFAULT_CSS = """
    CompareScreen { align: center middle; }
    #compare-box { width: 95%; height: 85%; border: thick $primary; background: $surface; }
    """

    def __init__(self, run_ids: list[str]) -> None:
        super().__init__()
        self.run_ids = run_ids
        self.shown: list[str] = []

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="compare-box"):
            yield Static("reading the history…", id="compare-table")

    def on_mount(self) -> None:
        self.run_worker(self._load, thread=True, exit_on_error=False)

    def _load(self) -> None:
        from gpustation.runs.compare import compare_rows
        from gpustation.runs.store import RunStore

        store = RunStore()
        records = [r for r in (store.get(i) for i in self.run_ids) if r is not None]
        table = Table(header_style="bold", box=None, pad_edge=False, title="Runs compared")
        table.add_column("")
        for r in records:
            table.add_column(r.id, justify="right", overflow="fold")
        for row in compare_rows(records) if records else []:
            table.add_row(row.name, *row.cells())
        table.caption = "changes in brackets are from the first run · Esc closes"
        self.post_message(CompareRead(table, [r.id for r in records]))  # thread-safe

    def on_compare_read(self, message: CompareRead) -> None:
        #: the runs shown, in column order (read by tests)
        self.shown = message.run_ids
        self.query_one("#compare-table", Static).update(message.table)

    def action_close(self) -> None:
        self.dismiss(None)
