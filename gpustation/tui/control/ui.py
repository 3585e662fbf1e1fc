"""The dashboard's hold on hardware control: changes, their answers, shutdown.

:class:`ControlUI` owns the dashboard's :class:`~gpustation.control.live.LiveControl`.
Every control call runs in a worker thread and ends in a typed message posted
to the control screen (:class:`ChangeApplied`, :class:`ControlFailed`,
:class:`FansHandedBack`); the fan curve's polls and the confirm deadline's
outcome arrive the same way (:class:`CurvePolled`, :class:`ChangeEnded`). The
deadline itself is the hardware layer's (:mod:`gpustation.control.confirm`):
a change reverts by itself unless kept, whatever the UI is doing; the dialog
only asks. Also here: the command-palette entries of the control screen.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from typing import Any

from textual.app import App
from textual.message import Message
from textual.message_pump import MessagePump

from gpustation.control.confirm import CONFIRM_TIMEOUT_S, Outcome
from gpustation.control.live import Change, LiveControl
from gpustation.control.profiles import Profile, list_profiles
from gpustation.errors import GpustationError
from gpustation.tui.control.dialogs import KeepChangeDialog, QuitFansDialog
from gpustation.tui.dash import dashboard
from gpustation.tui.readonly import refused

__all__ = ["CONFIRM_TIMEOUT_S", "ControlUI", "ordered_profiles"]

#: the order shipped profiles get their keys in; others follow by name
PROFILE_ORDER = ("stock", "quiet", "balanced", "performance")
MAX_PROFILE_KEYS = 9


def ordered_profiles() -> list[Profile]:
    """Valid profiles, shipped ones first in a fixed order; keys 1-9 follow this order."""
    valid = [i.profile for i in list_profiles() if i.profile is not None]
    rank = {name: n for n, name in enumerate(PROFILE_ORDER)}
    valid.sort(key=lambda p: (rank.get(p.name, len(rank)), p.name))
    return valid[:MAX_PROFILE_KEYS]


# ---- what reaches the UI thread ------------------------------------------------------


class ChangeApplied(Message):
    """A change took effect and waits for its answer (its deadline is running)."""

    def __init__(self, change: Change) -> None:
        super().__init__()
        self.change = change


class ChangeEnded(Message):
    """The confirm deadline's thread reverted a change (or failed to)."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__()
        self.outcome = outcome


class ControlFailed(Message):
    """A control call failed; ``text`` says what and why."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class CurvePolled(Message):
    """The fan curve read the temperatures and set the fans."""


class FansHandedBack(Message):
    """The dashboard's fan curve stopped: the fans are the card's again."""


# ---- the control state of one dashboard ------------------------------------------------


class ControlUI:
    """Owns the dashboard's :class:`LiveControl`; turns its results into messages."""

    def __init__(self, app: App[Any]) -> None:
        self.app = app
        self.dash = dashboard(app)
        self.live: LiveControl | None = None
        #: seconds a new change waits to be kept before the hardware layer reverts it
        self.confirm_timeout_s = CONFIRM_TIMEOUT_S
        #: what happened last, for the screen's status line
        self.last_outcome: str | None = None
        #: every step of every change: ("asked" | "kept" | "reverted" | "error", text)
        self.events: list[tuple[str, str]] = []
        #: where messages go: the control screen (attached when it is composed)
        self.target: MessagePump | None = None
        self._profiles: list[Profile] | None = None
        self._signals_installed: dict[int, Any] = {}
        hooks = getattr(app, "quit_hooks", None)
        if isinstance(hooks, list):
            hooks.append(self.before_quit)
        # Made on the UI thread: the loop a signal handler hands the exit to.
        try:
            self._event_loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._event_loop = None

    # -- plumbing ----------------------------------------------------------------
    @property
    def profiles(self) -> list[Profile]:
        if self._profiles is None:
            self._profiles = ordered_profiles()
        return self._profiles

    @property
    def pending(self) -> Change | None:
        """The change waiting to be kept (None: nothing waits)."""
        return self.live.pending if self.live is not None else None

    def attach(self, screen: MessagePump) -> None:
        """Send this UI's messages to ``screen`` (the control screen)."""
        self.target = screen

    def post(self, message: Message) -> None:
        """Hand ``message`` to the control screen; safe from any thread, never waits.

        Never ``call_from_thread``: the UI thread joins the fan-curve and deadline
        threads when the dashboard closes, and one waiting on the UI would hang it.
        """
        target = self.target or self.app
        try:
            target.post_message(message)
        except RuntimeError:
            pass  # the app's loop has closed

    def _live(self) -> LiveControl | None:
        if self.live is None:
            backend = self.dash.backend
            snap = self.dash.latest
            if backend is None or snap is None:
                return None
            self.live = LiveControl(
                backend,
                [g.index for g in snap.gpus],
                on_poll=lambda report: self.post(CurvePolled()),
                on_error=lambda text: self.post(ControlFailed(text)),
                confirm_timeout_s=self.confirm_timeout_s,
                on_outcome=lambda outcome: self.post(ChangeEnded(outcome)),
            )
        return self.live

    def refresh_screens(self) -> None:
        redraw = getattr(self.target, "redraw", None)
        if redraw is not None:
            redraw()

    def error(self, text: str) -> None:
        self.last_outcome = text
        self.events.append(("error", text))
        self.app.notify(text, title="Control", severity="error", timeout=10)
        self.refresh_screens()

    def _run(self, job: Callable[[], None], name: str) -> None:
        self.app.run_worker(job, thread=True, group="control", exit_on_error=False, name=name)

    # -- changes -----------------------------------------------------------------
    def apply_profile(self, name: str) -> None:
        """Apply profile ``name`` now (in a worker), then ask to keep it."""
        profile = next((p for p in self.profiles if p.name == name), None)
        if profile is None:
            self.app.notify(f"no profile named {name!r}", severity="error")
            return
        self._change(lambda live: live.apply_profile(profile), f"apply profile {name}")

    def set_power_limit(self, index: int, watts: float) -> None:
        self._change(lambda live: live.set_power_limit(index, watts), f"power limit {watts:g} W")

    def _change(self, make: Callable[[LiveControl], Change], what: str) -> None:
        if refused(self.app, "power, fan or profile changes"):
            return
        if self.pending is not None:
            self.app.notify("Confirm or revert the last change first.", severity="warning")
            return
        live = self._live()
        if live is None:
            self.app.notify("The GPUs are not read yet; try again in a moment.", severity="warning")
            return
        self._install_signals()
        live.confirm_timeout_s = self.confirm_timeout_s

        def job() -> None:
            try:
                change = make(live)
            except GpustationError as err:
                self.post(ControlFailed(f"{what}: {err}"))
                return
            except Exception as err:  # a driver fault must not end the dashboard
                self.post(ControlFailed(f"{what}: {type(err).__name__}: {err}"))
                return
            self.post(ChangeApplied(change))

        self._run(job, f"control: {what}")

    def ask_keep(self, change: Change) -> None:
        """Show "Keep this change?" for a change whose deadline runs in control/."""
        self.events.append(("asked", change.description))
        # The last sample was read before the change: the screen behind the
        # dialog shows the new values from a pass made now.
        self.dash.sample_now()
        for note in change.notes:
            self.app.notify(note, title="Control", severity="warning", timeout=8)
        self.refresh_screens()
        live = self.live
        if live is None or live.pending is not change:
            return  # already reverted (or the dashboard is closing)

        def answered(keep: bool | None) -> None:
            if keep is None:
                return  # dismissed because the deadline reverted it
            if not keep:
                live.revert()  # on the deadline's thread; ChangeEnded follows
            elif live.confirm():
                self.last_outcome = f"kept {change.description}"
                self.events.append(("kept", change.description))
                self.app.notify(f"Kept {change.description}.", title="Control")
                self.refresh_screens()
            else:
                self.app.notify(
                    f"Too late: {change.description} is being reverted.", severity="warning"
                )

        self.app.push_screen(KeepChangeDialog(change, live.confirmer.remaining_s), answered)

    def change_ended(self, outcome: Outcome) -> None:
        """The deadline's thread reverted ``outcome.change`` (or could not)."""
        screen = self.app.screen
        if isinstance(screen, KeepChangeDialog) and screen.change is outcome.change:
            screen.dismiss(None)
        description = outcome.change.description
        if outcome.kind == "error":
            self.error(f"could not revert {description}: {outcome.error}")
            return
        undone = outcome.change.reverted_text
        self.last_outcome = f"reverted {undone}"
        self.events.append(("reverted", description))
        why = " (not kept in time)" if outcome.timed_out else ""
        self.app.notify(f"Reverted {undone}{why}.", title="Control", severity="warning")
        self.dash.sample_now()  # the screen shows what was put back, not what was undone
        self.refresh_screens()

    def fans_auto(self) -> None:
        """Stop the dashboard's fan curve: the fans go back to the card's control."""
        if refused(self.app, "fan changes"):
            return
        live = self.live
        if live is None or not live.curve_running:
            self.app.notify("No fan curve is running from the dashboard.")
            return

        def job() -> None:
            try:
                live.stop_curve()
            except GpustationError as err:
                self.post(ControlFailed(str(err)))
                return
            self.post(FansHandedBack())

        self._run(job, "control: fans auto")

    def fans_handed_back(self) -> None:
        self.app.notify("Fans are back on automatic control.")
        self.refresh_screens()

    # -- shutdown ------------------------------------------------------------------
    def before_quit(self) -> bool:
        """Asked by the app on ``q``: with a kept fan curve running, ask what becomes of it."""
        live = self.live
        if isinstance(self.app.screen, QuitFansDialog):
            return True  # already asking
        if live is None or not live.curve_running or live.curve_profile is None:
            return False
        if self.pending is not None:
            return False  # an unkept change reverts on the way out, curve and all

        def answered(choice: str | None) -> None:
            if choice == "hand_back":
                self.app.exit()  # close() stops the curve: the fans go back to the card
            elif choice == "leave":
                try:
                    pid = live.leave_curve_running()
                except (GpustationError, OSError) as err:
                    self.app.notify(str(err), title="Fan curve", severity="error")
                    return
                self.app.exit(message=f"gpustation: the fan curve goes on in process {pid}")

        self.app.push_screen(QuitFansDialog(live.curve_profile.name), answered)
        return True

    def _install_signals(self) -> None:
        """SIGTERM/SIGHUP end the dashboard cleanly: fans handed back, a change reverted."""
        if self._signals_installed or threading.current_thread() is not threading.main_thread():
            return
        loop = self._event_loop

        def handler(signum: int, frame: object) -> None:
            if self.live is not None:
                self.live.request_stop(signum)  # returns at once; threads do the work
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self.app.exit)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._signals_installed[sig] = signal.signal(sig, handler)
            except (ValueError, OSError):
                pass

    def close(self) -> None:
        """Revert an unconfirmed change, stop the fan curve, restore signal handlers.

        Runs as the dashboard closes; the UI no longer needs to stay responsive.
        """
        live, self.live = self.live, None
        self.target = None
        try:
            if live is not None:
                live.close()  # quitting is not confirming: a pending change reverts
        finally:
            for sig, previous in self._signals_installed.items():
                try:
                    signal.signal(sig, previous)
                except (ValueError, OSError):
                    pass
            self._signals_installed.clear()
