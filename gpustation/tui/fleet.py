"""The fleet view: every GPU of several hosts in one table, read over ssh.

``gpustation --host A --host B`` (or ``--fleet`` for the hosts in config.toml)
opens :class:`FleetApp`. Each host is streamed by a thread of
:class:`~gpustation.telemetry.fleet.Fleet`; the screens here only read the
latest in-memory state on a timer, so a slow or dead host never blocks the UI.

* :class:`FleetScreen`: one row per GPU across hosts (or one row with the
  error for a host that is down), sortable with ``s``/``r`` or a click on a
  column header. Enter opens the host.
* :class:`HostScreen`: one host's dashboard (GPU cards, history graph, host
  pane, processes) fed by that host's stream, using the dashboard's widgets.
  It is read-only: processes on another host are not signalled from here.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from gpustation.telemetry.fleet import (
    COLUMNS,
    Fleet,
    FleetRow,
    is_limiting,
    load_fleet_config,
    row_cells,
    sort_rows,
)
from gpustation.telemetry.history import METRIC_KEYS, METRICS, History
from gpustation.telemetry.model import Snapshot
from gpustation.telemetry.remote import UP
from gpustation.tui.widgets import GpuCard, HistoryGraph, HostPane, ProcessTable, process_rows

_NUMERIC = {"temp", "power", "util", "vram"}
#: columns whose natural first order is "biggest first"
_DESCENDING_FIRST = _NUMERIC | {"throttle"}


def _styled(row: FleetRow, key: str, text: str) -> Text:
    style = ""
    if key == "status" and row.status != "up":
        style = "bold red" if row.gpu is None else "yellow"
    elif key == "throttle" and is_limiting(row):
        style = "bold red"
    elif key == "run" and row.gpu is None:
        style = "red"
    elif key == "host" and row.simulated:
        style = "yellow"
    return Text(text, style=style, no_wrap=True, overflow="ellipsis")


class FleetScreen(Screen[None]):
    """One row per GPU across hosts; sortable; Enter drills into a host."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "cycle_sort", "Sort", id="fleet.sort"),
        Binding("r", "reverse_sort", "Reverse", id="fleet.reverse"),
        Binding("enter", "open_host", "Open host", id="fleet.open", show=True),
    ]

    DEFAULT_CSS = """
    FleetScreen #fleet-title { height: 1; background: $panel; }
    FleetScreen #fleet-table { height: 1fr; }
    """

    def __init__(self, fleet: Fleet, refresh_s: float = 1.0) -> None:
        super().__init__()
        self.fleet = fleet
        self.refresh_s = refresh_s
        self.sort_key = "host"
        self.descending = False
        self.rows: list[FleetRow] = []
        self._shown_keys: list[str] = []
        self._shown_cells: dict[str, dict[str, str]] = {}
        self.histories: dict[str, History] = {h: History() for h in fleet.hosts}
        self._history_time: dict[str, float] = {}
        self._signature_shown: tuple[object, ...] | None = None
        self._title_shown: Text | None = None
        self._sort_shown: tuple[str, bool] | None = None
        self.ticks = 0

    def compose(self) -> ComposeResult:
        yield Static(id="fleet-title")
        table: DataTable[Text] = DataTable(id="fleet-table", cursor_type="row", zebra_stripes=True)
        yield table
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, title in COLUMNS:
            table.add_column(title, key=key)
        self.refresh_rows()
        # Reading in-memory state is cheap; poll a little faster than the
        # hosts send so a new snapshot shows up within half an interval.
        self.set_interval(max(0.2, min(1.0, self.refresh_s / 2)), self.refresh_rows)

    # ---- data ----------------------------------------------------------------
    def _feed_histories(self) -> None:
        for st in self.fleet.states():
            snap = st.snapshot
            if snap is None or self._history_time.get(st.name) == snap.time:
                continue
            self._history_time[st.name] = snap.time
            self.histories[st.name].add(snap)

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
        """Re-read the fleet's state and update only the cells that changed."""
        self.ticks += 1
        signature = self._signature()
        if signature == self._signature_shown and not force:
            return
        self._signature_shown = signature
        self._feed_histories()
        self.rows = sort_rows(self.fleet.rows(), self.sort_key, self.descending)
        table = self.query_one(DataTable)
        keys = [r.key for r in self.rows]
        cells = {r.key: row_cells(r) for r in self.rows}
        if keys != self._shown_keys:
            selected = self.selected_row()
            table.clear()
            for row in self.rows:
                table.add_row(
                    *(_styled(row, k, cells[row.key][k]) for k, _ in COLUMNS), key=row.key
                )
            if selected is not None and selected.key in keys:
                table.move_cursor(row=keys.index(selected.key), animate=False)
        else:
            for row in self.rows:
                old = self._shown_cells.get(row.key, {})
                for k, _ in COLUMNS:
                    if old.get(k) != cells[row.key][k]:
                        table.update_cell(row.key, k, _styled(row, k, cells[row.key][k]))
        self._shown_keys = keys
        self._shown_cells = cells
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
        if text != self._title_shown:
            self._title_shown = text
            self.query_one("#fleet-title", Static).update(text)
        if self._sort_shown == (self.sort_key, self.descending):
            return
        self._sort_shown = (self.sort_key, self.descending)
        table = self.query_one(DataTable)
        for key, label in COLUMNS:
            col = table.columns.get(key)  # type: ignore[call-overload]
            if col is not None:
                col.label = Text(label + (arrow if key == self.sort_key else ""))
        table.refresh()

    def selected_row(self) -> FleetRow | None:
        table = self.query_one(DataTable)
        n = table.cursor_row
        if not self._shown_keys or not 0 <= n < len(self._shown_keys):
            return None
        key = self._shown_keys[n]
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

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        key = str(event.column_key.value)
        if key == self.sort_key:
            self.sort_by(key, not self.descending)
        else:
            self.sort_by(key)

    # ---- drill-down ------------------------------------------------------------
    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_host()

    def action_open_host(self) -> None:
        row = self.selected_row()
        if row is None:
            return
        self.app.push_screen(HostScreen(self.fleet, row.host, self.histories[row.host]))


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
    """

    def __init__(self, fleet: Fleet, host: str, history: History) -> None:
        super().__init__()
        self.fleet = fleet
        self.host = host
        self.history = history
        self.metric = "util"
        self._cards: dict[int, GpuCard] = {}
        self._shown_time: float | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="host-banner")
        with VerticalScroll(id="host-body"):
            yield VerticalScroll(id="host-cards")
            with Horizontal(id="host-middle"):
                yield HistoryGraph(self.history, id="host-graph")
                yield HostPane(id="host-pane")
            yield ProcessTable(id="host-procs")
        yield Footer()

    def on_mount(self) -> None:
        self.refresh_host()
        self.set_interval(0.5, self.refresh_host)

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

    def __init__(
        self,
        hosts: Sequence[str],
        args: argparse.Namespace | None = None,
        fleet: Fleet | None = None,
    ) -> None:
        super().__init__()
        args = args or argparse.Namespace()
        refresh = float(getattr(args, "refresh", 1.0) or 1.0)
        if fleet is None:
            config = load_fleet_config()
            fleet = Fleet(
                list(hosts),
                interval=refresh,
                remote_command=config.remote_command,
                ssh_config=getattr(args, "ssh_config", None) or config.ssh_config,
            )
        self.fleet = fleet
        self.refresh_s = refresh
        self._started = False

    def on_mount(self) -> None:
        if not self._started:
            self.fleet.start()
            self._started = True
        self.push_screen(FleetScreen(self.fleet, self.refresh_s))

    def on_unmount(self) -> None:
        self.fleet.close()


def run_fleet(hosts: Sequence[str], args: argparse.Namespace) -> int:
    """Open the fleet view for ``hosts`` and close every ssh stream on exit."""
    app = FleetApp(hosts, args)
    try:
        return int(app.run() or 0)
    finally:
        app.fleet.close()
