"""Hardware control in the dashboard, a module per job.

* :mod:`~gpustation.tui.control.screen`: the control screen (draws, dispatches keys,
  owns its :class:`~gpustation.tui.control.ui.ControlUI`), the command-palette entries
* :mod:`~gpustation.tui.control.ui`: the control calls, their messages, shutdown
* :mod:`~gpustation.tui.control.dialogs`: "keep this change?" and the power cap
* :mod:`~gpustation.tui.control.fanplot`: the fan-curve plot
* :mod:`~gpustation.tui.control.journal`: the journal screen

Every change takes effect at once and reverts by itself unless kept within
``CONFIRM_TIMEOUT_S`` seconds; that deadline is the hardware layer's
(:mod:`gpustation.control.confirm`), not a dialog's.
"""

from gpustation.tui.control.dialogs import KeepChangeDialog, PowerCapDialog
from gpustation.tui.control.fanplot import FanCurvePlot, curve_plot
from gpustation.tui.control.journal import JournalScreen
from gpustation.tui.control.screen import ControlScreen, system_commands
from gpustation.tui.control.ui import CONFIRM_TIMEOUT_S, ControlUI, ordered_profiles

__all__ = [
    "CONFIRM_TIMEOUT_S",
    "ControlScreen",
    "ControlUI",
    "FanCurvePlot",
    "JournalScreen",
    "KeepChangeDialog",
    "PowerCapDialog",
    "curve_plot",
    "ordered_profiles",
    "system_commands",
]
