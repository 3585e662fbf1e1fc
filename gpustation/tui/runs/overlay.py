"""The compare view's plot: the loss curves of the runs compared, one colour each.

Each run's training loss is a line, its eval loss (where it reports one) is
marked in the same colour with ``x``; the x axis is the step or the time since
the run started (a key toggles it). The legend under the plot names each run
by its id, preset and the settings it differs in. At most one run per colour:
more and the curves could not be told apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.widgets import Static

from gpustation.runs.curves import RunCurves
from gpustation.textsafe import safe

#: (plotext colour, Rich colour) of each run in the overlay, in order
PALETTE: tuple[tuple[int, str], ...] = (
    (39, "color(39)"),  # blue
    (208, "color(208)"),  # orange
    (41, "color(41)"),  # green
    (199, "color(199)"),  # pink
    (226, "color(226)"),  # yellow
    (141, "color(141)"),  # violet
    (51, "color(51)"),  # cyan
    (196, "color(196)"),  # red
)
MAX_OVERLAY = len(PALETTE)
EVAL_MARKER = "x"


def too_many(count: int) -> str | None:
    """Why ``count`` marked runs cannot be overlaid (None when they can)."""
    if count <= MAX_OVERLAY:
        return None
    return (
        f"{count} runs are marked, but the overlay has {MAX_OVERLAY} colours: "
        f"unmark {count - MAX_OVERLAY} (space) and press v again."
    )


@dataclass
class OverlayRun:
    """One run of the overlay: what the legend says of it and its curves."""

    run_id: str
    preset: str
    #: the settings it differs in (``batch_size=192``)
    settings: str
    curves: RunCurves


def time_scale(seconds: float) -> tuple[float, str]:
    """The divisor and unit of a time axis reaching ``seconds``."""
    if seconds >= 3 * 3600:
        return 3600.0, "h"
    if seconds >= 600:
        return 60.0, "min"
    return 1.0, "s"


def overlay_plot(runs: Sequence[OverlayRun], by_time: bool, width: int, height: int) -> Text:
    """The runs' loss curves in one figure, a colour per run."""
    # start-up time: plotext, only when a plot is drawn
    import plotext as plt

    plt.clear_figure()
    # The widget's size, not the terminal's (plotext caps a figure at the latter).
    plt.limitsize(False, False)
    plt.plotsize(max(30, width), max(6, height))
    plt.theme("clear")
    scale, unit = 1.0, "s"
    if by_time:
        curves = [c for r in runs for c in (r.curves.loss, r.curves.eval_loss)]
        reach = max((max(c.times_s, default=0.0) for c in curves), default=0.0)
        scale, unit = time_scale(reach)
    for n, run in enumerate(runs[:MAX_OVERLAY]):
        colour = PALETTE[n][0]
        loss, evals = run.curves.loss, run.curves.eval_loss
        if loss:
            xs = [x / scale for x in loss.xs(by_time)]
            plt.plot(xs, loss.values, marker="braille", color=colour)
        if evals:
            xs = [x / scale for x in evals.xs(by_time)]
            plt.scatter(xs, evals.values, marker=EVAL_MARKER, color=colour)
    plt.xlabel(f"time ({unit})" if by_time else "step")
    plt.ylabel("loss")
    return Text.from_ansi(plt.build())


def legend(runs: Sequence[OverlayRun]) -> Text:
    """A line per run: its colour, id, preset and the settings it differs in."""
    text = Text()
    for n, run in enumerate(runs[:MAX_OVERLAY]):
        if n:
            text.append("\n")
        style = PALETTE[n][1]
        text.append("━━ ", style=f"bold {style}")
        text.append(safe(run.run_id), style="bold")
        text.append(f"  {safe(run.preset or '-')}")
        if run.settings:
            text.append(f"  {safe(run.settings)}", style="cyan")
        if run.curves.eval_loss:
            text.append(f"  ({EVAL_MARKER} eval loss)", style=style)
        if not run.curves.loss and not run.curves.eval_loss:
            text.append("  no loss reported", style="dim")
    return text


class OverlayPlot(Static):
    """The overlaid curves; drawn again only when the runs, the axis or the size change."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.runs: list[OverlayRun] = []
        self.by_time = False
        self._key: object = None
        self.draws = 0

    def show(self, runs: Sequence[OverlayRun] | None = None, by_time: bool | None = None) -> None:
        if runs is not None:
            self.runs = list(runs)
            self._key = None
        if by_time is not None:
            self.by_time = by_time
        width, height = self.content_region.width, self.content_region.height
        key = (self.by_time, width, height)
        if key == self._key or not width or not height:
            return
        self._key = key
        if not any(r.curves.loss or r.curves.eval_loss for r in self.runs):
            self.update(Text("No loss reported by these runs.", style="dim"), layout=False)
            return
        # The stylesheet fixes the size: no relayout of the screen.
        self.update(overlay_plot(self.runs, self.by_time, width, height), layout=False)
        self.draws += 1

    def on_resize(self) -> None:
        self.show()
