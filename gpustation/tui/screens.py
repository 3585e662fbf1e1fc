"""The dashboard's screens: main, topology, alert log and help.

A screen that shows live data implements ``show_frame(frame)``; the app calls
it on the visible screen after every sample and once when the screen becomes
visible again, so hidden screens cost nothing.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, ClassVar

from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Select

from gpustation import timefmt
from gpustation.telemetry.rings import METRIC_KEYS, METRICS
from gpustation.tui import render
from gpustation.tui.dash import Dashboard, dashboard
from gpustation.tui.footer import KeysFooter
from gpustation.tui.linecache import KeepsLines
from gpustation.tui.procrows import process_rows
from gpustation.tui.source import Frame
from gpustation.tui.widgets import (
    NARROW_W,
    Caption,
    Columns,
    GpuCard,
    HistoryGraph,
    HostPane,
    LiveText,
    ProcessTable,
    Rows,
    ScrollRows,
    Tiles,
    set_size_classes,
)


class LiveScreen(KeepsLines, Screen[None]):
    """A screen fed with frames by the app; shows the banner and status line."""

    @property
    def dash(self) -> Dashboard:
        return dashboard(self.app)

    _chrome: tuple[LiveText | None, LiveText | None] | None = None

    def show_frame(self, frame: Frame) -> None:  # pragma: no cover - overridden
        pass

    def chrome(self) -> tuple[LiveText | None, LiveText | None]:
        """The banner and status line (looked up once: queries cost per tick)."""
        if self._chrome is None:
            if not self.is_mounted:
                return None, None
            banner = self.query("#banner").results(LiveText)
            status = self.query("#status").results(LiveText)
            self._chrome = (next(banner, None), next(status, None))
        return self._chrome

    def on_mount(self) -> None:
        set_size_classes(self, self.app.size)
        self.call_after_refresh(self.on_screen_resume)

    def on_resize(self, event: events.Resize) -> None:
        set_size_classes(self, event.size)

    def on_screen_resume(self) -> None:
        set_size_classes(self, self.app.size)
        if self.dash.frame is not None:
            self.show_frame(self.dash.frame)
        self.dash.update_chrome(self)


class DashboardScreen(LiveScreen):
    """GPU cards, the history graph, the host pane and the process table."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("k", "kill", "Kill", id="dashboard.kill"),
        Binding("slash", "filter", "Filter", id="dashboard.filter"),
        Binding("s", "sort", "Sort", id="dashboard.sort"),
        Binding("S", "reverse_sort", "Reverse sort", show=False, id="dashboard.reverse_sort"),
        Binding("enter", "details", "Process details", show=False, id="dashboard.details"),
        Binding("escape", "close_filter", "Close filter", show=False, id="dashboard.close_filter"),
    ]
    #: the footer's keys, most needed first (see tui/footer.py): the refresh
    #: keys have no other place on screen; the history has its metric selector
    FOOTER_NEED = ("kill", "filter", "quit", "show_help", "slower", "faster", "cycle_metric")

    def compose(self) -> ComposeResult:
        yield LiveText(id="banner")
        with ScrollRows(id="body"):
            yield Tiles(id="cards")
            with Columns(id="middle"):
                with Rows(id="graph-pane"):
                    with Columns(id="graph-bar"):
                        yield Caption("History", id="graph-title")
                        yield Select(
                            [(METRICS[k].label, k) for k in METRIC_KEYS],
                            value=self.dash.metric,
                            allow_blank=False,
                            id="metric",
                            compact=True,
                        )
                    yield HistoryGraph(self.dash.history, id="graph")
                yield HostPane(id="host")
            yield ProcessTable(id="procs")
        yield LiveText(id="status")
        yield KeysFooter()

    def __init__(self) -> None:
        super().__init__()
        self._cards: dict[int, GpuCard] = {}
        self._layout_key: tuple[object, ...] | None = None
        self._compact_cards = False

    @property
    def shows_gpm(self) -> bool:
        """Its cards show SM, tensor and DRAM activity (full cards do, compact ones not)."""
        return not self._compact_cards

    # ---- data ----------------------------------------------------------
    def show_frame(self, frame: Frame) -> None:
        if not self.is_mounted:
            return  # the first frame can beat the first paint; resume shows it
        snap = frame.snapshot
        indices = [g.index for g in snap.gpus]
        missing = [i for i in indices if i not in self._cards]
        if missing:
            cards = [GpuCard(i) for i in missing]
            self._cards.update({c.index: c for c in cards})
            self.query_one("#cards", Tiles).mount_all(cards)
            self._layout_key = None
        if self._layout_key is None or missing:
            self.apply_layout()
        for gpu in snap.gpus:
            self._cards[gpu.index].set_sample(gpu)
        graph = self.query_one(HistoryGraph)
        graph.gpus = indices
        graph.metric = self.dash.metric
        graph.window_s = self.dash.graph_window_s
        graph.redraw()
        self.query_one(HostPane).set_snapshot(snap)
        table = self.query_one(ProcessTable)
        table.set_rows(process_rows(snap, frame.procs))
        table.set_notes(render.unowned_text(snap))

    def set_metric(self, metric: str) -> None:
        select = self.query_one("#metric", Select)
        if select.value != metric:
            select.value = metric
        graph = self.query_one(HistoryGraph)
        graph.metric = metric
        graph.redraw()

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "metric" and isinstance(event.value, str):
            self.dash.set_metric(event.value)

    # ---- layout ----------------------------------------------------------
    def on_resize(self, event: events.Resize) -> None:
        # (LiveScreen's handler runs too: Textual calls each class's own.)
        self.apply_layout()

    def relayout(self) -> None:
        """Lay the screen out again (the banner's height changed)."""
        self._layout_key = None
        self.apply_layout()

    def apply_layout(self) -> None:
        """Choose full or compact cards, columns and graph height for the size.

        Runs on resize and when the GPU count changes, never per sample.
        """
        w, h = self.size.width, self.size.height
        n = max(1, len(self._cards))
        key = (w, h, n)
        if key == self._layout_key or w == 0:
            return
        self._layout_key = key
        cols = 2 if n > 1 and w >= 150 else 1
        full_rows = math.ceil(n / cols) * 9
        compact = w < 100 or full_rows > h * 0.45
        if compact:
            cols = 2 if n > 1 and w >= 164 else 1
        cards = self.query_one("#cards", Tiles)
        cards.styles.grid_size_columns = cols
        card_h = 2 if compact else 9
        cards.styles.grid_rows = str(card_h)
        cards.styles.height = math.ceil(n / cols) * card_h
        cards.set_class(compact, "-compact")
        self._compact_cards = compact
        for card in self._cards.values():
            card.compact = compact
            card.set_class(compact, "-compact")
            card._shown = None
            card.redraw()
        host = self.query_one(HostPane)
        cores = 0
        procs = 0
        if self.dash.frame is not None:
            snap = self.dash.frame.snapshot
            cores = len(snap.host.cpu_per_core_pct)
            procs = sum(len(g.processes) for g in snap.gpus)
        narrow = w < NARROW_W
        self.query_one("#middle").set_class(narrow, "-narrow")
        host_w = w - 2 if narrow else 38
        host_h = 8 + max(0, math.ceil(cores / max(8, host_w - 8)) - 1)
        host.styles.height = host_h
        # Graph rows per GPU from the height left after the fixed parts (banner,
        # graph bar, time axis, status, footer), the cards, the host pane when it sits
        # below the graph, and a few process rows, so that the process table
        # stays on screen: between 1 and 5.
        banner = next(self.query("#banner").results(LiveText), None)
        banner_h = max(1, banner.line_count) if banner is not None else 1
        procs_h = 1 + max(1, min(procs, 4))
        below = host_h if narrow else 0
        spare = h - banner_h - 4 - cards.styles.height.value - procs_h - below  # type: ignore[union-attr]
        rows = int(max(1, min(5, spare // n - 1)))
        graph = self.query_one(HistoryGraph)
        graph.rows_per_gpu = rows
        graph.styles.height = n * (rows + 1) + 1
        self.query_one("#graph-pane").styles.height = n * (rows + 1) + 2
        graph.redraw()

    # ---- actions ---------------------------------------------------------
    def action_kill(self) -> None:
        row = self.query_one(ProcessTable).selected()
        if row is None:
            self.notify("Select a process in the table first.", severity="warning")
            return
        self.dash.confirm_kill(row)

    def action_details(self) -> None:
        row = self.query_one(ProcessTable).selected()
        if row is None:
            self.notify("Select a process in the table first.", severity="warning")
            return
        self.dash.show_process(row)

    def action_filter(self) -> None:
        self.query_one(ProcessTable).open_filter()

    def action_close_filter(self) -> None:
        self.query_one(ProcessTable).close_filter()

    def action_sort(self) -> None:
        self.query_one(ProcessTable).cycle_sort()

    def action_reverse_sort(self) -> None:
        table = self.query_one(ProcessTable)
        table.sort_by(table.sort_key)  # the same key again reverses the order


class TopologyScreen(LiveScreen):
    """The GPU-to-GPU matrix, P2P, NVLink, NUMA affinity and every PCIe link."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.show_dashboard", "Back", id="topology.back")
    ]

    def compose(self) -> ComposeResult:
        yield LiveText(id="banner")
        with ScrollRows(id="topology-body"):
            yield LiveText(id="topology", wrap=True)
        yield LiveText(id="status")
        yield KeysFooter()

    def show_frame(self, frame: Frame) -> None:
        if not self.is_mounted:
            return
        self.query_one("#topology", LiveText).show(
            render.topology_text(frame.snapshot), layout=True
        )


class AlertLogScreen(LiveScreen):
    """Every alert raised since the dashboard started, newest first."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.show_dashboard", "Back", id="alerts.back")
    ]

    def compose(self) -> ComposeResult:
        yield LiveText(id="banner")
        with ScrollRows(id="alert-body"):
            yield LiveText(id="alert-log", wrap=True)
        yield LiveText(id="status")
        yield KeysFooter()

    def show_frame(self, frame: Frame) -> None:
        if not self.is_mounted:
            return
        log = sorted([*self.dash.alerts.log, *self.dash.alerts.notes], key=lambda a: a.time)
        t = Text()
        if not log:
            t.append("No alerts so far.", style="green")
        for alert in reversed(log):
            stamp = timefmt.clock(alert.time)
            style = {"critical": "bold red", "cleared": "green", "note": "dim"}.get(
                alert.severity, "yellow"
            )
            t.append(f"{stamp}  ", style="dim")
            t.append(f"{alert.severity:<8} ", style=style)
            t.append(alert.message + "\n")
        self.query_one("#alert-log", LiveText).show(t, layout=True)


KEY_NAMES = {
    "slash": "/",
    "escape": "Esc",
    "question_mark": "?",
    "plus": "+",
    "minus": "-",
    "space": "Space",
    "end": "End",
    "enter": "Enter",
}


def key_text(app: App[Any], binding: Binding) -> str:
    """The keys of ``binding`` as help names them (``Esc, S, q``; ``[``)."""
    if binding.key_display:
        return binding.key_display
    keys = binding.key.split(",")
    return ", ".join(KEY_NAMES.get(k) or app.get_key_display(Binding(k, "")) for k in keys)


def key_lines(app: App[Any], bindings: list[Binding]) -> list[tuple[str, str, str]]:
    """(keys, what they do, more) for help: neighbours with one action share a line
    (``[ ]  Earlier / Later``; ``1-9  Profile`` for a run of them)."""
    out: list[tuple[str, str, str]] = []
    group: list[Binding] = []
    for binding in [*bindings, None]:
        if group and (binding is None or _action(binding) != _action(group[0])):
            keys = [key_text(app, b) for b in group]
            words = [b.description for b in group]
            if len(group) > 3:
                columns = zip(*(w.split() for w in words), strict=False)
                common = [c[0] for c in itertools.takewhile(lambda c: len(set(c)) == 1, columns)]
                out.append((f"{keys[0]}-{keys[-1]}", " ".join(common) or words[0], ""))
            else:
                out.append((" ".join(keys), " / ".join(words), group[0].tooltip))
            group = []
        if binding is not None:
            group.append(binding)
    return out


def _action(binding: Binding) -> str:
    """The action a help line groups by: its name, but a screen's own (``switch_to('runs')``)."""
    return binding.action if "('" in binding.action else binding.action.partition("(")[0]


class HelpScreen(LiveScreen):
    """Every key of every screen and what it does; every action is also in the command
    palette (Ctrl+P)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.show_dashboard", "Back", id="help.back")
    ]

    def compose(self) -> ComposeResult:
        yield LiveText(id="banner")
        with ScrollRows(id="help-body"), Columns(id="help-cols"):
            # Side by side on a wide terminal, one under the other otherwise.
            yield LiveText(self.help_text(), id="help", wrap=True)
            yield LiveText(self.screens_help_text(), id="help-screens", wrap=True)
        yield LiveText(id="status")
        yield KeysFooter()

    def _keys(self, t: Text, bindings: list[Binding]) -> None:
        for keys, description, tooltip in key_lines(self.app, bindings):
            t.append(f"  {keys:<10}", style="bold cyan")
            t.append(description)
            if tooltip:
                t.append(f": {tooltip}", style="dim")
            t.append("\n")

    def help_text(self) -> Text:
        t = Text()
        t.append("gpustation dashboard\n\n", style="bold underline")
        t.append("Everywhere\n", style="bold")
        self._keys(t, self.dash.all_bindings())
        t.append("\nOn the main screen\n", style="bold")
        self._keys(
            t,
            [self.dash.remapped(b) for b in DashboardScreen.BINDINGS if isinstance(b, Binding)],
        )
        t.append(f"  {'↑ ↓':<10}", style="bold cyan")
        t.append("move in the process table (also PgUp, PgDn, Home, End)\n")
        t.append(
            "\nCtrl+P opens the command palette with every action. Mouse: click a card to see "
            "its power range, a column header to sort, a row to select a process.\n"
            "Alerts: temperature within 5 C of slowdown, thermal or power-cap throttling, "
            "PCIe link below maximum under load, VRAM above 95 %, a new uncorrected ECC "
            "error, a GPU lost.\n",
            style="dim",
        )
        return t

    def screens_help_text(self) -> Text:
        """The keys of the other screens (runs, control ...) and of the views they open
        over themselves (compare, sweeps ...), a section each."""
        t = Text()
        for heading, bindings in self.dash.screen_bindings():
            t.append(f"{heading}\n", style="bold")
            self._keys(t, bindings)
            t.append("\n")
        t.rstrip()
        return t
