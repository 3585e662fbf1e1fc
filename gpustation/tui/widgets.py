"""The dashboard's widgets. Each repaints only when its text changed.

Sizes are fixed by the stylesheet wherever possible so that a new sample
repaints a widget without a relayout of the screen: that is most of what
keeps the dashboard's CPU use low.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Input, Label

from gpustation.telemetry.model import GpuSample, Snapshot
from gpustation.telemetry.rings import History
from gpustation.tui import cards, render
from gpustation.tui.linecache import KeepsLines
from gpustation.tui.procrows import COLUMNS, DESCENDING, SORT_KEYS, WIDTHS, ProcRow


class Rows(KeepsLines, Vertical):
    """A ``Vertical`` that keeps its lines (see :class:`KeepsLines`)."""


class Columns(KeepsLines, Horizontal):
    """A ``Horizontal`` that keeps its lines."""


class Tiles(KeepsLines, Grid):
    """A ``Grid`` that keeps its lines."""


class ScrollRows(KeepsLines, VerticalScroll):
    """A ``VerticalScroll`` that keeps its lines."""


class Caption(KeepsLines, Label):
    """A ``Label`` that keeps its lines."""


#: Terminal sizes where the screens change their layout: each screen gets the
#: classes ``-narrow`` (fewer columns than NARROW_W), ``-wide`` (WIDE_W or more),
#: ``-short`` (fewer rows than SHORT_H) and ``-tall`` (TALL_H or more), and its
#: stylesheet says what changes; the sizes themselves stay in CSS (fr, max-width).
NARROW_W, WIDE_W = 100, 160
SHORT_H, TALL_H = 32, 56


def set_size_classes(node: Widget, size: Size) -> None:
    """Give ``node`` (a screen) the size classes for a terminal of ``size``."""
    if not size.width:
        return
    node.set_class(size.width < NARROW_W, "-narrow")
    node.set_class(size.width >= WIDE_W, "-wide")
    node.set_class(size.height < SHORT_H, "-short")
    node.set_class(size.height >= TALL_H, "-tall")


class LiveText(KeepsLines, Widget):
    """Text that repaints only the lines that changed.

    A new sample usually changes a few numbers: comparing line by line and
    refreshing only those lines keeps the compositor's work per tick small
    (a whole-widget ``Static.update`` re-wraps and repaints everything).
    """

    DEFAULT_CSS = "LiveText { height: auto; }"

    def __init__(self, content: Text | str = "", wrap: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: wrap long lines at the widget's width (for prose; costs a little more)
        self.wrap = wrap
        self._shown: Text | None = None
        self._lines: list[Text] = []
        self._strips: dict[int, Strip] = {}
        # The widget's own style, applied to every line: Textual computes it by
        # walking the ancestors, so it is kept until the styles change.
        self._base_style: Style | None = None
        if content:
            self.show(content)

    def show(self, content: Text | str, layout: bool = False) -> bool:
        """Show ``content``; return whether anything had to be repainted."""
        text = Text(content) if isinstance(content, str) else content
        if self._shown is not None and text == self._shown:
            return False
        self._shown = text
        width = self.content_region.width
        if self.wrap and width:
            lines = list(text.wrap(self.app.console, width, overflow="fold"))
        else:
            lines = list(text.split("\n", allow_blank=True))
        old = self._lines
        self._lines = lines
        if self.wrap and len(lines) != len(old):
            # Wrapped text sets its own height: a new width can add lines.
            self.styles.height = max(1, len(lines))
            layout = True
        if layout or not self.is_mounted:
            self._strips.clear()
            self.refresh(layout=layout)
            return True
        if len(lines) != len(old) and self.styles.height is not None and self.styles.height.is_auto:
            self.refresh(layout=True)  # an auto-height widget grew or shrank
        changed = [
            y
            for y in range(max(len(lines), len(old)))
            if y >= len(lines) or y >= len(old) or lines[y] != old[y]
        ]
        for y in changed:
            self._strips.pop(y, None)
        if changed:
            self.refresh(*(Region(0, y, width, 1) for y in changed))
        return True

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines)

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return max((line.cell_len for line in self._lines), default=0)

    def render_line(self, y: int) -> Strip:
        width = self.content_region.width
        strip = self._strips.get(y)
        if strip is None or strip.cell_length != width:
            if y < len(self._lines):
                line = self._lines[y]
                segments = list(line.render(self.app.console))
                strip = Strip(segments, line.cell_len)
            else:
                strip = Strip.blank(0)
            style = self._base_style
            if style is None:
                style = self._base_style = self.rich_style
            strip = strip.crop_extend(0, width, None).apply_style(style)
            self._strips[y] = strip
        return strip

    def notify_style_update(self) -> None:
        # A new class, focus or theme may change the colours: draw afresh.
        super().notify_style_update()
        self._base_style = None
        self._strips.clear()

    def on_resize(self) -> None:
        self._strips.clear()
        if self.wrap and self._shown is not None:
            shown, self._shown = self._shown, None
            self.show(shown, layout=True)

    @property
    def line_count(self) -> int:
        """Lines shown (after wrapping, for a wrapping widget)."""
        return len(self._lines)

    @property
    def plain(self) -> str:
        """The text shown, without styles (handy in tests)."""
        return self._shown.plain if self._shown is not None else ""


class DrawnText(LiveText):
    """Live text drawn from data by :meth:`redraw`: drawn again for a new size,
    and when focus comes or goes (``_focused``; focus can change what is drawn)."""

    # Our own flag: on_focus runs before Textual sets has_focus. (A focused
    # card shows the power limit's default and range; the process list, its cursor.)
    _focused = False

    def redraw(self) -> None:  # pragma: no cover - overridden
        pass

    def on_focus(self) -> None:
        self._focused = True
        self.redraw()

    def on_blur(self) -> None:
        self._focused = False  # focus shows the power limit's default and range
        self.redraw()

    def on_resize(self) -> None:
        super().on_resize()
        self._shown = None
        self.redraw()


class GpuCard(DrawnText):
    """One GPU: a full card, or two lines when space is short."""

    can_focus = True

    def __init__(self, index: int, **kwargs: Any) -> None:
        super().__init__(id=f"gpu-{index}", classes="gpu-card", **kwargs)
        self.index = index
        self.sample: GpuSample | None = None
        self.compact = False

    def set_sample(self, sample: GpuSample | None) -> None:
        self.sample = sample
        self.redraw()

    def redraw(self) -> None:
        g = self.sample
        if g is None:
            self.show(f"GPU {self.index}: waiting for the first sample")
            return
        width = self.content_region.width or 78
        if self.compact:
            self.show(cards.compact_text(g, width, focused=self._focused))
        else:
            self.show(cards.card_text(g, width, focused=self._focused))
            if self.border_title is not None:
                self.border_title = None  # setting it repaints the whole card


class HistoryGraph(DrawnText):
    """Block-character graphs of one metric, one per GPU, from the ring buffers."""

    def __init__(self, history: History, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history = history
        self.metric = "util"
        self.gpus: list[int] = []
        self.rows_per_gpu = 2
        self.window_s = 600.0

    def redraw(self) -> None:
        width = self.content_region.width
        if not width or not self.gpus:
            return
        self.show(
            render.history_text(
                self.history, self.gpus, self.metric, width, self.rows_per_gpu, self.window_s
            )
        )


class HostPane(DrawnText):
    def set_snapshot(self, snap: Snapshot) -> None:
        self._snap = snap
        self.redraw()

    def redraw(self) -> None:
        snap = getattr(self, "_snap", None)
        if snap is None:
            return
        self.show(render.host_text(snap.host, snap.hostname, self.content_region.width or 30))


class ProcList(DrawnText):
    """The process rows as text: a header, one line per process, a cursor.

    Drawn with :class:`LiveText`, so a tick that changes one process's CPU %
    repaints that line only (a DataTable rebuilt every tick doubled the
    dashboard's CPU use).
    """

    can_focus = True
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(-1)", "Up", show=False, id="procs.up"),
        Binding("down", "move(1)", "Down", show=False, id="procs.down"),
        Binding("pageup", "move(-10)", "Page up", show=False, id="procs.pageup"),
        Binding("pagedown", "move(10)", "Page down", show=False, id="procs.pagedown"),
        Binding("home", "move(-100000)", "First", show=False, id="procs.home"),
        Binding("end", "move(100000)", "Last", show=False, id="procs.end"),
    ]
    #: at most this many rows are shown; the cursor scrolls through the rest
    MAX_ROWS = 20

    def __init__(self, owner: ProcessTable, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.owner = owner
        self.rows: list[ProcRow] = []
        self.cursor = 0
        self._offset = 0
        self._empty = "no GPU processes"

    def set_rows(self, rows: list[ProcRow], empty: str) -> None:
        selected = self.selected()
        old_height = max(1, min(len(self.rows), self.MAX_ROWS)) + 1
        self.rows = rows
        self._empty = empty
        if selected is not None:
            for n, r in enumerate(rows):
                if r.key == selected.key:
                    self.cursor = n
                    break
        self.cursor = max(0, min(self.cursor, len(rows) - 1))
        height = max(1, min(len(rows), self.MAX_ROWS)) + 1
        if height != old_height or self.styles.height is None:
            self.styles.height = height
        self.redraw()

    def selected(self) -> ProcRow | None:
        if 0 <= self.cursor < len(self.rows):
            return self.rows[self.cursor]
        return None

    def header_text(self) -> Text:
        arrow = "▼" if self.owner.sort_reverse else "▲"
        t = Text(style="bold")
        for (label, key), w in zip(COLUMNS, (*WIDTHS, 0), strict=True):
            cell = label + (arrow if key == self.owner.sort_key else "")
            t.append(
                f"{cell:<{w}} " if w else cell,
                style="bold reverse" if key == self.owner.sort_key else "bold",
            )
        return t

    def redraw(self) -> None:
        width = self.content_region.width or 120
        # keep the cursor in view
        if self.cursor < self._offset:
            self._offset = self.cursor
        elif self.cursor >= self._offset + self.MAX_ROWS:
            self._offset = self.cursor - self.MAX_ROWS + 1
        t = self.header_text()
        if not self.rows:
            t.append(f"\n{self._empty}", style="dim")
        for n, row in enumerate(self.rows[self._offset : self._offset + self.MAX_ROWS]):
            cells = row.cells()
            line = (
                " ".join(f"{c:<{w}}" for c, w in zip(cells[:-1], WIDTHS, strict=True))
                + " "
                + cells[-1]
            )
            line = line[:width].ljust(width)
            if self._offset + n == self.cursor:
                style = "reverse" if self._focused else "on grey23"
            else:
                style = "yellow" if row.holder else ""
            t.append("\n")
            t.append(line, style=style)
        self.show(t)

    def action_move(self, delta: int) -> None:
        if self.rows:
            self.cursor = max(0, min(len(self.rows) - 1, self.cursor + delta))
            self.redraw()

    def on_click(self, event: events.Click) -> None:
        if event.y == 0:
            # a click on the header sorts by that column (again: reverses)
            x = 0
            for (_, key), w in zip(COLUMNS, (*WIDTHS, 10_000), strict=True):
                if event.x < x + w + 1:
                    self.owner.sort_by(key)
                    return
                x += w + 1
            return
        row = self._offset + event.y - 1
        if 0 <= row < len(self.rows):
            self.cursor = row
            self.redraw()


class ProcessTable(KeepsLines, Vertical):
    """GPU processes: sortable (``s`` or a click on a header), filterable (``/``)."""

    DEFAULT_CSS = "ProcessTable { height: auto; } ProcessTable > ProcList { height: 2; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sort_key = "gpu_mem"
        self.sort_reverse = True
        self.filter_text = ""
        self._all: list[ProcRow] = []
        self._shown_rows: list[ProcRow] | None = None

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter: pid, user or command (Esc to close)", id="proc-filter")
        yield ProcList(self, id="proc-table")
        yield LiveText(id="proc-notes", wrap=True)

    def on_mount(self) -> None:
        self.query_one(Input).display = False
        self.query_one("#proc-notes", LiveText).display = False
        self._render_rows()

    def set_notes(self, notes: Text) -> None:
        """Lines under the table (VRAM no listed process holds); hidden when empty."""
        box = self.query_one("#proc-notes", LiveText)
        shown = bool(notes.plain)
        if box.display != shown:
            box.display = shown
        box.show(notes)

    @property
    def table(self) -> ProcList:
        return self.query_one(ProcList)

    def set_rows(self, rows: list[ProcRow]) -> None:
        self._all = rows
        self._render_rows()

    def visible_rows(self) -> list[ProcRow]:
        needle = self.filter_text.lower()
        rows = [
            r
            for r in self._all
            if not needle
            or needle in str(r.pid)
            or needle in r.user.lower()
            or needle in r.command.lower()
        ]
        rows.sort(key=SORT_KEYS[self.sort_key], reverse=self.sort_reverse)  # type: ignore[arg-type]
        return rows

    def _render_rows(self) -> None:
        if not self.is_mounted:
            return
        rows = self.visible_rows()
        if rows == self._shown_rows:
            return  # nothing changed: no repaint
        self._shown_rows = rows
        self.table.set_rows(rows, "no GPU processes" if not self._all else "no match")

    def selected(self) -> ProcRow | None:
        return self.table.selected()

    def sort_by(self, key: str) -> None:
        """Sort by ``key``; the same key again reverses the order."""
        if key == self.sort_key:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_key = key
            self.sort_reverse = key in DESCENDING
        self._shown_rows = None
        self._render_rows()

    def cycle_sort(self) -> None:
        keys = [k for _, k in COLUMNS]
        self.sort_by(keys[(keys.index(self.sort_key) + 1) % len(keys)])

    def open_filter(self) -> None:
        box = self.query_one(Input)
        box.display = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self._render_rows()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.table.focus()

    def close_filter(self) -> None:
        box = self.query_one(Input)
        box.value = ""
        box.display = False
        self.filter_text = ""
        self._render_rows()
        self.table.focus()
