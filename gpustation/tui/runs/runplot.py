"""A plot of the selected run, redrawn only when its data, size or cursor changed.

New data for the same run arriving faster than ``PLOT_EVERY_S`` is drawn a bit
later, once, by the owner's ``redraw`` (which knows the run and cursor then);
a cursor moved by a key is drawn at once. The loss curve and the GPU
plot under it are both such plots; each says only how it draws.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from textual.timer import Timer
from textual.widgets import Static

from gpustation.tui.runs.model import PLOT_EVERY_S, RunView


class RunPlot(Static):
    def __init__(self, redraw: Callable[[], None] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: draws the current run (and cursor) again, for a draw put off
        self._redraw = redraw
        self._key: object = None
        self._drawn_at = 0.0
        self._timer: Timer | None = None
        self.draws = 0

    def show(self, view: RunView | None, cursor_s: float | None = None) -> None:
        width, height = self.content_region.width, self.content_region.height
        version = self.version(view) if view else 0
        key = (view.id if view else None, version, width, height, cursor_s)
        if key == self._key or not width:
            return
        old = self._key if isinstance(self._key, tuple) else None
        wait = self._drawn_at + PLOT_EVERY_S - time.monotonic()
        if old is not None and old[0] == key[0] and old[1] != version and wait > 0:
            if self._timer is None:
                self._timer = self.set_timer(wait, lambda: self._later(view))
            return
        self._key = key
        self._drawn_at = time.monotonic()
        # The stylesheet fixes the size: no relayout of the screen.
        if self.draw(view, width, height, cursor_s):
            self.draws += 1

    def shows(self, view: RunView | None) -> bool:
        """Whether the figure on screen is ``view``'s latest, at the plot's size."""
        width, height = self.content_region.width, self.content_region.height
        version = self.version(view) if view else 0
        key = self._key if isinstance(self._key, tuple) else None
        return key is not None and key[:4] == (view.id if view else None, version, width, height)

    def version(self, view: RunView) -> object:
        """What changes when the figure's data does (its redraw key)."""
        return view.curve_version

    def draw(self, view: RunView | None, width: int, height: int, cursor_s: float | None) -> bool:
        """Put the figure (or a line saying why there is none); True when a figure was drawn."""
        raise NotImplementedError

    def _later(self, view: RunView | None) -> None:
        self._timer = None
        # The owner's current run (and cursor), which may have changed since this was asked.
        if self._redraw is not None:
            self._redraw()
        else:
            self.show(view)

    def on_resize(self) -> None:
        self._key = None
