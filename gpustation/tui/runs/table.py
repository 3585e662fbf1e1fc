"""The runs table: a row per run, the columns that fit its width.

The screen hands :meth:`RunsTable.show_runs` every column's text for every
run; the table shows the columns that fit, the most needed first
(:data:`COLUMN_NEED`): a narrow table drops whole columns rather than cut
the ones it keeps. The run column shows each id's shortest unique tail
(what ``gpustation runs show`` takes), the whole id where there is room.
A new row changes the table's scrollable height, never the screen's layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.geometry import Size
from textual.reactive import Reactive
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey

from gpustation.tui.runs.model import short_ids
from gpustation.tui.runs.widgets import fit_scrollbars

#: the columns, in the order shown: (key, label)
RUN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("mark", ""),
    ("preset", "preset"),
    ("id", "run"),
    ("step", "step"),
    ("loss", "loss"),
    ("status", "status"),
    ("energy", "energy"),
    ("time", "time"),
    ("gpus", "GPUs"),
    ("started", "started"),
    ("notes", "tags · note"),
)
#: the columns kept as the table narrows, most needed first (the selected
#: run's figures are all in the run pane beside or behind the table too)
COLUMN_NEED = (
    "mark",
    "preset",
    "id",
    "status",
    "step",
    "loss",
    "energy",
    "notes",
    "time",
    "started",
    "gpus",
)
#: the widest the tags and note column gets (a longer cell is cut at its end)
NOTES_MAX_W = 24
#: columns a cell's padding takes (one each side), and those kept for the scrollbar
CELL_PAD = 2
SCROLLBAR_W = 2


@dataclass(frozen=True)
class RunRow:
    """A run as the table shows it: each column's text by key, the status's style."""

    id: str
    cells: Mapping[str, str]
    status_style: str = ""


@dataclass(frozen=True)
class Layout:
    """The columns shown (keys, in order), whether the run column has whole ids."""

    columns: tuple[str, ...]
    whole_ids: bool
    priced: bool


def fit_columns(
    widths: Mapping[str, int], room: int, whole_id_w: int
) -> tuple[tuple[str, ...], bool]:
    """The columns that fit ``room`` columns, the most needed first, and whether the
    run column fits whole ids (``whole_id_w`` wide; ``widths['id']`` is the short ids').

    The first two are kept whatever the room: a table shows which run each row is.
    """
    shown: set[str] = set()
    used = 0
    for n, key in enumerate(COLUMN_NEED):
        width = widths[key] + CELL_PAD
        if used + width <= room or n < 2:
            shown.add(key)
            used += width
    whole = "id" in shown and used + whole_id_w - widths["id"] <= room
    return tuple(k for k, _ in RUN_COLUMNS if k in shown), whole


class RunsTable(DataTable[Any]):
    """The runs table: a new row changes its scrollable height, never the screen's layout.

    Only for a table whose size the stylesheet fixes (``height: 1fr``): then
    the rows it holds move its scrollbar and nothing else, and a run starting
    or ending need not lay the whole screen out again. Showing or hiding the
    scrollbar still does (its own reactive).
    """

    virtual_size: Reactive[Size] = Reactive(Size(0, 0), layout=False)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: the runs' ids, in the order of the rows
        self.row_ids: list[str] = []
        self._rows: list[RunRow] = []
        #: whether the energy column says the cost too
        self.priced = False
        self._layout: Layout | None = None
        self._short: dict[str, str] = {}
        self._short_for: tuple[str, ...] = ()
        #: the text of each row's shown cells, as last drawn
        self._drawn: dict[str, tuple[str, ...]] = {}

    def watch_virtual_size(self, size: Size) -> None:
        fit_scrollbars(self, size)

    def show_runs(
        self,
        rows: Sequence[RunRow],
        priced: bool,
        select: str | None = None,
        current: str | None = None,
    ) -> None:
        """Show ``rows``; the cursor goes to ``select``, or stays on ``current`` when the
        rows changed (the first row when it is gone)."""
        self._rows = list(rows)
        self.priced = priced
        self._apply(select, current)

    def on_resize(self) -> None:
        if self._rows:
            self._apply(None, self.row_ids[self.cursor_row] if self.row_ids else None)

    def _label(self, key: str) -> str:
        label = dict(RUN_COLUMNS)[key]
        return "energy · cost" if key == "energy" and self.priced else label

    def _cell(self, row: RunRow, key: str, whole_ids: bool) -> str:
        if key == "id" and not whole_ids:
            return self._short.get(row.id, row.id)
        return row.cells.get(key, "")

    def _fit(self) -> Layout:
        rows = self._rows
        ids = tuple(r.id for r in rows)
        if ids != self._short_for:
            self._short, self._short_for = short_ids(ids), ids
        widths = {
            key: max(
                [
                    cell_len(self._label(key)),
                    *(cell_len(self._cell(r, key, False)) for r in self._rows),
                ]
            )
            for key, _ in RUN_COLUMNS
        }
        widths["notes"] = min(widths["notes"], NOTES_MAX_W)
        whole_w = max([cell_len("run"), *(cell_len(i) for i in ids)])
        room = self.content_region.width - SCROLLBAR_W
        if room <= 0:  # not laid out yet: every column until it is
            return Layout(tuple(k for k, _ in RUN_COLUMNS), True, self.priced)
        columns, whole = fit_columns(widths, room, whole_w)
        return Layout(columns, whole, self.priced)

    def _styled(self, row: RunRow, cells: tuple[str, ...]) -> list[Text]:
        # Text, never markup: presets, notes and tags are the user's words ("[/]" too).
        assert self._layout is not None
        return [
            Text(cell, style=row.status_style if key == "status" else "")
            for key, cell in zip(self._layout.columns, cells, strict=True)
        ]

    def _apply(self, select: str | None, current: str | None) -> None:
        layout = self._fit()
        if layout != self._layout:
            self._layout = layout
            self.clear(columns=True)
            for key in layout.columns:
                width = NOTES_MAX_W if key == "notes" else None
                self.add_column(self._label(key), key=key, width=width)
            self.row_ids = []  # every row made again under the new columns
        ids = [r.id for r in self._rows]
        if ids != self.row_ids:
            self.clear()
            self._drawn.clear()
            for row in self._rows:
                cells = tuple(self._cell(row, k, layout.whole_ids) for k in layout.columns)
                self._drawn[row.id] = cells
                self.add_row(*self._styled(row, cells), key=row.id)
            self.row_ids = ids
            wanted = select or current
            if wanted in ids:
                self.move_cursor(row=ids.index(wanted), animate=False)
            elif ids:
                self.move_cursor(row=0, animate=False)
            self._widen(layout)
            return
        if select in ids:
            self.move_cursor(row=ids.index(select), animate=False)
        for row in self._rows:
            cells = tuple(self._cell(row, k, layout.whole_ids) for k in layout.columns)
            old = self._drawn.get(row.id)
            if cells == old:
                continue
            self._drawn[row.id] = cells
            styled = self._styled(row, cells)
            for n, key in enumerate(layout.columns):
                if old is None or cells[n] != old[n]:
                    self.update_cell(row.id, key, styled[n], update_width=key != "notes")
        self._widen(layout)

    def _widen(self, layout: Layout) -> None:
        """Each column as wide as its widest cell now, not once the table is next idle.

        A data table measures new rows and cells when its queue is next empty;
        until then its columns are as wide as their labels. On a busy screen
        that was seen to last over 20 s (``runnin`` for ``running``), so the
        columns are sized here from the text the table was given.
        """
        for n, key in enumerate(layout.columns):
            column = self.columns.get(ColumnKey(key))
            if column is None or not column.auto_width:
                continue
            widest = max((cell_len(cells[n]) for cells in self._drawn.values()), default=0)
            if widest > column.content_width:
                column.content_width = widest
                self.refresh()
