"""The sweeps, over the runs screen (``S``): each sweep's points, plot and recommendation.

A sweep's points are runs tagged ``sweep:<id>``; what the sweep found is in
its ``sweep.json`` (see :mod:`gpustation.runs.sweep`). A worker reads every
sweep; the list shows them newest first, and the highlighted one's points
table (the columns of ``gpustation sweeps show``), its plot of throughput
against energy per unit (the Pareto front drawn, the fastest and the
recommended point marked) and the recommendation come from
:mod:`gpustation.runs.sweep.report`, the same figures the command prints.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, OptionList, Static
from textual.widgets.option_list import Option

from gpustation.runs.sweep.model import SWEEP_TAG, Sweep, list_sweeps
from gpustation.runs.sweep.report import (
    TEXT_COLUMNS,
    point_columns,
    point_rows,
    recommendation_text,
    terminal_plot,
)
from gpustation.textsafe import safe


def sweep_of(tags: list[str]) -> str | None:
    """The sweep a run belongs to, from its tags (None: none)."""
    return next((t[len(SWEEP_TAG) :] for t in tags if t.startswith(SWEEP_TAG)), None)


def _cell(text: str, column: str) -> Text:
    """A cell of the points table: text to the left, figures to the right."""
    return Text(safe(text), justify="left" if column in TEXT_COLUMNS else "right")


class SweepsRead(Message):
    """Every sweep (read on a worker thread), or why they could not be read."""

    def __init__(self, sweeps: list[Sweep], error: str | None = None) -> None:
        super().__init__()
        self.sweeps = sweeps
        self.error = error


class SweepPlot(Static):
    """The plot of a sweep, drawn again for its own size."""

    def on_resize(self) -> None:
        screen = self.screen
        if isinstance(screen, SweepsScreen):
            screen.call_after_refresh(screen.draw_plot)


class SweepsScreen(ModalScreen[None]):
    """The sweeps and the highlighted one's points, plot and recommendation."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,S,q", "close", "Close", id="runs.sweeps.close"),
    ]
    DEFAULT_CSS = """
    SweepsScreen { align: center middle; }
    #sweeps-box { width: 98%; height: 94%; border: thick $primary; background: $surface; }
    #sweeps-list { width: 34; border: round $panel; }
    #sweeps-list:focus { border: round $accent; }
    #sweep-detail { width: 1fr; }
    #sweep-head { height: auto; padding: 0 1; }
    #sweep-points { height: auto; max-height: 50%; }
    #sweep-plot { height: 1fr; min-height: 8; }
    #sweep-advice { height: auto; padding: 0 1; }
    """

    def __init__(self, select: str | None = None) -> None:
        super().__init__()
        self.select = select
        self.sweeps: dict[str, Sweep] = {}
        #: the sweep shown (read by tests)
        self.shown: str | None = None
        self._plot_key: object = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="sweeps-box"):
            yield OptionList(id="sweeps-list")
            with Vertical(id="sweep-detail"):
                yield Static("reading the sweeps…", id="sweep-head")
                yield DataTable(id="sweep-points", cursor_type="row", zebra_stripes=False)
                yield SweepPlot(id="sweep-plot")
                yield Static(id="sweep-advice")

    def on_mount(self) -> None:
        self.query_one("#sweeps-list", OptionList).border_title = "Sweeps (Esc closes)"
        self.run_worker(self._load, thread=True, exit_on_error=False, name="read sweeps")

    def _load(self) -> None:

        try:
            sweeps = list_sweeps()
        except OSError as err:
            self.post_message(SweepsRead([], f"could not read the sweeps: {err}"))
            return
        self.post_message(SweepsRead(sweeps))  # thread-safe

    def on_sweeps_read(self, message: SweepsRead) -> None:
        newest = sorted(message.sweeps, key=lambda s: (s.created_at, s.id), reverse=True)
        self.sweeps = {s.id: s for s in newest}
        options = self.query_one("#sweeps-list", OptionList)
        options.clear_options()
        head = self.query_one("#sweep-head", Static)
        if message.error or not newest:
            head.update(
                Text(
                    message.error
                    or "No sweeps yet: `gpustation sweep PRESET --set KEY=A,B` runs one.",
                    style="dim",
                )
            )
            return
        for s in newest:
            done = sum(p.status != "pending" for p in s.points)
            label = Text.assemble(
                (safe(s.preset), "bold"), f"  {done}/{len(s.points)} · {safe(s.state_text())}\n",
                (safe(s.id), "dim"),
            )  # fmt: skip
            options.add_option(Option(label, id=s.id))
        ids = list(self.sweeps)
        options.highlighted = ids.index(self.select) if self.select in ids else 0
        options.focus()
        self._show(ids[options.highlighted])

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option.id:
            self._show(event.option.id)

    def _show(self, sweep_id: str) -> None:
        sweep = self.sweeps.get(sweep_id)
        if sweep is None:
            return
        self.shown = sweep_id
        head = Text()
        head.append(f"sweep {safe(sweep.id)}", style="bold")
        head.append(f" · {safe(sweep.preset)} · {safe(sweep.state_text())}")
        if sweep.simulated:
            head.append(" · SIMULATED GPUs", style="bold yellow")
        self.query_one("#sweep-head", Static).update(head)
        table = self.query_one("#sweep-points", DataTable)
        table.clear(columns=True)
        columns = point_columns(sweep)
        for column in columns:
            table.add_column(_cell(column, column), key=column)
        for row in point_rows(sweep):
            table.add_row(*(_cell(c, col) for c, col in zip(row, columns, strict=True)))
        self.query_one("#sweep-advice", Static).update(Text(safe(recommendation_text(sweep))))
        self._plot_key = None
        self.call_after_refresh(self.draw_plot)

    def draw_plot(self) -> None:
        plot = self.query_one("#sweep-plot", Static)
        sweep = self.sweeps.get(self.shown or "")
        width, height = plot.content_region.width, plot.content_region.height
        key = (self.shown, width, height)
        if sweep is None or not width or key == self._plot_key:
            return
        self._plot_key = key
        figure = terminal_plot(sweep, width=max(30, width), height=max(8, height))
        plot.update(
            Text.from_ansi(figure) if figure else Text("no measured point to plot", style="dim")
        )

    def action_close(self) -> None:
        self.dismiss(None)
