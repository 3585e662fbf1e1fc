"""What the dashboard does to a GPU process: show its details, signal it after asking.

A mixin of the dashboard app (and so of the replay, which overrides
:meth:`ProcessActions.confirm_kill`: a recorded process is never signalled).
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from textual.app import App

from gpustation.textsafe import safe
from gpustation.tui.dialogs import KillDialog, ProcessDialog
from gpustation.tui.procrows import ProcRow
from gpustation.tui.readonly import refused


class ProcessActions(App[int]):
    """The process dialogs and the signal they end in, through ``_kill``."""

    #: sends a signal (the app is given os.kill, tests a fake)
    _kill: Callable[[int, int], None]

    @property
    def simulated(self) -> bool:
        """Whether the processes shown are simulated ones (the app says)."""
        return False

    def confirm_kill(self, row: ProcRow) -> None:
        """Ask, then send the chosen signal to ``row``'s process."""
        if refused(self, "signals to processes"):
            return
        simulated = self.simulated

        def done(sig: int | None) -> None:
            if sig is not None:
                self.send_signal(row, sig, simulated)

        self.push_screen(KillDialog(row, simulated), done)

    def show_process(self, row: ProcRow) -> None:
        """Show ``row``'s details and whole command line; ``k`` there asks to signal it."""
        simulated = self.simulated

        def done(choice: str | None) -> None:
            if choice == "kill":
                self.confirm_kill(row)

        self.push_screen(ProcessDialog(row, simulated), done)

    def send_signal(self, row: ProcRow, sig: int, simulated: bool) -> None:
        if refused(self, "signals to processes"):
            return
        name = signal.Signals(sig).name
        if simulated:
            # A simulated PID may be a real, unrelated process: never signal it.
            self.notify(f"PID {row.pid} is a simulated process: no signal was sent.")
            return
        try:
            self._kill(row.pid, sig)
        except PermissionError:
            self.notify(
                f"not permitted: PID {row.pid} belongs to {safe(row.user)}; "
                "run gpustation as that user or as root",
                title=f"{name} refused",
                severity="error",
                timeout=8,
            )
        except ProcessLookupError:
            self.notify(f"PID {row.pid} is already gone.", severity="warning")
        else:
            self.notify(f"Sent {name} to PID {row.pid} ({safe(row.command)[:60]}).")
