"""The selected run's timeline: its loss and its GPUs on one time axis, and a cursor.

The loss curve (:class:`~gpustation.tui.runs.widgets.LossPlot`; the
throughput, for a run that reports no loss) and the GPU plot under it
(:class:`GpuPlot`: power in W on the left axis, utilisation in % on the
right, throttled samples marked) share their x axis, seconds since the run
started: both figures span the same range and give their y axes labels of
the same width, so a column is the same moment in both. Each slowdown of the
run is marked on the upper plot: its span, its bounds and its cause in
words; one going on in a live run is also :func:`slowdown_alert`'s line in
the run's header. The data is a :class:`~gpustation.runs.timeline.Timeline`
the poller read; nothing here reads a file.

:class:`TimeCursor` is where the user stands on that axis: at the end (it
follows a live run) until ``[``/``]`` step it a sample back or on and
``{``/``}`` a tenth of the run; :func:`cursor_line` says what the run and its
GPUs were doing there, in one line.
"""

from __future__ import annotations

import bisect
from typing import Any

from rich.text import Text

from gpustation.runs.compare import SIMULATED
from gpustation.runs.fold import ema
from gpustation.runs.timeline import Timeline
from gpustation.telemetry import format as fmt
from gpustation.tui.runs.model import RunView, fmt_duration, fmt_value
from gpustation.tui.runs.runplot import RunPlot

#: characters of every y-axis label, left and right, so both plots line up
LABEL_W = 7
#: what ``{`` and ``}`` move by: this share of the run
BIG_STEP = 0.1
#: the colour a slowdown is marked in
SLOWDOWN_COLOR = "magenta"
#: the longest cause drawn over a span
SPAN_LABEL_CHARS = 32


def _labels(lo: float, hi: float, height: int) -> tuple[list[float], list[str]]:
    """Ticks at the bottom, top (and middle, where there are rows for it), labels of one width.

    Never more ticks than rows: plotext would keep one of two labels on a row.
    """
    count = 3 if height >= 10 else 2
    if hi - lo < 1e-12:
        hi = lo + 1.0
    ticks = [lo + (hi - lo) * i / (count - 1) for i in range(count)]
    return ticks, [f"{t:>{LABEL_W}.4g}"[-LABEL_W:] for t in ticks]


def _frame(width: int, height: int, end_s: float) -> Any:
    # start-up time: plotext, only when a plot is drawn
    import plotext as plt

    plt.clear_figure()
    plt.limitsize(False, False)  # the pane's size, not the terminal's as plotext sees it
    plt.plotsize(max(20, width), max(5, height))
    plt.theme("clear")
    plt.xlim(0.0, max(end_s, 1.0))
    return plt


def _cursor(plt: Any, cursor_s: float | None) -> None:
    if cursor_s is not None:
        plt.vline(cursor_s, "red")


def _blank_right_axis(plt: Any, x: float, y: float) -> None:
    """A right axis with empty labels, as wide as the other plot's right labels."""
    plt.plot([x], [y], yside="right", marker=" ", color="default")
    plt.yticks([y], [" " * LABEL_W], yside="right")


def _slowdowns(plt: Any, timeline: Timeline, top: float) -> None:
    """Each slowdown: its span along the top of the plot, its bounds, its cause in words."""
    for span in timeline.slowdowns:
        end = span.end_s if span.end_s is not None else max(timeline.end_s(), span.start_s)
        plt.plot([span.start_s, end], [top, top], marker="━", color=SLOWDOWN_COLOR)
        plt.vline(span.start_s, SLOWDOWN_COLOR)
        if span.end_s is not None:
            plt.vline(span.end_s, SLOWDOWN_COLOR)
        label = span.label[:SPAN_LABEL_CHARS]
        plt.text(label, x=span.start_s, y=top, color=SLOWDOWN_COLOR, alignment="left")


def loss_time_plot(
    timeline: Timeline, width: int, height: int, cursor_s: float | None = None
) -> Text:
    """Loss (raw, smoothed) and eval loss against seconds since the run started."""
    end = timeline.end_s()
    plt = _frame(width, height, end)
    points = [(m.t_s, m.loss) for m in timeline.loss if m.loss is not None]
    evals = [(m.t_s, m.eval_loss) for m in timeline.loss if m.eval_loss is not None]
    ys = [y for _, y in points] + [y for _, y in evals]
    if points:
        xs, ls = [p[0] for p in points], [p[1] for p in points]
        plt.plot(xs, ls, marker="braille", color="gray", label="loss")
        if len(ls) > 2:
            plt.plot(xs, ema(ls), marker="braille", color="cyan", label="smoothed")
    if evals:
        plt.plot(
            [e[0] for e in evals], [e[1] for e in evals], marker="braille", color="orange",
            label="eval loss",
        )  # fmt: skip
    if ys:
        lo, hi = min(ys), max(ys)
        plt.yticks(*_labels(lo, hi, height))
        _blank_right_axis(plt, 0.0, lo)
        _slowdowns(plt, timeline, hi)
    _cursor(plt, cursor_s)
    return Text.from_ansi(plt.build())


def throughput_time_plot(
    timeline: Timeline, width: int, height: int, cursor_s: float | None = None, unit: str = ""
) -> Text:
    """Throughput against seconds since the run started (a run that reports no loss)."""
    plt = _frame(width, height, timeline.end_s())
    points = [(m.t_s, m.throughput) for m in timeline.loss if m.throughput is not None]
    if points:
        ys = [p[1] for p in points]
        plt.plot([p[0] for p in points], ys, marker="braille", color="cyan",
                 label=f"throughput {unit}".strip())  # fmt: skip
        plt.yticks(*_labels(min(ys), max(ys), height))
        _blank_right_axis(plt, 0.0, min(ys))
        _slowdowns(plt, timeline, max(ys))
    _cursor(plt, cursor_s)
    return Text.from_ansi(plt.build())


def slowdown_alert(view: RunView | None) -> Text | None:
    """A live run's slowdown going on, with its cause (None: none)."""
    if view is None or not view.active or not view.timeline.slowdowns:
        return None
    span = view.timeline.slowdowns[-1]
    if not span.ongoing:
        return None
    lost = f", {span.lost_pct:.0f} % below its steady level" if span.lost_pct is not None else ""
    return Text(f"⚠ slowed down since {fmt_duration(span.start_s)}{lost}: {span.words}",
                style="bold yellow")  # fmt: skip


def gpu_time_plot(
    timeline: Timeline, width: int, height: int, cursor_s: float | None = None
) -> Text:
    """Power (W, left) and utilisation (%, right) against seconds since the run started."""
    end = timeline.end_s()
    plt = _frame(width, height, end)
    power = [(m.t_s, m.power_w) for m in timeline.gpu if m.power_w is not None]
    util = [(m.t_s, m.utilization_pct) for m in timeline.gpu if m.utilization_pct is not None]
    if power:
        label = "power W" if timeline.gpu[-1].gpus == 1 else f"power W ({timeline.gpu[-1].gpus})"
        plt.plot([p[0] for p in power], [p[1] for p in power], marker="braille",
                 color="yellow", label=label)  # fmt: skip
        throttled = [m for m in timeline.gpu if m.throttle and m.power_w is not None]
        if throttled:
            plt.scatter([m.t_s for m in throttled], [m.power_w for m in throttled],
                        marker="dot", color="red", label="throttled")  # fmt: skip
        ws = [p[1] for p in power]
        plt.yticks(*_labels(min(ws), max(ws), height))
    if util:
        plt.plot([u[0] for u in util], [u[1] for u in util], marker="braille",
                 color="green", label="util %", yside="right")  # fmt: skip
        plt.ylim(0, 100, yside="right")
        plt.yticks(*_labels(0.0, 100.0, height), yside="right")
    elif power:
        _blank_right_axis(plt, 0.0, power[0][1])
    _cursor(plt, cursor_s)
    plt.xlabel("seconds since the start")
    return Text.from_ansi(plt.build())


class TimeCursor:
    """Where the user stands on the run's time axis (None: at the end, following)."""

    def __init__(self) -> None:
        self.at_s: float | None = None
        self.run_id: str | None = None

    def for_run(self, run_id: str | None) -> None:
        """Another run is shown: back to its end."""
        if run_id != self.run_id:
            self.run_id = run_id
            self.at_s = None

    def position(self, timeline: Timeline) -> float:
        """The moment shown: the cursor's, or the run's last."""
        return timeline.end_s() if self.at_s is None else self.at_s

    def step(self, timeline: Timeline, samples: int) -> bool:
        """Move ``samples`` stops (GPU samples) back or on; past the end it follows again."""
        stops = timeline.stops()
        if not stops:
            return False
        here = self.position(timeline)
        if samples < 0:
            n = bisect.bisect_left(stops, here - 1e-9) + samples
        else:
            n = bisect.bisect_right(stops, here + 1e-9) + samples - 1
        if n >= len(stops) - 1 and samples > 0:
            self.at_s = None
        else:
            self.at_s = stops[max(0, n)]
        return True

    def jump(self, timeline: Timeline, direction: int) -> bool:
        """Move a tenth of the run back or on (to the nearest stop)."""
        stops = timeline.stops()
        if not stops:
            return False
        target = self.position(timeline) + direction * BIG_STEP * max(timeline.end_s(), 1.0)
        if target >= stops[-1]:
            self.at_s = None
            return True
        n = min(max(0, bisect.bisect_left(stops, target)), len(stops) - 1)
        self.at_s = stops[n]
        return True


#: the keys, said after the values as far as the line has room
KEY_HINTS = ("[ ] { } move", "P profile", "S sweeps")


#: the parts of the cursor's line given up where it is short of room, the first
#: first: "not throttled", the step (the header has it), the temperature, the
#: utilisation (the key hints go before any)
_SPARE = {"not throttled": 4, "step": 3, "temperature": 2, "utilisation": 1}


def cursor_line(view: RunView | None, cursor: TimeCursor, width: int = 0) -> Text:
    """The run and its GPUs at the cursor, in one line of ``width`` (0: any) columns:
    the loss, power and throttling stay; the key hints, "not throttled", the step,
    the temperature and the utilisation go where there is no room for them."""
    line = Text()
    if view is None:
        return line
    timeline = view.timeline
    if timeline.empty:
        if view.loaded and not view.active:
            line.append("no loss or GPU telemetry over time for this run", style="dim")
        return line
    at = cursor.position(timeline)
    loss, gpu = timeline.at(at)
    parts: list[tuple[str, str, str]] = []  # (what, text, style)
    parts.append(("", "▶ " if cursor.at_s is not None else "at the end ", "bold"))
    parts.append(("", f"{fmt_duration(at)} ", "bold"))
    if loss is not None:
        if loss.step is not None:
            parts.append(("step", f"· step {loss.step:,} ", ""))
        parts.append(("", f"· loss {fmt_value(loss.loss)} ", ""))
    if gpu is not None:
        parts.append(("", f"· {fmt.num(gpu.power_w, 0, ' W')} ", ""))
        parts.append(("temperature", f"· {fmt.num(gpu.temperature_c, 0, ' °C')} ", ""))
        parts.append(("utilisation", f"· util {fmt.num(gpu.utilization_pct, 0, ' %')} ", ""))
        if view.summary.simulated:
            parts.append(("", f"{SIMULATED} ", "bold yellow"))
        if gpu.throttle:
            parts.append(("", f"· throttled: {fmt.throttle(list(gpu.throttle))} ", "yellow"))
        else:
            parts.append(("not throttled", "· not throttled ", "dim"))
    for what, _ in sorted(_SPARE.items(), key=lambda item: -item[1]):
        if not width or sum(len(p[1]) for p in parts) - 1 <= width:  # less its last space
            break
        parts = [p for p in parts if p[0] != what]
    for _, text, style in parts:
        line.append(text, style=style)
    hints = ""
    for hint in KEY_HINTS:
        more = f"{hints} · {hint}" if hints else f" {hint}"
        if width and line.cell_len + len(more) > width:
            break
        hints = more
    line.append(hints, style="dim")
    return line


class GpuPlot(RunPlot):
    """The selected run's GPU power and utilisation over time, under its loss curve."""

    def draw(self, view: RunView | None, width: int, height: int, cursor_s: float | None) -> bool:
        if view is None:
            self.update(Text(""), layout=False)
        elif not view.timeline.gpu:
            what = "reading…" if view.active or not view.loaded else "none recorded for this run"
            self.update(Text(f"GPU telemetry over time: {what}", style="dim"), layout=False)
        else:
            self.update(gpu_time_plot(view.timeline, width, height, cursor_s), layout=False)
            return True
        return False
