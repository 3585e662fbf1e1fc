"""The selected run's detail on the runs screen: its timeline, its profile, its sweep.

:class:`RunDetailScreen` is what :class:`~gpustation.tui.runs.screen.RunsScreen`
adds under the loss curve and the keys for it: the GPU plot on the loss
curve's time axis and the line of values at the cursor (``[`` ``]`` ``{``
``}``), the top kernels in place of the plots and log (``P``), and the
sweeps over the screen (``S``). Everything shown was read by the poller or a
worker: nothing here reads a file.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from textual.binding import Binding, BindingType
from textual.widget import Widget
from textual.widgets import DataTable

from gpustation.tui.runs.controller import RunsUI
from gpustation.tui.runs.model import RunView
from gpustation.tui.runs.profile import ProfilePane
from gpustation.tui.runs.sweeps import SweepsScreen, sweep_of
from gpustation.tui.runs.timeline import GpuPlot, TimeCursor, cursor_line
from gpustation.tui.runs.widgets import LossPlot
from gpustation.tui.screens import LiveScreen
from gpustation.tui.widgets import LiveText


class RunDetailScreen(LiveScreen):
    """The runs screen's detail of the selected run (the screen supplies ``current_view``)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("P", "profile", "Profile", show=False, id="runs.profile"),
        Binding("S", "sweeps", "Sweeps", show=False, id="runs.sweeps"),
        # the timeline's cursor: a sample back or on, a tenth of the run back or on
        Binding("left_square_bracket", "time(-1)", "Earlier", show=False, id="runs.earlier"),
        Binding("right_square_bracket", "time(1)", "Later", show=False, id="runs.later"),
        Binding("left_curly_bracket", "jump(-1)", "Much earlier", show=False, id="runs.jump_back"),
        Binding("right_curly_bracket", "jump(1)", "Much later", show=False, id="runs.jump_on"),
    ]
    # The GPU plot takes the rows under the loss curve; the profile takes the
    # plots' and the log's place. 80x24 has room for neither plot nor cursor.
    DEFAULT_CSS = """
    RunDetailScreen #run-telemetry { height: 9; }
    RunDetailScreen #run-cursor { height: 1; padding: 0 1; }
    RunDetailScreen #run-profile { display: none; height: 1fr; }
    RunDetailScreen.-profile #run-profile { display: block; }
    RunDetailScreen.-profile #run-plot, RunDetailScreen.-profile #run-telemetry,
    RunDetailScreen.-profile #run-cursor, RunDetailScreen.-profile #run-log,
    RunDetailScreen.-profile #run-log-hint { display: none; }
    RunDetailScreen.-short #run-telemetry { height: 6; }
    RunDetailScreen.-tall #run-telemetry { height: 12; }
    RunDetailScreen.-narrow.-short #run-telemetry { display: none; }
    RunDetailScreen.-narrow.-short #run-cursor { display: none; }
    """

    #: the screen's runs (set by the screen)
    ui: RunsUI

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cursor = TimeCursor()
        #: whether the energy column was last labelled with a cost
        self._priced: bool | None = None

    def current_view(self) -> RunView | None:  # pragma: no cover - the screen's
        raise NotImplementedError

    def compose_detail(self) -> Iterator[Widget]:
        """The widgets under the loss curve."""
        yield GpuPlot(id="run-telemetry")
        yield LiveText(id="run-cursor")
        yield ProfilePane(id="run-profile")

    def show_detail(self) -> None:
        """The selected run's plots on its time axis, the values at the cursor, its profile."""
        if not self.is_mounted:
            return
        view = self.current_view()
        self._cursor.for_run(view.id if view else None)
        at = self._cursor.at_s  # None at the end: no line drawn
        self.query_one("#run-plot", LossPlot).show(view, at)
        self.query_one("#run-telemetry", GpuPlot).show(view, at)
        readout = self.query_one("#run-cursor", LiveText)
        readout.show(cursor_line(view, self._cursor, readout.content_region.width))
        if self.has_class("-profile"):
            self.query_one("#run-profile", ProfilePane).show(view)

    def price_changed(self, columns: Sequence[tuple[str, str]]) -> bool:
        """Label the energy column for the price known now; True: the rows must be made again.

        ``columns``: the runs table's (label, key), the energy column's key ``energy``.
        """
        priced = self.ui.price is not None
        if priced == self._priced:
            return False
        self._priced = priced
        table = self.query_one("#runs-table", DataTable)
        table.clear(columns=True)
        for label, key in columns:
            if key == "energy" and priced:
                label = "energy · cost"
            table.add_column(label, key=key)
        return True

    # -- keys ------------------------------------------------------------------------
    def action_time(self, samples: int) -> None:
        view = self.current_view()
        if view is not None and self._cursor.step(view.timeline, samples):
            self.show_detail()

    def action_jump(self, direction: int) -> None:
        view = self.current_view()
        if view is not None and self._cursor.jump(view.timeline, direction):
            self.show_detail()

    def action_profile(self) -> None:
        self.toggle_class("-profile")
        self.show_detail()

    def action_sweeps(self) -> None:
        view = self.current_view()
        self.app.push_screen(SweepsScreen(sweep_of(view.summary.tags) if view else None))
