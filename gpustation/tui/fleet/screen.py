"""The fleet view: every GPU of several hosts in one table, read over ssh.

``gpustation --host A --host B`` (or ``--fleet`` for the hosts in config.toml)
opens :class:`FleetApp`. Each host is streamed by a thread of
:class:`~gpustation.fleet.fleet.Fleet`; the screens here only read the
latest in-memory state on a timer, so a slow or dead host never blocks the UI.

* :class:`FleetScreen`: one row per GPU across hosts (or one row with the
  error for a host that is down), sortable with ``s``/``r`` or a click on a
  column header. Enter opens the host.
* :class:`HostScreen`: one host's dashboard (GPU cards, history graph, host
  pane, processes) fed by that host's stream, using the dashboard's widgets.
  It is read-only: processes on another host are not signalled from here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.geometry import Region, Size
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Static

from gpustation.fleet.fleet import (
    COLUMNS,
    Fleet,
    FleetRow,
    FleetSource,
    cell_style,
    load_fleet_config,
    row_cells,
    sort_rows,
)
from gpustation.fleet.ssh import UP
from gpustation.telemetry.model import Snapshot
from gpustation.telemetry.rings import METRIC_KEYS, METRICS, History
from gpustation.tui.footer import KeysFooter
from gpustation.tui.keys import KeymapConfig, apply_keymap
from gpustation.tui.procrows import process_rows
from gpustation.tui.widgets import (
    GpuCard,
    HistoryGraph,
    HostPane,
    ProcessTable,
    set_size_classes,
)

_NUMERIC = {"temp", "power", "util", "vram"}
#: columns whose natural first order is "biggest first"
_DESCENDING_FIRST = _NUMERIC | {"throttle"}


def _styled(row: FleetRow, key: str, text: str) -> Text:
    return Text(text, style=cell_style(row, key), no_wrap=True, overflow="ellipsis")


_RIGHT = {"temp", "power", "util", "vram"}
_MAX_WIDTH = {"host": 28, "status": 14, "gpu": 28, "throttle": 24}
_CURSOR = Style(reverse=True)
_HEADER = Style(bold=True)


class FleetTable(ScrollView, can_focus=True):
    """The fleet's rows, drawn line by line.

    Textual's DataTable re-renders every cell after any ``update_cell``; with
    a dozen hosts updating at different moments that is a full table render
    every tick. This widget caches one Strip per row and repaints only the
    lines whose text changed, so a quiet fleet costs next to nothing.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor(-1)", "Up", show=False, id="fleet.up"),
        Binding("down", "cursor(1)", "Down", show=False, id="fleet.down"),
        Binding("home", "cursor_to(0)", "First", show=False, id="fleet.first"),
        Binding("end", "cursor_to(-1)", "Last", show=False, id="fleet.last"),
        Binding("enter", "open", "Open host", id="fleet.open"),
    ]

    class HeaderClicked(Message):
        def __init__(self, column: str) -> None:
            super().__init__()
            self.column = column

    class Opened(Message):
        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(self, columns: Sequence[tuple[str, str]], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.columns = list(columns)
        self.labels = {k: t for k, t in columns}
        self.keys: list[str] = []
        self.cells: dict[str, list[Text]] = {}
        self.widths: list[int] = [len(t) for _, t in columns]
        self.cursor = 0
        self._strips: dict[tuple[str, bool], tuple[tuple[str, ...], Strip]] = {}
        self._header: Strip | None = None

    # -- data --------------------------------------------------------------
    def set_rows(self, rows: Sequence[tuple[str, list[Text]]]) -> None:
        """Show ``rows`` (key, one Text per column); repaint what changed."""
        cursor_key = self.cursor_key
        keys = [k for k, _ in rows]
        new = dict(rows)
        widths = []
        for n, (key, title) in enumerate(self.columns):
            longest = max([len(title) + 2, *(new[k][n].cell_len for k in keys)])
            widths.append(min(longest, _MAX_WIDTH.get(key, 1000)))
        relayout = widths != self.widths or keys != self.keys
        changed = [i for i, k in enumerate(keys) if self.cells.get(k) != new[k]]
        self.keys, self.cells, self.widths = keys, new, widths
        if cursor_key in keys:
            self.cursor = keys.index(cursor_key)
        self.cursor = max(0, min(self.cursor, len(keys) - 1))
        self.virtual_size = Size(sum(widths) + 2 * len(widths), len(keys) + 1)
        if relayout:
            self._strips.clear()
            self._header = None
            self.refresh()
            return
        top = self.scroll_offset.y
        for i in changed:
            self.refresh(Region(0, i + 1 - top, self.size.width, 1))

    def set_header(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self._header = None
        self.refresh(Region(0, 0, self.size.width, 1))

    @property
    def cursor_key(self) -> str | None:
        return self.keys[self.cursor] if 0 <= self.cursor < len(self.keys) else None

    def row_text(self, key: str) -> list[str]:
        """The plain text of each cell of a row (for tests and scripts)."""
        return [t.plain for t in self.cells[key]]

    # -- drawing -----------------------------------------------------------
    def _line(self, texts: Sequence[Text], base: Style | None) -> Strip:
        line = Text(no_wrap=True, overflow="ellipsis")
        for n, ((key, _), text) in enumerate(zip(self.columns, texts, strict=True)):
            width = self.widths[n]
            cell = text.copy()
            cell.truncate(width, overflow="ellipsis")
            pad = width - cell.cell_len
            if key in _RIGHT:
                line.append(" " * pad)
                line.append_text(cell)
            else:
                line.append_text(cell)
                line.append(" " * pad)
            line.append("  ")
        if base is not None:
            line.stylize(base)
        segments = list(line.render(self.app.console))
        return Strip(segments, line.cell_len)

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        if y == 0:
            if self._header is None:
                self._header = self._line([Text(self.labels[k]) for k, _ in self.columns], _HEADER)
            strip = self._header
        else:
            index = y - 1 + scroll_y
            if index >= len(self.keys):
                return Strip([Segment(" " * width)], width)
            key = self.keys[index]
            selected = index == self.cursor
            texts = self.cells[key]
            plain = tuple(t.plain for t in texts)
            cached = self._strips.get((key, selected))
            if cached is None or cached[0] != plain:
                cached = (plain, self._line(texts, _CURSOR if selected else None))
                self._strips[(key, selected)] = cached
            strip = cached[1]
        return strip.crop_extend(scroll_x, scroll_x + width, None)

    # -- interaction ---------------------------------------------------------
    def _move(self, index: int) -> None:
        if not self.keys:
            return
        old = self.cursor
        self.cursor = max(0, min(index, len(self.keys) - 1))
        top = self.scroll_offset.y
        for i in {old, self.cursor}:
            self.refresh(Region(0, i + 1 - top, self.size.width, 1))
        height = max(1, self.size.height - 1)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + height:
            self.scroll_to(y=self.cursor - height + 1, animate=False)

    def action_cursor(self, step: int) -> None:
        self._move(self.cursor + step)

    def action_cursor_to(self, index: int) -> None:
        self._move(index if index >= 0 else len(self.keys) - 1)

    def action_open(self) -> None:
        if self.cursor_key is not None:
            self.post_message(self.Opened(self.cursor_key))

    def on_click(self, event: events.Click) -> None:
        x = event.x + self.scroll_offset.x
        if event.y == 0:
            edge = 0
            for (key, _), width in zip(self.columns, self.widths, strict=True):
                edge += width + 2
                if x < edge:
                    self.post_message(self.HeaderClicked(key))
                    return
            return
        index = event.y - 1 + self.scroll_offset.y
        if index < len(self.keys):
            if index == self.cursor and event.chain >= 2:
                self.action_open()
            self._move(index)


class FleetScreen(Screen[None]):
    """One row per GPU across hosts; sortable; Enter drills into a host."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "cycle_sort", "Sort", id="fleet.sort"),
        Binding("r", "reverse_sort", "Reverse", id="fleet.reverse"),
    ]

    DEFAULT_CSS = """
    FleetScreen #fleet-title { height: auto; background: $panel; }
    FleetScreen #fleet-table { height: 1fr; }
    """

    def __init__(self, fleet: FleetSource, refresh_s: float = 1.0) -> None:
        super().__init__()
        self.fleet: FleetSource = fleet
        self.refresh_s = refresh_s
        self.sort_key = "host"
        self.descending = False
        self.rows: list[FleetRow] = []
        self.histories: dict[str, History] = {h: History() for h in fleet.hosts}
        self._history_time: dict[str, float] = {}
        self._signature_shown: tuple[object, ...] | None = None
        self._title_shown: Text | None = None
        self._sort_shown: tuple[str, bool] | None = None
        self.ticks = 0

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-title")
        yield FleetTable(COLUMNS, id="fleet-table")
        yield KeysFooter()

    @property
    def table(self) -> FleetTable:
        return self.query_one(FleetTable)

    def on_resize(self, event: events.Resize) -> None:
        set_size_classes(self, event.size)
        if self.is_mounted:
            self._update_title()

    def on_mount(self) -> None:
        set_size_classes(self, self.app.size)
        self.refresh_rows()
        self.table.focus()
        # A tick that finds nothing new costs a tuple comparison, so poll at a
        # quarter of the hosts' interval: a snapshot shows up within that.
        self.set_interval(max(0.1, min(1.0, self.refresh_s / 4)), self.refresh_rows)

    # ---- data ----------------------------------------------------------------
    def _feed_histories(self) -> None:
        for st in self.fleet.states():
            snap = st.snapshot
            if snap is None or self._history_time.get(st.name) == snap.time:
                continue
            self._history_time[st.name] = snap.time
            # a Prometheus fleet finds hosts as they appear
            self.histories.setdefault(st.name, History()).add(snap)

    def _signature(self) -> tuple[object, ...]:
        """What the rows depend on; equal signatures mean nothing to redraw."""
        states = self.fleet.states()
        now = time.time()
        # Ages and retry countdowns are shown in whole seconds: they need a
        # redraw each second only while some host is stale or down.
        ticking = any(st.state != UP or st.stale(now) for st in states)
        return (
            self.sort_key,
            self.descending,
            int(now) if ticking else None,
            *((st.state, st.received_at, st.error, st.retry_at) for st in states),
        )

    def refresh_rows(self, force: bool = False) -> None:
        """Re-read the fleet's state and repaint the rows that changed."""
        self.ticks += 1
        signature = self._signature()
        if signature == self._signature_shown and not force:
            return
        self._signature_shown = signature
        self._feed_histories()
        self.rows = sort_rows(self.fleet.rows(), self.sort_key, self.descending)
        lines = []
        for row in self.rows:
            cells = row_cells(row)
            lines.append((row.key, [_styled(row, k, cells[k]) for k, _ in COLUMNS]))
        self.table.set_rows(lines)
        self._update_title()

    def _update_title(self) -> None:
        states = self.fleet.states()
        up = sum(1 for st in states if st.state == UP)
        gpus = sum(1 for r in self.rows if r.gpu is not None)
        arrow = "▼" if self.descending else "▲"
        title = dict(COLUMNS)[self.sort_key]
        text = Text(f" fleet: {up}/{len(states)} hosts up, {gpus} GPUs", style="bold")
        text.append(f"   sorted by {title} {arrow}   Enter: open host", style="dim")
        if any(r.simulated for r in self.rows):
            text.append("  SIMULATED ", style="bold black on yellow")
        if self.table.virtual_size.width > self.size.width:
            # The error of a host that is down sits in the last column, off screen now.
            for row in self.rows:
                if row.gpu is None and row.error:
                    text.append(f"\n {row.host} {row.status}: {row_cells(row)['run']}", "red")
        if text != self._title_shown:
            self._title_shown = text
            self.query_one("#fleet-title", Static).update(text)
        if self._sort_shown != (self.sort_key, self.descending):
            self._sort_shown = (self.sort_key, self.descending)
            self.table.set_header(
                {k: f"{label} {arrow}" if k == self.sort_key else label for k, label in COLUMNS}
            )

    def selected_row(self) -> FleetRow | None:
        key = self.table.cursor_key
        return next((r for r in self.rows if r.key == key), None)

    # ---- sorting -------------------------------------------------------------
    def sort_by(self, key: str, descending: bool | None = None) -> None:
        if descending is None:
            descending = key in _DESCENDING_FIRST
        self.sort_key, self.descending = key, descending
        self.refresh_rows()

    def action_cycle_sort(self) -> None:
        keys = [k for k, _ in COLUMNS]
        self.sort_by(keys[(keys.index(self.sort_key) + 1) % len(keys)])

    def action_reverse_sort(self) -> None:
        self.sort_by(self.sort_key, not self.descending)

    def on_fleet_table_header_clicked(self, event: FleetTable.HeaderClicked) -> None:
        if event.column == self.sort_key:
            self.sort_by(event.column, not self.descending)
        else:
            self.sort_by(event.column)

    # ---- drill-down ------------------------------------------------------------
    def on_fleet_table_opened(self, event: FleetTable.Opened) -> None:
        self.open_host(event.key.rsplit("#", 1)[0])

    def open_host(self, host: str) -> None:
        history = self.histories.setdefault(host, History())
        self.app.push_screen(HostScreen(self.fleet, host, history))


class HostScreen(Screen[None]):
    """One host's dashboard, fed by its stream; Escape goes back to the fleet."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Fleet", id="fleet.host.back"),
        Binding("m", "cycle_metric", "Metric", id="fleet.host.metric"),
    ]

    DEFAULT_CSS = """
    HostScreen #host-banner { height: 1; background: $panel; }
    HostScreen #host-body { height: 1fr; }
    HostScreen .gpu-card { border: round $primary-darken-1; padding: 0 1; height: 9; }
    HostScreen #host-cards { height: auto; }
    HostScreen #host-middle { height: auto; }
    HostScreen #host-graph { width: 1fr; height: auto; padding: 0 1; }
    HostScreen #host-pane { width: 38; height: auto; padding: 0 1; }
    HostScreen #host-procs { height: auto; max-height: 16; }
    HostScreen #host-procs DataTable { height: auto; max-height: 14; }
    HostScreen.-narrow #host-middle { layout: vertical; }
    HostScreen.-narrow #host-pane { width: 100%; }
    """

    def __init__(self, fleet: FleetSource, host: str, history: History) -> None:
        super().__init__()
        self.fleet = fleet
        self.host = host
        self.history = history
        self.metric = "util"
        self._cards: dict[int, GpuCard] = {}
        self._shown_time: float | None = None
        self._own_history = False

    def compose(self) -> ComposeResult:
        yield Static(id="host-banner")
        with VerticalScroll(id="host-body"):
            yield VerticalScroll(id="host-cards")
            with Horizontal(id="host-middle"):
                yield HistoryGraph(self.history, id="host-graph")
                yield HostPane(id="host-pane")
            yield ProcessTable(id="host-procs")
        yield KeysFooter()

    def on_resize(self, event: events.Resize) -> None:
        set_size_classes(self, event.size)

    def on_mount(self) -> None:
        set_size_classes(self, self.app.size)
        self.refresh_host()
        self.set_interval(0.5, self.refresh_host)
        if callable(getattr(self.fleet, "history", None)):  # a source that keeps history
            self.run_worker(self._load_history, thread=True, exit_on_error=False)

    def _load_history(self) -> None:
        history = self.fleet.history(self.host)  # type: ignore[attr-defined]
        if len(history):
            self.app.call_from_thread(self._use_history, history)

    def _use_history(self, history: History) -> None:
        self.history = history
        self._own_history = True  # fed here from now on: the fleet screen feeds its own
        self.query_one(HistoryGraph).history = history
        self._shown_time = None
        self.refresh_host()

    def refresh_host(self) -> None:
        st = self.fleet.state(self.host)
        banner = Text(f" {self.host}", style="bold")
        snap = st.snapshot
        if snap is not None and snap.simulated:
            banner.append("  SIMULATED ", style="bold black on yellow")
        if st.state == UP and snap is not None:
            age = st.age_s() or 0.0
            stale = st.stale()
            banner.append(
                f"  {snap.hostname}  driver {snap.driver_version or 'n/a'}  updated {age:.0f}s ago",
                style="bold red" if stale else "",
            )
        else:
            banner.append(f"  {st.state}: {st.error or 'waiting for the first snapshot'}", "red")
        self.query_one("#host-banner", Static).update(banner)
        if snap is not None and snap.time != self._shown_time:
            self._shown_time = snap.time
            if self._own_history and all(
                snap.time > (self.history.times(g.index) or [0])[-1] for g in snap.gpus
            ):
                self.history.add(snap)
            self.show_snapshot(snap)

    def show_snapshot(self, snap: Snapshot) -> None:
        cards = self.query_one("#host-cards", VerticalScroll)
        for gpu in snap.gpus:
            card = self._cards.get(gpu.index)
            if card is None:
                card = self._cards[gpu.index] = GpuCard(gpu.index)
                cards.mount(card)
            card.set_sample(gpu)
        graph = self.query_one(HistoryGraph)
        graph.gpus = [g.index for g in snap.gpus]
        graph.metric = self.metric
        graph.border_title = METRICS[self.metric].label if self.metric in METRICS else None
        graph.redraw()
        self.query_one(HostPane).set_snapshot(snap)
        self.query_one(ProcessTable).set_rows(process_rows(snap, {}))

    def action_cycle_metric(self) -> None:
        keys = list(METRIC_KEYS)
        self.metric = keys[(keys.index(self.metric) + 1) % len(keys)]
        self._shown_time = None
        self.refresh_host()


class FleetApp(App[int]):
    """``gpustation --host ...``: the fleet screen, with drill-down into each host."""

    TITLE = "gpustation fleet"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "quit", "Quit", id="app.quit")]

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Every toast as plain text: messages carry run names, notes, host names and
        command lines, and a ``[`` in one must show, not be read as markup."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=False)

    def __init__(
        self,
        hosts: Sequence[str],
        refresh_s: float = 1.0,
        ssh_config: str | None = None,
        fleet: FleetSource | None = None,
        keymap: KeymapConfig | None = None,
    ) -> None:
        super().__init__()
        #: the [keys] table of config.toml, applied on mount
        self.keymap_config = keymap if keymap is not None else KeymapConfig()
        refresh = refresh_s
        if fleet is None:
            config = load_fleet_config()
            # --refresh other than its default wins over [fleet] interval.
            if refresh == 1.0:
                refresh = config.interval
            fleet = Fleet(
                list(hosts),
                interval=refresh,
                remote_command=config.remote_command,
                ssh_config=ssh_config or config.ssh_config,
            )
        self.fleet: FleetSource = fleet
        self.refresh_s = refresh
        self._started = False

    def on_mount(self) -> None:
        apply_keymap(self, self.keymap_config)
        if not self._started:
            self.fleet.start()
            self._started = True
        self.push_screen(FleetScreen(self.fleet, self.refresh_s))

    def on_unmount(self) -> None:
        self.fleet.close()


def run_fleet(
    hosts: Sequence[str],
    refresh_s: float = 1.0,
    ssh_config: str | None = None,
    keymap: KeymapConfig | None = None,
) -> int:
    """Open the fleet view for ``hosts`` and close every ssh stream on exit."""
    app = FleetApp(hosts, refresh_s=refresh_s, ssh_config=ssh_config, keymap=keymap)
    try:
        return int(app.run() or 0)
    finally:
        app.fleet.close()
