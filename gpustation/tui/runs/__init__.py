"""Runs in the dashboard: launch a preset, follow its log and loss curve, stop it.

A module per job: :mod:`.model` (a run as the screen shows it, no textual),
:mod:`.poller` (reading run directories off the UI thread),
:mod:`.controller` (the screen's runs: views, launching, stopping, quitting;
it posts messages to the screen and never imports it), :mod:`.widgets`,
:mod:`.table` (the runs table),
:mod:`.dialogs`, the launch forms (:mod:`.form`, :mod:`.command_form`, both
dismissing with :mod:`.launch_request`'s request), :mod:`.compare`, and the
panes, each a widget handed the screen's :class:`RunsUI`: the preset list
(:mod:`.preset_pane`), the selected run's detail (:mod:`.detail`:
:mod:`.timeline`, :mod:`.profile`; :mod:`.sweeps` over it) and its log
(:mod:`.logpane`). :mod:`.screen` composes them and owns the RunsUI. The
names below are re-exported for the tests' imports.
"""

from __future__ import annotations

from gpustation.tui.runs.compare import CompareScreen
from gpustation.tui.runs.controller import RunsUI
from gpustation.tui.runs.dialogs import QuitRunsDialog, StopRunDialog
from gpustation.tui.runs.form import LaunchDialog
from gpustation.tui.runs.heap import freeze_heap
from gpustation.tui.runs.launch_request import LaunchRequest
from gpustation.tui.runs.model import MAX_LOG_LINES, RunView
from gpustation.tui.runs.screen import RunsScreen
from gpustation.tui.runs.sweeps import SweepsScreen
from gpustation.tui.runs.table import RunsTable
from gpustation.tui.runs.widgets import LossPlot, QuietFooter, RunLog

__all__ = [
    "MAX_LOG_LINES",
    "CompareScreen",
    "LaunchDialog",
    "LaunchRequest",
    "LossPlot",
    "QuietFooter",
    "QuitRunsDialog",
    "RunLog",
    "RunView",
    "RunsScreen",
    "RunsTable",
    "RunsUI",
    "StopRunDialog",
    "SweepsScreen",
    "freeze_heap",
]
