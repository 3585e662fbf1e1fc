"""The control screen's dialogs: "keep this change?" and the power-cap picker.

The keep dialog only asks: the deadline that reverts an unanswered change is
:mod:`gpustation.control.confirm`'s, and runs whether or not this dialog is
shown. The dialog counts down from that deadline and dismisses with the
answer (True keep, False revert now); the control UI dismisses it with None
when the deadline has reverted the change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label

from gpustation.control.live import Change
from gpustation.control.power import NOT_PERSISTENT
from gpustation.telemetry.model import GpuSample
from gpustation.tui.dialogs import ChoiceDialog

#: the power-cap dialog's step
POWER_STEP_W = 10.0
#: how often the countdown is redrawn
COUNTDOWN_TICK_S = 0.25


class KeepChangeDialog(ModalScreen[bool | None]):
    """ "Keep this change?" with the countdown of the change's deadline."""

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

    def __init__(self, change: Change, remaining_s: Callable[[], float | None]) -> None:
        super().__init__()
        self.change = change
        self.description = change.description
        self._remaining_s = remaining_s

    def compose(self) -> ComposeResult:
        with Vertical(id="keep-box"):
            yield Label(f"Applied: {self.description}", id="keep-what")
            yield Label("", id="keep-countdown")
            with Horizontal(id="keep-buttons"):
                yield Button("Keep (y)", id="keep", variant="success")
                yield Button("Revert now (n)", id="revert", variant="warning")

    def on_mount(self) -> None:
        self._tick()
        self.set_interval(COUNTDOWN_TICK_S, self._tick)
        # Enter on an unread dialog must not keep a change: it presses Revert.
        self.query_one("#revert", Button).focus()

    def _tick(self) -> None:
        left = self._remaining_s()
        text = (
            "Reverting…"
            if left is None or left <= 0
            else f"Keep this change? It reverts by itself in {left:.0f} s."
        )
        self.query_one("#keep-countdown", Label).update(text)

    @property
    def countdown(self) -> str:
        """The countdown line as shown (empty until the dialog is mounted)."""
        return str(self.query_one("#keep-countdown", Label).content) if self.is_mounted else ""

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


class QuitFansDialog(ChoiceDialog):
    """ "Hand the fans back, or leave a controller running?" when quitting with a kept curve."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("h", "answer('hand_back')", "Hand back", id="control.quit.hand_back"),
        Binding("l", "answer('leave')", "Leave running", id="control.quit.leave"),
        Binding("escape,c", "answer(None)", "Cancel", id="control.quit.cancel"),
    ]
    BOX = "quitfans"
    ANSWERS = (
        ("hand_back", "Hand back (h)", "primary"),
        ("leave", "Leave running (l)", "warning"),
        ("cancel", "Cancel (c)", "default"),
    )
    DEFAULT = "hand_back"

    def __init__(self, profile: str) -> None:
        super().__init__()
        self.profile = profile

    def lines(self) -> list[tuple[str, Any]]:
        return [
            ("quitfans-what", f"The fan curve {self.profile!r} is running."),
            (
                "quitfans-question",
                "Hand the fans back to the card, or leave a controller running on its own "
                "(`gpustation fan auto` stops it later)?",
            ),
        ]
