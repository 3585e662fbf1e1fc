"""The fan-curve plot of the control screen: the curve and each GPU's point on it."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from gpustation.control.profiles import FanCurve


def curve_plot(
    curve: FanCurve, width: int, height: int, marks: list[tuple[int, float, int]]
) -> Text:
    """The curve (clamped to 20-100 C) with each GPU's temperature and speed marked."""
    # start-up time: plotext, only when a plot is drawn
    import plotext as plt

    plt.clear_figure()
    plt.limitsize(False, False)  # the pane's size, not the terminal's as plotext sees it
    plt.plotsize(max(30, width), max(8, height))
    plt.theme("clear")
    xs: list[float] = []
    ys: list[float] = []
    lo_t, hi_t = 20.0, 100.0
    t = lo_t
    while t <= hi_t:
        xs.append(t)
        ys.append(max(curve.min_pct, min(curve.max_pct, curve.speed_at(t))))
        t += 0.5
    plt.plot(xs, ys, marker="braille", color="cyan", label=f"curve ({curve.interpolate})")
    for index, temp, pct in marks:
        plt.scatter(
            [temp], [pct], marker="●", color="red", label=f"GPU {index}: {temp:g} C {pct} %"
        )
    plt.xlim(lo_t, hi_t)
    plt.ylim(0, 105)
    plt.xlabel("temperature C")
    plt.ylabel("fan %")
    return Text.from_ansi(plt.build())


class FanCurvePlot(Static):
    """The active fan curve; rebuilt only when the curve, a mark or the size changes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._key: object = None

    def show(self, curve: FanCurve | None, marks: list[tuple[int, float, int]]) -> bool:
        width, height = self.size.width, self.size.height
        key = (curve, tuple(marks), width, height)
        if key == self._key:
            return False
        self._key = key
        if curve is None:
            self.update(
                Text("No fan curve runs from the dashboard: the fans are the card's.", style="dim")
            )
        else:
            self.update(curve_plot(curve, width, height, marks))
        return True

    def on_resize(self) -> None:
        self._key = None
