"""Hardware control in the dashboard: profiles, the power-cap dialog, the fan curve.

Every change takes effect at once and then asks "Keep this change?": unless
the user confirms within :data:`CONFIRM_TIMEOUT_S` seconds, the previous
state comes back by itself (through the same journalled control functions).
All control calls run in worker threads (:mod:`gpustation.control.live`
holds the logic); this module only draws and dispatches.
"""

from __future__ import annotations

import asyncio
import contextvars
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Footer, Label, Static

from gpustation.control import journal
from gpustation.control.live import Change, LiveControl, PollReport
from gpustation.control.power import NOT_PERSISTENT
from gpustation.control.profiles import FanCurve, Profile, list_profiles
from gpustation.errors import GpustationError
from gpustation.telemetry.model import GpuSample
from gpustation.tui.screens import LiveScreen
from gpustation.tui.source import Frame
from gpustation.tui.widgets import LiveText

if TYPE_CHECKING:
    from gpustation.tui.app import DashboardApp

#: seconds a change stays unless confirmed
CONFIRM_TIMEOUT_S = 10.0
#: the power-cap dialog's step
POWER_STEP_W = 10.0
#: the order shipped profiles get their keys in; others follow by name
PROFILE_ORDER = ("stock", "quiet", "balanced", "performance")
MAX_PROFILE_KEYS = 9


def ordered_profiles() -> list[Profile]:
    """Valid profiles, shipped ones first in a fixed order; keys 1-9 follow this order."""
    valid = [i.profile for i in list_profiles() if i.profile is not None]
    rank = {name: n for n, name in enumerate(PROFILE_ORDER)}
    valid.sort(key=lambda p: (rank.get(p.name, len(rank)), p.name))
    return valid[:MAX_PROFILE_KEYS]


# ---- the control state of one dashboard ------------------------------------------------


class ControlUI:
    """Owns the dashboard's :class:`LiveControl` and runs the confirm-or-revert flow."""

    def __init__(self, app: DashboardApp) -> None:
        self.app = app
        self.live: LiveControl | None = None
        self.confirm_timeout_s = CONFIRM_TIMEOUT_S
        self.pending: Change | None = None
        #: what happened last, for the screen's status line
        self.last_outcome: str | None = None
        #: every step of every change: ("asked" | "kept" | "reverted" | "error", text)
        self.events: list[tuple[str, str]] = []
        self._profiles: list[Profile] | None = None
        self._signals_installed: dict[int, Any] = {}
        # Made on the UI thread, so this is the app's event loop and context.
        self._context = contextvars.copy_context()
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    # -- plumbing ----------------------------------------------------------------
    @property
    def profiles(self) -> list[Profile]:
        if self._profiles is None:
            self._profiles = ordered_profiles()
        return self._profiles

    def _live(self) -> LiveControl | None:
        if self.live is None:
            backend = self.app.backend
            snap = self.app.latest
            if backend is None or snap is None:
                return None
            self.live = LiveControl(
                backend,
                [g.index for g in snap.gpus],
                on_poll=self._polled,
                on_error=lambda message: self._post(self._error, message),
            )
        return self.live

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn`` on the UI thread without waiting for it.

        Never ``call_from_thread``: the UI thread joins the fan-curve thread when
        the dashboard closes, and a curve thread waiting on the UI would hang it.
        """
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            # In the app's context, so Textual knows which app is active.
            loop.call_soon_threadsafe(fn, *args, context=self._context.copy())
        except RuntimeError:
            pass  # the app is shutting down

    def _polled(self, report: PollReport) -> None:
        self._post(self._refresh_screens)

    def _refresh_screens(self) -> None:
        for screen in self.app.screen_stack:
            if isinstance(screen, ControlScreen):
                screen.redraw()
        screen = self.app.screen
        if isinstance(screen, ControlScreen):
            screen.redraw()

    def _error(self, message: str) -> None:
        self.last_outcome = message
        self.events.append(("error", message))
        self.app.notify(message, title="Control", severity="error", timeout=10)
        self._refresh_screens()

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
        if self.pending is not None:
            self.app.notify("Confirm or revert the last change first.", severity="warning")
            return
        live = self._live()
        if live is None:
            self.app.notify("The GPUs are not read yet; try again in a moment.", severity="warning")
            return
        self._install_signals()

        def job() -> None:
            try:
                change = make(live)
            except GpustationError as err:
                self._post(self._error, f"{what}: {err}")
                return
            except Exception as err:  # a driver fault must not end the dashboard
                self._post(self._error, f"{what}: {type(err).__name__}: {err}")
                return
            self._post(self._ask_keep, change)

        self._run(job, f"control: {what}")

    def _ask_keep(self, change: Change) -> None:
        self.pending = change
        self.events.append(("asked", change.description))
        for note in change.notes:
            self.app.notify(note, title="Control", severity="warning", timeout=8)
        self._refresh_screens()

        def answered(keep: bool | None) -> None:
            if keep:
                self.pending = None
                self.last_outcome = f"kept {change.description}"
                self.events.append(("kept", change.description))
                self.app.notify(f"Kept {change.description}.", title="Control")
                self._refresh_screens()
            else:
                self._revert(change)

        self.app.push_screen(KeepChangeDialog(change.description, self.confirm_timeout_s), answered)

    def _revert(self, change: Change) -> None:
        def job() -> None:
            try:
                change.revert()
            except Exception as err:
                self._post(self._error, f"could not revert {change.description}: {err}")
            else:
                self._post(self._reverted, change)
            finally:
                self.pending = None

        self._run(job, "control: revert")

    def _reverted(self, change: Change) -> None:
        self.last_outcome = f"reverted {change.description}"
        self.events.append(("reverted", change.description))
        self.app.notify(f"Reverted {change.description}.", title="Control", severity="warning")
        self._refresh_screens()

    def fans_auto(self) -> None:
        """Stop the dashboard's fan curve: the fans go back to the card's control."""
        live = self.live
        if live is None or not live.curve_running:
            self.app.notify("No fan curve is running from the dashboard.")
            return

        def job() -> None:
            try:
                live.stop_curve()
            except GpustationError as err:
                self._post(self._error, str(err))
                return
            self._post(self.app.notify, "Fans are back on automatic control.")
            self._post(self._refresh_screens)

        self._run(job, "control: fans auto")

    # -- shutdown ------------------------------------------------------------------
    def _install_signals(self) -> None:
        """SIGTERM/SIGHUP end the dashboard cleanly so a fan curve hands its fans back."""
        if self._signals_installed or threading.current_thread() is not threading.main_thread():
            return
        loop = self._loop

        def handler(signum: int, frame: object) -> None:
            if self.live is not None and self.live._controller is not None:
                self.live._controller.request_stop(signum)
            if loop is not None:
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
        pending, self.pending = self.pending, None
        try:
            if pending is not None:
                # Quitting is not confirming.
                try:
                    pending.revert()
                except Exception:  # the fan curve below must still be stopped
                    pass
            if live is not None:
                live.close()
        finally:
            for sig, previous in self._signals_installed.items():
                try:
                    signal.signal(sig, previous)
                except (ValueError, OSError):
                    pass
            self._signals_installed.clear()


def control_ui(app: DashboardApp) -> ControlUI:
    """The app's ControlUI, made on first use."""
    ui = getattr(app, "_control_ui", None)
    if ui is None:
        ui = ControlUI(app)
        app._control_ui = ui  # type: ignore[attr-defined]
    return ui


def system_commands(app: DashboardApp, screen: Screen[Any]) -> Iterable[SystemCommand]:
    """Command-palette entries: one per profile, the power cap, the journal."""
    ui = control_ui(app)

    def on_control(action: Callable[[], None]) -> Callable[[], None]:
        # Through the control screen, so that its unmount stops a running curve.
        def run() -> None:
            if app.current_mode != "control":
                app.switch_mode("control")
            app.call_later(action)

        return run

    for n, profile in enumerate(ui.profiles, start=1):
        yield SystemCommand(
            f"Apply profile {profile.name}",
            f"{profile.description or 'hardware profile'} (key {n} on the control screen)",
            on_control(lambda name=profile.name: ui.apply_profile(name)),  # type: ignore[misc]
        )
    yield SystemCommand(
        "Set power cap",
        "power-limit dialog for the selected GPU (w on the control screen)",
        on_control(lambda: _control_screen_action(app, "power_dialog")),
    )
    yield SystemCommand(
        "Show control journal",
        "every power and fan change gpustation made (j on the control screen)",
        lambda: app.push_screen(JournalScreen()),
    )


def _control_screen_action(app: DashboardApp, action: str) -> None:
    screen = app.screen
    if isinstance(screen, ControlScreen):
        getattr(screen, f"action_{action}")()


# ---- the fan-curve plot ------------------------------------------------------------


def curve_plot(
    curve: FanCurve, width: int, height: int, marks: list[tuple[int, float, int]]
) -> Text:
    """The curve (clamped to 20-100 C) with each GPU's temperature and speed marked."""
    import plotext as plt

    plt.clear_figure()
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


# ---- dialogs -------------------------------------------------------------------------


class KeepChangeDialog(ModalScreen[bool]):
    """ "Keep this change?" with a countdown; no answer in time means revert."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Keep", id="control.keep"),
        Binding("n,escape", "answer(False)", "Revert", id="control.revert"),
    ]
    DEFAULT_CSS = """
    KeepChangeDialog { align: center middle; }
    #keep-box {
        width: 64; height: auto; border: thick $warning; background: $surface; padding: 1 2;
    }
    #keep-box Label { width: 100%; }
    #keep-buttons { height: auto; margin-top: 1; }
    #keep-buttons Button { margin-right: 2; }
    """

    def __init__(self, description: str, timeout_s: float) -> None:
        super().__init__()
        self.description = description
        self.timeout_s = timeout_s
        self._deadline = 0.0

    def compose(self) -> ComposeResult:
        with Vertical(id="keep-box"):
            yield Label(f"Applied: {self.description}", id="keep-what")
            yield Label("", id="keep-countdown")
            with Horizontal(id="keep-buttons"):
                yield Button("Keep (y)", id="keep", variant="success")
                yield Button("Revert now (n)", id="revert", variant="warning")

    def on_mount(self) -> None:
        self._deadline = time.monotonic() + self.timeout_s
        self._tick()
        self.set_interval(0.25, self._tick)
        # Enter on an unread dialog must not keep a change: it presses Revert.
        self.query_one("#revert", Button).focus()

    def _tick(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            self.dismiss(False)
            return
        self.query_one("#keep-countdown", Label).update(
            f"Keep this change? It reverts by itself in {left:.0f} s."
        )

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "keep")

    def action_answer(self, keep: bool) -> None:
        self.dismiss(keep)


class PowerCapDialog(ModalScreen[float | None]):
    """Pick a power limit with +/- steps inside the card's range."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("plus,equals_sign,up,right", "step(1)", f"+{POWER_STEP_W:g} W", id="power.up"),
        Binding("minus,underscore,down,left", "step(-1)", f"-{POWER_STEP_W:g} W", id="power.down"),
        Binding("d", "to_default", "Default", id="power.default"),
        Binding("enter", "apply", "Apply", id="power.apply"),
        Binding("escape", "cancel", "Cancel", id="power.cancel"),
    ]
    DEFAULT_CSS = """
    PowerCapDialog { align: center middle; }
    #power-box {
        width: 64; height: auto; border: thick $primary; background: $surface; padding: 1 2;
    }
    #power-box Label { width: 100%; }
    #power-value { text-style: bold; margin: 1 0; }
    #power-buttons { height: auto; }
    #power-buttons Button { margin-right: 1; min-width: 8; }
    """

    def __init__(self, sample: GpuSample, step_w: float = POWER_STEP_W) -> None:
        super().__init__()
        self.sample = sample
        self.step_w = step_w
        assert sample.power_min_w is not None and sample.power_max_w is not None
        self.lo = sample.power_min_w
        self.hi = sample.power_max_w
        start = sample.power_limit_w or sample.power_default_w or self.hi
        self.watts = min(self.hi, max(self.lo, start))

    def compose(self) -> ComposeResult:
        s = self.sample
        default = f", default {s.power_default_w:g} W" if s.power_default_w else ""
        with Vertical(id="power-box"):
            yield Label(f"Power cap for GPU {s.index} ({s.name or 'n/a'})", id="power-title")
            yield Label(f"Valid range {self.lo:g}-{self.hi:g} W{default}", id="power-range")
            yield Label("", id="power-value")
            yield Label(
                f"+/- steps of {self.step_w:g} W · d default · Enter apply · Esc cancel",
                id="power-keys",
            )
            yield Label(NOT_PERSISTENT, id="power-note")
            with Horizontal(id="power-buttons"):
                yield Button(f"-{self.step_w:g} W", id="down")
                yield Button(f"+{self.step_w:g} W", id="up")
                yield Button("Default", id="default")
                yield Button("Apply", id="apply", variant="primary")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self._show()
        # Enter applies (the change still asks to be kept); +/- work from here.
        self.query_one("#apply", Button).focus()

    def _show(self) -> None:
        s = self.sample
        pct = (
            f" ({100 * self.watts / s.power_default_w:.0f} % of default)"
            if s.power_default_w
            else ""
        )
        was = f"  (now {s.power_limit_w:g} W)" if s.power_limit_w is not None else ""
        self.query_one("#power-value", Label).update(f"{self.watts:g} W{pct}{was}")

    def action_step(self, direction: int) -> None:
        self.watts = min(self.hi, max(self.lo, self.watts + direction * self.step_w))
        self._show()

    def action_to_default(self) -> None:
        if self.sample.power_default_w is not None:
            self.watts = self.sample.power_default_w
            self._show()

    def action_apply(self) -> None:
        self.dismiss(self.watts)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        button = event.button.id
        if button == "up":
            self.action_step(1)
        elif button == "down":
            self.action_step(-1)
        elif button == "default":
            self.action_to_default()
        elif button == "apply":
            self.action_apply()
        else:
            self.action_cancel()


class JournalScreen(ModalScreen[None]):
    """The control journal, newest first (read in a worker: it is a growing file)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,j,q", "close", "Close", id="journal.close"),
    ]
    DEFAULT_CSS = """
    JournalScreen { align: center middle; }
    #journal-box { width: 90%; height: 80%; border: thick $primary; background: $surface; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="journal-box"):
            yield Static("reading the journal…", id="journal-text")

    def on_mount(self) -> None:
        self.run_worker(self._load, thread=True, exit_on_error=False)

    def _load(self) -> None:
        entries = list(journal.read_entries())
        text = Text()
        text.append(f"Control journal ({journal.journal_path()}), newest first\n\n", style="bold")
        if not entries:
            text.append("No changes recorded yet.", style="dim")
        for e in reversed(entries[-500:]):
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.time))
            fan = f" fan {e.fan}" if e.fan is not None else ""
            text.append(f"{stamp} ", style="dim")
            text.append(f"GPU {e.gpu}{fan} {e.what}: ")
            text.append(
                f"{journal.describe_value(e.what, e.previous)} -> "
                f"{journal.describe_value(e.what, e.new)}",
                style="bold",
            )
            text.append(
                f"  {e.command}" + (" [SIMULATED]" if e.simulated else "") + "\n", style="dim"
            )
        try:
            self.app.call_from_thread(self.query_one("#journal-text", Static).update, text)
        except RuntimeError:
            pass

    def action_close(self) -> None:
        self.dismiss(None)


# ---- the control screen ----------------------------------------------------------------


class ControlScreen(LiveScreen):
    """Power limits and fans of every GPU, the profiles, the active fan curve."""

    BINDINGS: ClassVar[list[BindingType]] = [
        *(
            Binding(
                str(n), f"apply_profile({n})", f"Profile {n}", show=False, id=f"control.profile.{n}"
            )
            for n in range(1, MAX_PROFILE_KEYS + 1)
        ),
        Binding("w", "power_dialog", "Power cap", id="control.power"),
        Binding("g", "next_gpu", "Next GPU", id="control.next_gpu"),
        Binding("f", "fans_auto", "Fans auto", id="control.fans_auto"),
        Binding("j", "journal", "Journal", id="control.journal"),
        Binding("escape", "app.show_dashboard", "Back", id="control.back"),
    ]
    DEFAULT_CSS = """
    #control-body { height: 1fr; }
    #control-left { width: 1fr; min-width: 50; }
    #control-gpus { height: auto; padding: 0 1; }
    #control-profiles { height: auto; padding: 1 1 0 1; }
    #control-state { height: auto; padding: 1 1 0 1; }
    #fan-plot { width: 1fr; height: 1fr; min-height: 12; }
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.selected = 0

    @property
    def ui(self) -> ControlUI:
        return control_ui(self.dash)

    def compose(self) -> ComposeResult:
        yield LiveText(id="banner")
        with Horizontal(id="control-body"):
            with VerticalScroll(id="control-left"):
                yield LiveText(id="control-gpus")
                yield LiveText(id="control-profiles")
                yield LiveText(id="control-state")
            yield FanCurvePlot(id="fan-plot")
        yield LiveText(id="status")
        yield Footer()

    def show_frame(self, frame: Frame) -> None:
        self.redraw()

    def on_unmount(self) -> None:
        # The dashboard is closing: a fan curve started here hands its fans back.
        self.ui.close()

    # -- drawing -----------------------------------------------------------------
    def _gpus(self) -> list[GpuSample]:
        snap = self.dash.latest
        return list(snap.gpus) if snap is not None else []

    def redraw(self) -> None:
        if not self.is_mounted:
            return
        gpus = self._gpus()
        live = self.ui.live
        poll = live.last_poll if live is not None else {}
        t = Text()
        if not gpus:
            t.append("waiting for the first sample…", style="dim")
        for g in gpus:
            mark = "▶ " if g.index == self.selected else "  "
            t.append(mark, style="bold cyan")
            t.append(f"GPU {g.index} ", style="bold")
            t.append(f"{g.name or 'n/a'}\n")
            temp = "n/a" if g.temperature_c is None else f"{g.temperature_c:g} C"
            limit = "n/a" if g.power_limit_w is None else f"{g.power_limit_w:g} W"
            rng = (
                f"{g.power_min_w:g}-{g.power_max_w:g} W"
                if g.power_min_w is not None and g.power_max_w is not None
                else "n/a"
            )
            default = "n/a" if g.power_default_w is None else f"{g.power_default_w:g} W"
            t.append(f"    {temp}  power limit {limit} (default {default}, range {rng})\n")
            if g.fans_pct:
                fans = ", ".join(
                    f"{pct:g} % {mode}"
                    for pct, mode in zip(g.fans_pct, g.fan_control, strict=False)
                )
                t.append(f"    fans {fans}\n")
            else:
                t.append("    no controllable fans\n", style="dim")
        self.query_one("#control-gpus", LiveText).show(t, layout=True)

        p = Text()
        p.append("Profiles", style="bold underline")
        p.append("  (a change reverts by itself unless kept within ")
        p.append(f"{self.ui.confirm_timeout_s:g} s)\n")
        applied = live.applied_profile if live is not None else None
        for n, profile in enumerate(self.ui.profiles, start=1):
            p.append(f"  {n} ", style="bold cyan")
            p.append(f"{profile.name:<12}", style="bold" if profile.name == applied else "")
            p.append(f" {profile.description}")
            if profile.name == applied:
                p.append("  ← applied", style="green")
            p.append("\n")
        self.query_one("#control-profiles", LiveText).show(p, layout=True)

        s = Text()
        curve_profile = live.curve_profile if live is not None else None
        if curve_profile is not None:
            s.append(f"Fan curve {curve_profile.name!r} running", style="green")
            s.append(" (f: back to automatic)\n")
        if self.ui.pending is not None:
            s.append(f"Waiting for confirmation: {self.ui.pending.description}\n", style="yellow")
        if self.ui.last_outcome:
            s.append(f"Last: {self.ui.last_outcome}\n", style="dim")
        s.append("Power limits do not survive a reboot or a driver reload.", style="dim")
        self.query_one("#control-state", LiveText).show(s, layout=True)

        marks: list[tuple[int, float, int]] = []
        for index, (temp, pct) in sorted(poll.items()):
            if temp is not None and pct is not None:
                marks.append((index, round(temp), pct))
        curve = curve_profile.curve if curve_profile is not None else None
        if curve is None:
            # Preview the profile that would run, marked with the fans as they are.
            for g in gpus:
                if g.temperature_c is not None and g.fans_pct:
                    marks.append((g.index, round(g.temperature_c), round(g.fans_pct[0])))
        self.query_one("#fan-plot", FanCurvePlot).show(curve, marks)

    # -- actions -----------------------------------------------------------------
    def action_apply_profile(self, n: int) -> None:
        profiles = self.ui.profiles
        if not 1 <= n <= len(profiles):
            self.notify(f"no profile on key {n}", severity="warning")
            return
        self.ui.apply_profile(profiles[n - 1].name)

    def action_next_gpu(self) -> None:
        gpus = self._gpus()
        if gpus:
            indices = [g.index for g in gpus]
            pos = indices.index(self.selected) if self.selected in indices else -1
            self.selected = indices[(pos + 1) % len(indices)]
            self.redraw()

    def action_power_dialog(self) -> None:
        sample = next((g for g in self._gpus() if g.index == self.selected), None)
        if sample is None:
            self.notify("The GPUs are not read yet.", severity="warning")
            return
        if sample.power_min_w is None or sample.power_max_w is None:
            self.notify(
                f"GPU {sample.index} does not report a power range; its limit cannot be set.",
                severity="error",
            )
            return

        def chosen(watts: float | None) -> None:
            if watts is not None:
                self.ui.set_power_limit(sample.index, watts)

        self.app.push_screen(PowerCapDialog(sample), chosen)

    def action_fans_auto(self) -> None:
        self.ui.fans_auto()

    def action_journal(self) -> None:
        self.app.push_screen(JournalScreen())
