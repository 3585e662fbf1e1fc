"""The runs screen's dialogs: launch a preset, stop a run, quit with runs going."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from gpustation.errors import UsageError
from gpustation.runs.presets import ArgValue, RunPreset, apply_overrides
from gpustation.telemetry.backend import parse_gpu_list
from gpustation.tui.runs.model import RunView

if TYPE_CHECKING:
    pass


# ---- dialogs --------------------------------------------------------------------------------


@dataclass
class LaunchRequest:
    preset: RunPreset
    overrides: list[str]
    gpus: list[int] | None


def _arg_text(value: ArgValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(_arg_text(v) for v in value)  # type: ignore[arg-type]
    return str(value)


def default_gpus(preset: RunPreset, device_count: int | None) -> list[int] | None:
    """The GPUs a launch would take without a choice (None when it cannot be said)."""
    from gpustation.runs.argv import resolve_gpus

    try:
        return resolve_gpus(preset, None, device_count)
    except UsageError:
        return None


class LaunchDialog(ModalScreen[LaunchRequest | None]):
    """The preset's arguments with their defaults, and the GPUs; Enter launches."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="runs.launch.cancel"),
    ]
    DEFAULT_CSS = """
    LaunchDialog { align: center middle; }
    #launch-box {
        width: 80; height: auto; max-height: 90%;
        border: thick $primary; background: $surface; padding: 1 2;
    }
    #launch-box Label { width: 100%; }
    #launch-args { height: auto; max-height: 20; }
    .launch-row { height: 3; }
    #launch-box .launch-row Label { width: 22; padding: 1 1 0 0; }
    #launch-box .launch-row Input { width: 1fr; }
    #launch-error { color: $error; height: auto; }
    #launch-buttons { height: auto; margin-top: 1; }
    #launch-buttons Button { margin-right: 2; }
    """

    def __init__(self, preset: RunPreset, device_count: int | None) -> None:
        super().__init__()
        self.preset = preset
        self.device_count = device_count
        self.keys = list(preset.args)

    def compose(self) -> ComposeResult:
        p = self.preset
        with Vertical(id="launch-box"):
            yield Label(Text(f"Launch {p.display_title}", style="bold"), id="launch-title")
            if p.description:
                yield Label(Text(p.description, style="dim"), id="launch-description")
            with VerticalScroll(id="launch-args"):
                for n, key in enumerate(self.keys):
                    with Horizontal(classes="launch-row"):
                        yield Label(key)
                        yield Input(_arg_text(p.args[key]), id=f"arg-{n}")
                with Horizontal(classes="launch-row"):
                    yield Label("GPUs")
                    gpus = default_gpus(p, self.device_count)
                    yield Input(
                        ",".join(map(str, gpus)) if gpus else "",
                        placeholder="e.g. 0,1 (empty: the preset's choice)",
                        id="launch-gpus",
                    )
            yield Label("", id="launch-error")
            with Horizontal(id="launch-buttons"):
                yield Button("Launch (Enter)", id="launch", variant="primary")
                yield Button("Cancel (Esc)", id="cancel")

    def on_mount(self) -> None:
        first = self.query(Input).first()
        first.focus()

    def request(self) -> LaunchRequest:
        """The launch the form describes; raises UsageError with what is wrong."""
        overrides: list[str] = []
        for n, key in enumerate(self.keys):
            text = self.query_one(f"#arg-{n}", Input).value.strip()
            if text != _arg_text(self.preset.args[key]):
                overrides.append(f"{key}={text}")
        applied, _, _ = apply_overrides(self.preset, overrides)
        gpus = parse_gpu_list(self.query_one("#launch-gpus", Input).value)
        from gpustation.runs.argv import resolve_gpus

        resolve_gpus(applied, gpus, self.device_count)
        return LaunchRequest(self.preset, overrides, gpus)

    def action_launch(self) -> None:
        try:
            request = self.request()
        except UsageError as err:
            # "--set" and "--gpus" are the command line's words; here they are fields.
            message = str(err).replace("--set ", "").replace("--gpus", "GPUs")
            self.query_one("#launch-error", Label).update(message)
            return
        self.dismiss(request)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_launch()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "launch":
            self.action_launch()
        else:
            self.action_cancel()


class StopRunDialog(ModalScreen[bool]):
    """Asks before stopping a run; Cancel is the default."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y,s", "answer(True)", "Stop", id="runs.stop.yes"),
        Binding("n,escape", "answer(False)", "Cancel", id="runs.stop.no"),
    ]
    DEFAULT_CSS = """
    StopRunDialog { align: center middle; }
    #stop-box {
        width: 72; height: auto; border: thick $warning; background: $surface; padding: 1 2;
    }
    #stop-box Label { width: 100%; }
    #stop-buttons { height: auto; margin-top: 1; }
    #stop-buttons Button { margin-right: 2; }
    """

    def __init__(self, view: RunView) -> None:
        super().__init__()
        self.view = view

    def compose(self) -> ComposeResult:
        v = self.view
        with Vertical(id="stop-box"):
            yield Label(Text(f"Stop {v.title or v.preset}?", style="bold"), id="stop-title")
            yield Label(f"run {v.id}", id="stop-id")
            yield Label(
                "It gets SIGINT (to save and leave), then SIGTERM, then SIGKILL if it "
                "does not end.",
                id="stop-how",
            )
            with Horizontal(id="stop-buttons"):
                yield Button("Stop run (y)", id="stop", variant="warning")
                yield Button("Cancel (n)", id="cancel", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "stop")

    def action_answer(self, stop: bool) -> None:
        self.dismiss(stop)


class QuitRunsDialog(ModalScreen[str | None]):
    """ "Stop N runs or leave them running?" when quitting with runs going."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "answer('stop')", "Stop runs", id="runs.quit.stop"),
        Binding("l", "answer('leave')", "Leave running", id="runs.quit.leave"),
        Binding("escape,c", "answer(None)", "Cancel", id="runs.quit.cancel"),
    ]
    DEFAULT_CSS = """
    QuitRunsDialog { align: center middle; }
    #quit-box {
        width: 76; height: auto; border: thick $warning; background: $surface; padding: 1 2;
    }
    #quit-box Label { width: 100%; }
    #quit-buttons { height: auto; margin-top: 1; }
    #quit-buttons Button { margin-right: 2; }
    """

    def __init__(self, views: Sequence[RunView]) -> None:
        super().__init__()
        self.views = list(views)

    def compose(self) -> ComposeResult:
        n = len(self.views)
        runs = f"{n} run{'s' if n != 1 else ''}"
        with Vertical(id="quit-box"):
            yield Label(
                Text(f"Stop {runs} or leave {'them' if n != 1 else 'it'} running?", style="bold"),
                id="quit-question",
            )
            names = ", ".join(v.preset or v.id for v in self.views[:6])
            if n > 6:
                names += f" +{n - 6}"
            yield Label(names, id="quit-runs")
            yield Label(
                "A run left running goes on without the dashboard; the next start "
                "finds it again (r).",
                id="quit-note",
            )
            with Horizontal(id="quit-buttons"):
                yield Button("Stop (s)", id="stop", variant="warning")
                yield Button("Leave running (l)", id="leave", variant="primary")
                yield Button("Cancel (Esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        choice = event.button.id
        self.dismiss(choice if choice in ("stop", "leave") else None)

    def action_answer(self, choice: str | None) -> None:
        self.dismiss(choice)
