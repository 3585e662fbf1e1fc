"""The selected run's detail on the runs screen: its loss curve, timeline and profile.

:class:`RunDetail` is the pane under the run header: the loss curve, the GPU
plot on the loss curve's time axis and the line of values at the cursor
(the screen's ``[`` ``]`` ``{`` ``}`` move it), and the top kernels in place
of the plots and log (``P``). Everything shown was read by the poller or a
worker: nothing here reads a file.
"""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical

from gpustation.tui.runs.controller import RunsUI
from gpustation.tui.runs.model import RunView
from gpustation.tui.runs.profile import ProfilePane
from gpustation.tui.runs.timeline import GpuPlot, TimeCursor, cursor_line
from gpustation.tui.runs.widgets import LossPlot
from gpustation.tui.widgets import LiveText


class RunDetail(Vertical):
    """The selected run's plots on one time axis, the values at the cursor, its profile."""

    # The GPU plot takes the rows under the loss curve; the profile takes the
    # plots' place (the screen hides the log then). The screen's size classes
    # give the plots their heights; 80x24 has room for neither plot nor cursor.
    DEFAULT_CSS = """
    RunDetail { height: auto; }
    RunDetail.-profile { height: 1fr; }
    RunDetail #run-profile { display: none; height: 1fr; }
    RunDetail.-profile #run-profile { display: block; }
    RunDetail.-profile #run-plot, RunDetail.-profile #run-telemetry,
    RunDetail.-profile #run-cursor { display: none; }
    """

    def __init__(self, ui: RunsUI, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ui = ui
        self.cursor = TimeCursor()

    def compose(self) -> ComposeResult:
        yield LossPlot(redraw=self.show, id="run-plot")
        yield GpuPlot(redraw=self.show, id="run-telemetry")
        yield LiveText(id="run-cursor")
        yield ProfilePane(id="run-profile")

    @property
    def profile(self) -> bool:
        """Whether the profile is shown in place of the plots."""
        return self.has_class("-profile")

    def toggle_profile(self) -> None:
        self.toggle_class("-profile")
        self.show()

    def view(self) -> RunView | None:
        selected = self.ui.selected
        return self.ui.views.get(selected) if selected else None

    def show(self) -> None:
        """The selected run's plots on its time axis, the values at the cursor, its profile."""
        if not self.is_mounted:
            return
        view = self.view()
        self.cursor.for_run(view.id if view else None)
        at = self.cursor.at_s  # None at the end: no line drawn
        self.query_one("#run-plot", LossPlot).show(view, at)
        self.query_one("#run-telemetry", GpuPlot).show(view, at)
        readout = self.query_one("#run-cursor", LiveText)
        readout.show(cursor_line(view, self.cursor, readout.content_region.width))
        if self.profile:
            self.query_one("#run-profile", ProfilePane).show(view)

    def step(self, samples: int) -> None:
        """Move the cursor ``samples`` samples back (<0) or on."""
        view = self.view()
        if view is not None and self.cursor.step(view.timeline, samples):
            self.show()

    def jump(self, direction: int) -> None:
        """Move the cursor a tenth of the run back (<0) or on."""
        view = self.view()
        if view is not None and self.cursor.jump(view.timeline, direction):
            self.show()
