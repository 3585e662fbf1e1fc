"""The sweeps, over the runs screen (``S``): each sweep's points, plot and recommendation.

A sweep's points are runs tagged ``sweep:<id>``; what the sweep found is in
its ``sweep.json`` (see :mod:`gpustation.runs.sweep`). A worker reads every
sweep; the list shows them newest first, and the highlighted one's points
table (the columns of ``gpustation sweeps show``: the settings every point
shares once above it, each point's own settings in it), its plot of
throughput against energy per unit (the Pareto front drawn, the fastest and
the recommended point marked) and the recommendation come from
:mod:`gpustation.runs.sweep.report`, the same figures the command prints.

The table fits the width it has: headings wrap onto a second line, then
shorter headings and runs' shortest unique ids stand in; only a table wider
than all that scrolls sideways. Below 100 columns the list goes above the
points and the whole view scrolls.
"""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, ScrollableContainer
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from gpustation.runs.sweep.model import SWEEP_TAG, Sweep, list_sweeps
from gpustation.runs.sweep.report import (
    TEXT_COLUMNS,
    constants,
    point_columns,
    point_rows,
    recommendation_text,
    terminal_plot,
)
from gpustation.textsafe import safe
from gpustation.tui.runs.model import short_ids
from gpustation.tui.widgets import set_size_classes

#: shorter headings for a narrow table (the unit of the throughput says what it is)
SHORT_HEADINGS = {"peak VRAM MiB": "VRAM MiB"}


def sweep_of(tags: list[str]) -> str | None:
    """The sweep a run belongs to, from its tags (None: none)."""
    return next((t[len(SWEEP_TAG) :] for t in tags if t.startswith(SWEEP_TAG)), None)


def _short_heading(heading: str) -> str:
    """``throughput (img/s)`` -> ``img/s``; the others from :data:`SHORT_HEADINGS`."""
    if heading.startswith("throughput (") and heading.endswith(")"):
        return heading.removeprefix("throughput (").removesuffix(")")
    return SHORT_HEADINGS.get(heading, heading)


def _words(text: str) -> int:
    return max((len(word) for word in text.split()), default=0)


def points_table(sweep: Sweep, width: int) -> tuple[Table, int]:
    """The points table for ``width`` columns, and the columns it takes.

    ``#``, the point's own settings, status, figures, run: the roomiest that
    fits, from the headings and whole run ids of ``sweeps show`` to shorter
    headings and each run's shortest unique id. A figure or a word is never
    broken; a heading or a label wraps onto more lines. Wider than ``width``
    even so: the narrowest, for the view to scroll sideways.
    """
    headings = point_columns(sweep)
    rows = point_rows(sweep, constants_apart=True)
    short_runs = short_ids([row[-1] for row in rows])
    # (shorter headings, whole run ids), the roomiest first
    for short, whole_ids in ((False, True), (False, False), (True, False)):
        shown = [_short_heading(h) if short else h for h in headings]
        cells = [[*r[:-1], r[-1] if whole_ids else short_runs.get(r[-1], r[-1])] for r in rows]
        fitted = _fit_widths(shown, cells, width)
        if fitted is not None:
            break
    widths = fitted or _fit_widths(shown, cells, 0) or []
    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, 1, 0, 0))
    for n, heading in enumerate(shown):
        left = headings[n] in TEXT_COLUMNS
        table.add_column(heading, justify="left" if left else "right", width=widths[n])
    for row in cells:
        table.add_row(*(Text(safe(c)) for c in row))
    return table, sum(widths) + len(widths) - 1


def _fit_widths(headings: list[str], rows: list[list[str]], width: int) -> list[int] | None:
    """Column widths that fit ``width`` with no word broken (None: none do; with
    ``width`` 0, the narrowest): the labels first, then the headings, get room
    to stay on one line."""
    columns = list(zip(headings, *rows, strict=True))
    least = [max(_words(text) for text in column) for column in columns]
    most = [max(len(text) for text in column) for column in columns]
    gaps = len(columns) - 1
    if width and sum(least) + gaps > width:
        return None
    widths = list(least)
    spare = max(0, width - sum(widths) - gaps)
    for n in sorted(range(len(columns)), key=lambda n: headings[n] not in TEXT_COLUMNS):
        grow = min(spare, most[n] - widths[n])
        widths[n] += grow
        spare -= grow
    return widths


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
    #sweep-detail { width: 1fr; overflow-x: auto; overflow-y: auto; }
    #sweep-head, #sweep-shared { height: auto; padding: 0 1; }
    #sweep-points { height: auto; width: auto; min-width: 100%; padding: 0 1; }
    #sweep-plot { height: 1fr; min-height: 8; }
    #sweep-advice { height: auto; padding: 0 1; }
    SweepsScreen.-narrow #sweeps-box { layout: vertical; width: 100%; height: 100%; }
    SweepsScreen.-narrow #sweeps-list { width: 100%; height: auto; max-height: 6; }
    SweepsScreen.-narrow #sweep-detail { height: 1fr; }
    SweepsScreen.-narrow #sweep-plot { height: 14; }
    """

    def __init__(self, select: str | None = None) -> None:
        super().__init__()
        self.select = select
        self.sweeps: dict[str, Sweep] = {}
        #: the sweep shown (read by tests)
        self.shown: str | None = None
        self._plot_key: object = None
        self._table_key: object = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="sweeps-box"):
            yield OptionList(id="sweeps-list")
            with ScrollableContainer(id="sweep-detail"):
                yield Static("reading the sweeps…", id="sweep-head")
                yield Static(id="sweep-shared")
                yield Static(id="sweep-points")
                yield SweepPlot(id="sweep-plot")
                yield Static(id="sweep-advice")

    def on_resize(self, event: events.Resize) -> None:
        set_size_classes(self, event.size)
        self.call_after_refresh(self.draw_points)

    def on_mount(self) -> None:
        set_size_classes(self, self.app.size)
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
        shared = Text()
        if constants(sweep):
            shared.append("every point: ", style="dim")
            shared.append(safe(" ".join(constants(sweep))))
        self.query_one("#sweep-shared", Static).update(shared)
        self.query_one("#sweep-advice", Static).update(Text(safe(recommendation_text(sweep))))
        self._table_key = self._plot_key = None
        self.call_after_refresh(self.draw_points)
        self.call_after_refresh(self.draw_plot)

    def draw_points(self) -> None:
        """The points table, the roomiest that fits the width (sideways scroll the last resort)."""
        sweep = self.sweeps.get(self.shown or "")
        detail = self.query_one("#sweep-detail", ScrollableContainer)
        width = detail.scrollable_content_region.width - 2  # the table's padding
        key = (self.shown, width)
        if sweep is None or width <= 0 or key == self._table_key:
            return
        self._table_key = key
        table, used = points_table(sweep, width)
        points = self.query_one("#sweep-points", Static)
        points.update(table)
        points.styles.width = max(width, used) + 2

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
