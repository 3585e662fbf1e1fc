"""The runs screen's widgets: the log pane, the loss curve, the footer.

Keys stay quick while a run floods its log (``bench/log_flood.py``): the log
pane and the runs table change their scrollable size without a relayout of
the screen, the loss curve is redrawn at most every ``PLOT_EVERY_S``, and the
footer is rebuilt only when its keys change.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rich.cells import cell_len
from rich.segment import Segment
from rich.text import Text
from textual import events
from textual.geometry import Size
from textual.screen import Screen
from textual.scroll_view import ScrollView
from textual.scrollbar import ScrollTo, ScrollUp
from textual.selection import Selection
from textual.strip import Strip

from gpustation.runs.compare import SIMULATED, energy_text, fmt_energy, fmt_num, sim_marked
from gpustation.runs.cost import Price
from gpustation.runs.fold import ema
from gpustation.runs.phases import phases_table, read_phases
from gpustation.runs.summary import RunSummary
from gpustation.telemetry import format as fmt
from gpustation.telemetry import health
from gpustation.telemetry.model import GpuSample
from gpustation.textsafe import safe
from gpustation.tui.footer import KeysFooter
from gpustation.tui.runs.model import (
    MAX_LOG_LINES,
    STATUS_STYLE,
    RunView,
    fmt_duration,
    fmt_value,
)
from gpustation.tui.runs.runplot import RunPlot
from gpustation.tui.runs.timeline import loss_time_plot, slowdown_alert, throughput_time_plot


def loss_plot(
    losses: tuple[list[float], list[float]],
    evals: tuple[list[float], list[float]],
    width: int,
    height: int,
) -> Text:
    """The loss curve: raw, smoothed, and eval loss when the run reports it."""
    # start-up time: plotext, only when a plot is drawn
    import plotext as plt

    xs, ys = losses
    plt.clear_figure()
    plt.limitsize(False, False)  # the pane's size, not the terminal's as plotext sees it
    plt.plotsize(max(20, width), max(5, height))
    plt.theme("clear")
    if xs:
        plt.plot(xs, ys, marker="braille", color="gray", label="loss")
        if len(ys) > 2:
            plt.plot(xs, ema(ys), marker="braille", color="cyan", label="smoothed")
    ex, ey = evals
    if ex:
        plt.plot(ex, ey, marker="braille", color="orange", label="eval loss")
    plt.xlabel("step")
    return Text.from_ansi(plt.build())


def gpu_line(g: GpuSample) -> Text:
    """One compact line of a GPU's telemetry for the run pane."""
    t = Text()
    t.append(f"GPU {g.index} ", style="bold")
    if g.lost:
        t.append("lost", style="bold red")
        return t
    temp = fmt.num(g.temperature_c, 0, " C")
    t.append(temp, style="bold red" if health.near_slowdown(g) else "")
    t.append(f" · {fmt.pair(g.power_w, g.power_limit_w, ' W')}")
    t.append(f" · util {fmt.num(g.utilization_gpu_pct, 0, ' %')}")
    t.append(f" · VRAM {fmt.mib(g.memory_used_mib)}/{fmt.mib(g.memory_total_mib)}")
    if g.sm_active_pct is not None or g.tensor_active_pct is not None:
        # GPM, read while a run is live on cards that have it
        t.append(
            f" · SM active {fmt.num(g.sm_active_pct, 0, ' %')}"
            f" tensor {fmt.num(g.tensor_active_pct, 0, ' %')}"
        )
    reasons = health.limiting_reasons(g)
    if reasons:
        t.append(f" · throttled: {fmt.throttle(reasons)}", style="yellow")
    return t


# ---- widgets -------------------------------------------------------------------------------


def energy_line(view: RunView, price: Price | None) -> Text | None:
    """The run's GPU energy, its cost and its energy per unit of work (None: no energy yet).

    A finished run's figures are its summary's (the cards' energy counters where
    they moved); a live run's are its power integrated so far.
    """
    s = view.summary
    energy, so_far = s.energy_j, False
    if energy is None and view.active:
        energy, so_far = view.timeline.energy_j, True
    if energy is None:
        return None
    line = Text("energy so far " if so_far else "energy ")
    line.append(energy_text(s) if not so_far else sim_marked(s, fmt_energy(energy)), style="bold")
    if price is not None:
        line.append(" · cost ")
        line.append(price.text(energy), style="bold")
    per_unit = s.energy_per_unit_j if not so_far else None
    if per_unit is None and s.work:
        per_unit = energy / s.work
    unit = s.work_unit or "unit"
    if per_unit:
        figures = f"{fmt_num(per_unit, 3)} J/{unit} · {fmt_num(1 / per_unit, 2)} {unit}/J"
        line.append(f" · {sim_marked(s, figures)}")
    return line


def energy_cell(s: RunSummary, price: Price | None) -> str:
    """The runs table's energy column: the energy, and its cost when a price is set."""
    if s.energy_j is None:
        return fmt.NA
    text = energy_text(s)
    return f"{text} · {price.text(s.energy_j)}" if price is not None else text


def run_header(view: RunView | None, now: float, price: Price | None = None) -> Text:
    """The run pane's header: the run, its status, progress, ETA, losses and energy."""
    header = Text()
    if view is None:
        header.append("No run selected. ", style="bold")
        header.append("Launch a preset with l (or Enter on the list).", style="dim")
        return header
    header.append(view.title or view.preset, style="bold")
    header.append(f"  {view.id}\n", style="dim")
    header.append(view.status_text(), style=STATUS_STYLE.get(view.status, ""))
    s = view.summary
    if s.simulated:
        header.append(f" · {SIMULATED} GPUs", style="bold yellow")
    step, total = s.steps, s.total_steps
    if step is not None:
        header.append(f" · step {step:,}" + (f"/{total:,}" if total else ""))
        if total:
            header.append(f" ({100 * min(1.0, step / total):.0f} %)")
    if s.throughput is not None:
        unit = s.throughput_unit or ""
        header.append(f" · {fmt_value(s.throughput, 1)} {unit}".rstrip())
    eta = view.eta_s(now)
    if eta is not None:
        header.append(f" · ETA {fmt_duration(eta)}", style="bold")
    header.append(f" · {'elapsed' if view.active else 'took'} ")
    header.append(fmt_duration(view.elapsed_s(now)))
    header.append("\nloss ")
    header.append(fmt_value(s.final_loss), style="bold")
    header.append(f" (best {fmt_value(s.best_loss)})")
    if s.final_eval_loss is not None:
        header.append(f" · eval loss {fmt_value(s.final_eval_loss)}")
    energy = energy_line(view, price)
    if energy is not None:
        header.append(" · ")
        header.append_text(energy)
    alert = slowdown_alert(view)
    if alert is not None:
        header.append("\n")
        header.append_text(alert)
    if view.reason and not view.active:
        header.append(f"\n{view.reason}", style="dim")
    return header


def run_gpus(view: RunView | None, samples: dict[int, GpuSample]) -> Text:
    """A line of telemetry per GPU of the run (``samples`` by GPU index)."""
    gpus = Text()
    if view is None:
        return gpus
    for n, index in enumerate(view.gpus):
        if n:
            gpus.append("\n")
        sample = samples.get(index)
        if sample is None:
            gpus.append(f"GPU {index} ", style="bold")
            gpus.append("not sampled by this dashboard", style="dim")
        else:
            gpus.append_text(gpu_line(sample))
    if not view.gpus:
        gpus.append("no GPU", style="dim")
    return gpus


def _printable(line: str) -> str:
    """A log line safe to draw: tabs expanded, escape sequences removed (rule 8)."""
    return line if line.isprintable() else safe(line.expandtabs())


def fit_scrollbars(widget: ScrollView, size: Size) -> None:
    """Fit ``widget``'s scrollbars to content of ``size`` without laying the screen out.

    Only a scrollbar appearing or going changes the layout (its own reactive);
    otherwise the bars' lengths and the scroll position are all that change.
    """
    styles = widget.styles
    width, height = widget.container_size

    def wants(overflow: str, content: int, window: int) -> bool:
        return overflow == "scroll" or (overflow == "auto" and content > window)

    show_v = wants(styles.overflow_y, size.height, height)
    bar_w = int(styles.scrollbar_size_vertical) if show_v else 0
    show_h = wants(styles.overflow_x, size.width, width - bar_w)
    if show_h and not show_v:
        # The horizontal bar takes a row: the content may now need the vertical one.
        show_v = wants(
            styles.overflow_y, size.height, height - int(styles.scrollbar_size_horizontal)
        )
    if show_v != widget.show_vertical_scrollbar:
        widget.show_vertical_scrollbar = show_v
    if show_h != widget.show_horizontal_scrollbar:
        widget.show_horizontal_scrollbar = show_h
    if show_v and styles.scrollbar_size_vertical:
        vertical = widget.vertical_scrollbar
        vertical.window_virtual_size = size.height
        vertical.window_size = height - widget.scrollbar_size_horizontal
        vertical.refresh()
    if show_h and styles.scrollbar_size_horizontal:
        horizontal = widget.horizontal_scrollbar
        horizontal.window_virtual_size = size.width
        horizontal.window_size = width - widget.scrollbar_size_vertical
        horizontal.refresh()
    widget.scroll_x = widget.validate_scroll_x(widget.scroll_x)
    widget.scroll_y = widget.validate_scroll_y(widget.scroll_y)


class RunLog(ScrollView, can_focus=True):
    """The log pane: a run's last lines, drawn a screen at a time.

    Holds at most ``max_lines`` lines (the oldest drop out) and renders only
    the rows on screen, each from its string when it is drawn: appending a
    flood's worth of lines costs a deque extend and one repaint. New lines
    never relayout the screen: the content size is set without Textual's
    layout (only this widget's scrollbars depend on it), and no line's width
    is measured until it is drawn.

    Following the end is a flag set by what the user does (keys, wheel,
    scrollbar), not read from the scroll position: while a flood comes in,
    the position lags the content for a moment and would read as "scrolled
    back". ``on_change`` is called when the flag flips.
    """

    ALLOW_SELECT = True
    DEFAULT_CSS = """
    RunLog {
        background: $surface;
        color: $text;
        overflow-y: scroll;
        overflow-x: auto;
        &:focus { background-tint: $foreground 5%; }
    }
    """

    def __init__(
        self, on_change: Callable[[], None], max_lines: int = MAX_LOG_LINES, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.max_lines = max_lines
        self._lines: deque[str] = deque(maxlen=max_lines)
        #: the widest line seen, in characters (grows as wider lines are written or drawn)
        self._width = 0
        self.follow = True
        self._on_change = on_change

    @property
    def lines(self) -> Sequence[str]:
        """The lines held (the last ``max_lines`` written)."""
        return self._lines

    @property
    def line_count(self) -> int:
        return len(self._lines)

    def write_lines(self, lines: Iterable[str]) -> None:
        """Append ``lines`` (each without its newline) and repaint."""
        if self._append(lines):
            self._content_changed()

    def write_line(self, line: str) -> None:
        """Append one line."""
        self.write_lines([line])

    def replace(self, lines: Iterable[str]) -> None:
        """Show ``lines`` instead of what is there (another run, or a refill)."""
        self._lines.clear()
        self._width = 0
        self._append(lines)
        self._content_changed()

    def clear(self) -> None:
        """Remove every line."""
        self.replace(())

    def _append(self, lines: Iterable[str]) -> bool:
        added = list(lines)
        if not added:
            return False
        self._lines.extend(added)
        # len() is the width of plain text; tabs and wide characters are measured
        # when drawn (render_line widens the content then).
        self._width = max(self._width, max(map(len, added[-self.max_lines :])))
        return True

    def _content_changed(self) -> None:
        size = Size(self._width, len(self._lines))
        if size != self.virtual_size:
            # Not through the reactive: it would lay the whole screen out again
            # for what changes only this widget's scrollbars. Showing or hiding
            # a scrollbar still relayouts (its own reactive), which a flood does
            # at most once.
            self.set_reactive(ScrollView.virtual_size, size)
            fit_scrollbars(self, size)
        self.refresh()

    def show_end(self) -> None:
        """Scroll to the last line."""
        self.scroll_end(animate=False, immediate=True, x_axis=False)

    def on_resize(self) -> None:
        if self.follow:
            self.show_end()

    # -- drawing -----------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        style = self.rich_style
        if index >= len(self._lines):
            return Strip.blank(width, style)
        text = _printable(self._lines[index])
        cells = cell_len(text)
        if cells > self._width:
            self._width = cells
            self.call_later(self._content_changed)
        selection = self.text_selection
        span = selection.get_span(index) if selection is not None else None
        if span is None:
            strip = Strip([Segment(text, style)], cells)
        else:
            start, end = span
            line = Text(text, style=style, no_wrap=True, end="")
            line.stylize(
                self.screen.get_component_rich_style("screen--selection"),
                start,
                len(text) if end == -1 else end,
            )
            strip = Strip(line.render(self.app.console), cells)
        return strip.crop_extend(scroll_x, scroll_x + width, style).apply_offsets(scroll_x, index)

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        return selection.extract("\n".join(self._lines)), "\n"

    def selection_updated(self, selection: Selection | None) -> None:
        self.refresh()

    # -- following -----------------------------------------------------------------------------
    def _pause(self) -> None:
        if self.follow and self.max_scroll_y > 0:
            self.follow = False
            self._on_change()

    def action_scroll_up(self) -> None:
        super().action_scroll_up()
        self._pause()

    def action_page_up(self) -> None:
        super().action_page_up()
        self._pause()

    def action_scroll_home(self) -> None:
        super().action_scroll_home()
        self._pause()

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self._pause()

    def on_scroll_up(self, message: ScrollUp) -> None:
        self._pause()

    def on_scroll_to(self, message: ScrollTo) -> None:
        if message.y is not None and message.y < self.max_scroll_y:
            self._pause()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        # Back at the end by scrolling down: follow again.
        if not self.follow and self.max_scroll_y > 0 and round(new_value) >= self.max_scroll_y:
            self.follow = True
            self._on_change()


class QuietFooter(KeysFooter):
    """A footer rebuilt only when the keys it would show change.

    Textual's footer rebuilds itself (a dozen widgets, so a relayout of the
    screen) whenever its screen's bindings are refreshed: on each focus change
    and each time a dialog closes, when the keys are usually the same.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._keys: object = None

    def bindings_changed(self, screen: Screen[Any]) -> None:
        keys = [
            (binding, enabled, tooltip)
            for (_, binding, enabled, tooltip) in screen.active_bindings.values()
        ]
        # _keys is only set just before Textual's own rebuild, so a match means
        # the footer already shows these keys.
        if keys == self._keys:
            return
        if screen.app.app_focus and self.is_attached and screen is self.screen:
            self._keys = keys  # what the rebuild about to happen will show
        super().bindings_changed(screen)


class LossPlot(RunPlot):
    """The selected run's loss curve; for a run without a loss that reported phases
    (the contention runner's), the table of its phases; for one that reports only its
    throughput, that. Its slowdowns are marked on the curve.

    Against seconds since the start when the run's timeline has its loss (it
    shares that axis with the GPU plot under it), else against the step.
    """

    def version(self, view: RunView) -> object:
        return (view.curve_version, read_phases(view.summary.summary) is not None)

    def draw(self, view: RunView | None, width: int, height: int, cursor_s: float | None) -> bool:
        if view is None:
            self.update(Text("Select a run to see its loss curve.", style="dim"), layout=False)
        elif not view.losses[0] and not view.evals[0]:
            phases = phases_table(view.summary.summary)
            if phases is not None:
                self.update(phases, layout=False)
                return True
            if any(m.throughput is not None for m in view.timeline.loss):
                unit = view.summary.throughput_unit or ""
                plot = throughput_time_plot(view.timeline, width, height, cursor_s, unit)
                self.update(plot, layout=False)
                return True
            self.update(Text("No loss reported yet.", style="dim"), layout=False)
        elif view.timeline.loss:
            self.update(loss_time_plot(view.timeline, width, height, cursor_s), layout=False)
            return True
        else:
            self.update(loss_plot(view.losses, view.evals, width, height), layout=False)
            return True
        return False
