"""The control screen: power limits and fans of every GPU, profiles, the fan curve.

Keys 1-9 apply a profile, ``w`` opens the power-cap dialog, ``f`` hands the
fans back, ``j`` shows the journal. The screen draws and dispatches; the
control calls and their messages are its own
:class:`~gpustation.tui.control.ui.ControlUI`'s. The command palette's
entries (:func:`system_commands`) act through this screen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from rich.text import Text
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen

from gpustation.control.live import PollReport
from gpustation.telemetry.model import GpuSample
from gpustation.tui.control.dialogs import PowerCapDialog
from gpustation.tui.control.fanplot import FanCurvePlot
from gpustation.tui.control.journal import JournalScreen
from gpustation.tui.control.ui import (
    MAX_PROFILE_KEYS,
    ChangeApplied,
    ChangeEnded,
    ControlFailed,
    ControlUI,
    CurvePolled,
    FansHandedBack,
    ordered_profiles,
)
from gpustation.tui.footer import KeysFooter
from gpustation.tui.readonly import refused
from gpustation.tui.screens import LiveScreen
from gpustation.tui.source import Frame
from gpustation.tui.widgets import LiveText


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
    #control-body { height: 1fr; layout: vertical; }
    #control-left { width: 100%; height: 1fr; }
    #control-gpus { height: auto; padding: 0 1; }
    #control-profiles { height: auto; padding: 1 1 0 1; }
    #control-state { height: auto; padding: 1 1 0 1; }
    #fan-plot { width: 100%; height: 12; min-height: 6; }
    ControlScreen.-short #fan-plot { height: 8; }
    ControlScreen.-wide #control-body { layout: horizontal; }
    ControlScreen.-wide #control-left { width: 1fr; min-width: 40; }
    ControlScreen.-wide #fan-plot { width: 1fr; height: 1fr; min-height: 12; }
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.selected = 0
        #: the screen's control: its calls, their messages, shutdown
        self.ui = ControlUI(self.app)

    def compose(self) -> ComposeResult:
        self.ui.attach(self)
        yield LiveText(id="banner")
        with Horizontal(id="control-body"):
            with VerticalScroll(id="control-left"):
                # Wrapped: a narrow terminal folds a line, never cuts it.
                yield LiveText(id="control-gpus", wrap=True)
                yield LiveText(id="control-profiles", wrap=True)
                yield LiveText(id="control-state", wrap=True)
            yield FanCurvePlot(id="fan-plot")
        yield LiveText(id="status")
        yield KeysFooter()

    def show_frame(self, frame: Frame) -> None:
        self.redraw()

    def on_unmount(self) -> None:
        # The dashboard is closing: a pending change reverts, a fan curve started
        # here hands its fans back.
        self.ui.close()

    # -- results of control calls (posted by ControlUI from its threads) ----------
    def on_change_applied(self, event: ChangeApplied) -> None:
        self.ui.ask_keep(event.change)

    def on_change_ended(self, event: ChangeEnded) -> None:
        self.ui.change_ended(event.outcome)

    def on_control_failed(self, event: ControlFailed) -> None:
        self.ui.error(event.text)

    def on_curve_polled(self, event: CurvePolled) -> None:
        self.redraw()

    def on_fans_handed_back(self, event: FansHandedBack) -> None:
        self.ui.fans_handed_back()

    # -- drawing -----------------------------------------------------------------
    def _gpus(self) -> list[GpuSample]:
        snap = self.dash.latest
        return list(snap.gpus) if snap is not None else []

    def redraw(self) -> None:
        if not self.is_mounted:
            return
        gpus = self._gpus()
        live = self.ui.live
        poll: PollReport = live.last_poll if live is not None else {}
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
        for index, (temp_c, pct) in sorted(poll.items()):
            if temp_c is not None and pct is not None:
                marks.append((index, round(temp_c), pct))
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
        if refused(self.app, "power-limit changes"):
            return
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


# ---- the command palette ----------------------------------------------------------


def system_commands(app: App[Any], screen: Screen[Any]) -> Iterable[SystemCommand]:
    """Command-palette entries: one per profile, the power cap, the journal."""

    def on_control(action: Callable[[ControlScreen], None]) -> Callable[[], None]:
        # Through the control screen, so that its unmount stops a running curve.
        def run() -> None:
            if app.current_mode != "control":
                app.switch_mode("control")
            app.call_later(_on_control_screen, app, action)

        return run

    for n, profile in enumerate(ordered_profiles(), start=1):
        yield SystemCommand(
            f"Apply profile {profile.name}",
            f"{profile.description or 'hardware profile'} (key {n} on the control screen)",
            on_control(lambda s, name=profile.name: s.ui.apply_profile(name)),  # type: ignore[misc]
        )
    yield SystemCommand(
        "Set power cap",
        "power-limit dialog for the selected GPU (w on the control screen)",
        on_control(lambda s: s.action_power_dialog()),
    )
    yield SystemCommand(
        "Show control journal",
        "every power and fan change gpustation made (j on the control screen)",
        lambda: app.push_screen(JournalScreen()),
    )


def _on_control_screen(app: App[Any], action: Callable[[ControlScreen], None]) -> None:
    if app.current_mode == "control" and isinstance(app.screen, ControlScreen):
        action(app.screen)
