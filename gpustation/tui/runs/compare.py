"""Runs side by side: their loss curves overlaid, over the table of ``gpustation runs compare``."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from rich.console import RenderableType
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Static

from gpustation.runs.compare import compare
from gpustation.runs.curves import RunCurves, read_curves
from gpustation.runs.store.index import RunStore
from gpustation.tui.runs.model import short_ids
from gpustation.tui.runs.overlay import OverlayPlot, OverlayRun, legend
from gpustation.tui.widgets import set_size_classes


class CompareRead(Message):
    """The comparison and the runs' curves, read from the history on a worker thread."""

    def __init__(
        self, table: RenderableType, caption: str, runs: list[OverlayRun], run_ids: list[str]
    ) -> None:
        super().__init__()
        self.table = table
        self.caption = caption
        self.runs = runs
        self.run_ids = run_ids


def read_comparison(run_ids: list[str]) -> CompareRead:
    """The runs' comparison and curves (reads the index and the run directories)."""

    store = RunStore()
    records = [r for r in (store.get(i) for i in run_ids) if r is not None]
    comparison = compare(records)
    runs = []
    for n, r in enumerate(records):
        differs = [
            f"{row.name.removeprefix('set ')}={row.texts()[n]}"
            for row in comparison.rows
            if row.setting and row.values[n] is not None
        ]
        curves = read_curves(Path(r.run_dir)) if r.run_dir else RunCurves()
        runs.append(OverlayRun(r.id, r.preset or "", " ".join(differs), curves))
    # The legend names each run whole: the table's columns go by the ends of their ids.
    short = short_ids([r.id for r in records])
    return CompareRead(
        comparison.renderable(labels=[short[r.id] for r in records]),
        comparison.caption(),
        runs,
        [r.id for r in records],
    )


class CompareScreen(ModalScreen[None]):
    """Runs side by side: the curves overlaid and the table, read in a worker."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,v,q", "close", "Close", id="runs.compare.close"),
        Binding("x", "toggle_axis", "Steps/time", id="runs.compare.axis"),
    ]
    DEFAULT_CSS = """
    CompareScreen { align: center middle; }
    #compare-box { width: 95%; height: 90%; border: thick $primary; background: $surface; }
    #compare-plot { width: 100%; height: 40%; min-height: 6; }
    #compare-legend { height: auto; max-height: 9; padding: 0 1; text-wrap: nowrap;
                      text-overflow: ellipsis; }
    #compare-scroll { height: 1fr; padding: 0 1; }
    #compare-caption { height: auto; padding: 0 1; color: $text-muted; }
    CompareScreen.-short #compare-box { width: 100%; height: 100%; }
    CompareScreen.-short #compare-plot { height: 7; }
    """

    def __init__(self, run_ids: list[str]) -> None:
        super().__init__()
        self.run_ids = run_ids
        #: the runs shown, in column order (read by tests)
        self.shown: list[str] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="compare-box"):
            yield OverlayPlot(id="compare-plot")
            yield Static("", id="compare-legend")
            with VerticalScroll(id="compare-scroll"):
                yield Static("reading the history…", id="compare-table")
            yield Static("", id="compare-caption")

    def on_mount(self) -> None:
        self.query_one("#compare-box").border_title = "x steps/time · Esc closes"
        # A short terminal: the whole screen, and the plot gives the table its rows.
        set_size_classes(self, self.app.size)
        self.run_worker(self._load, thread=True, exit_on_error=False)

    def on_resize(self, event: events.Resize) -> None:
        set_size_classes(self, event.size)

    def _load(self) -> None:
        try:
            message = read_comparison(self.run_ids)
        except Exception as err:  # the index busy or unreadable: say so in the view
            text = Text(f"Could not read the runs: {err}", style="bold red")
            message = CompareRead(text, "", [], [])
        self.post_message(message)  # thread-safe

    def on_compare_read(self, message: CompareRead) -> None:
        self.shown = message.run_ids
        self.query_one("#compare-legend", Static).update(legend(message.runs))
        self.query_one("#compare-table", Static).update(message.table)
        self.query_one("#compare-caption", Static).update(Text(message.caption))
        self.query_one("#compare-plot", OverlayPlot).show(message.runs)

    def action_toggle_axis(self) -> None:
        plot = self.query_one("#compare-plot", OverlayPlot)
        plot.show(by_time=not plot.by_time)

    def action_close(self) -> None:
        self.dismiss(None)
