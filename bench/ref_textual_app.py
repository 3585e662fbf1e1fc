"""Reference: a minimal Textual monitor, for comparing CPU use.

Two text cards and one plotext plot, refreshed at 1 Hz; the shape of a naive
dashboard. ``--no-plot`` leaves the plot out. Run by bench/dashboard_cpu.py.
"""

from __future__ import annotations

import math
import sys
import time
from typing import ClassVar

from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static
from textual_plotext import PlotextPlot


class RefApp(App[None]):
    CSS = "Static { height: 8; border: round green; width: 1fr; }"
    BINDINGS: ClassVar = [("q", "quit", "Quit")]

    def __init__(self, plot: bool) -> None:
        super().__init__()
        self.with_plot = plot
        self.points: list[float] = []

    def compose(self) -> ComposeResult:
        with Horizontal(id="cards"):
            yield Static("card A", id="a")
            yield Static("card B", id="b")
        if self.with_plot:
            yield PlotextPlot(id="plot")

    def on_mount(self) -> None:
        self.tick()
        self.set_interval(1.0, self.tick)

    def tick(self) -> None:
        t = time.time()
        self.points.append(50 + 40 * math.sin(t / 5))
        self.points = self.points[-600:]
        self.query_one("#a", Static).update(f"REFCARD A\nvalue {self.points[-1]:.1f}")
        self.query_one("#b", Static).update(f"REFCARD B\ntime {t:.0f}")
        if self.with_plot:
            widget = self.query_one(PlotextPlot)
            plt = widget.plt
            plt.clear_data()
            plt.plot(self.points)
            widget.refresh()


if __name__ == "__main__":
    RefApp(plot="--no-plot" not in sys.argv).run()
