"""The command form: any command as a supervised run, as ``gpustation run -- COMMAND`` does.

Opened from the launch form ("Any command…"). The command line is split as a
shell would split it (no shell runs it), the name and the ``KEY=VALUE`` lines
are checked as ``--name`` and ``--env`` are, the GPUs are checkboxes, and the
argv the run would get is shown as the fields change. It dismisses with the
same :class:`~gpustation.tui.runs.launch_request.LaunchRequest` as the launch form, so
the run starts the same way: :func:`gpustation.runs.launch.start.launch` in a worker.
"""

from __future__ import annotations

import shlex
from typing import ClassVar

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Static, TextArea

from gpustation.errors import UsageError
from gpustation.runs.launch.argv import build_argv, resolve_gpus
from gpustation.runs.presets import RunPreset, command_preset
from gpustation.tui.runs.launch_request import GpuChoice, LaunchRequest, shown_argv
from gpustation.tui.widgets import set_size_classes

#: the command line's words in messages, and the form's
_WORDS = (("--env ", "env "), ("--name ", "name "), ("--gpus", "GPUs"))


def split_command(text: str) -> list[str]:
    """The command line split as a shell would; UsageError when it cannot be, or is empty."""
    try:
        argv = shlex.split(text)
    except ValueError as err:  # an unclosed quote, a trailing backslash
        raise UsageError(f"command: {err}; quote as a shell would") from None
    if not argv:
        raise UsageError("command: give the command to run, e.g. python train.py --lr 3e-4")
    return argv


def env_lines(text: str) -> list[str]:
    """The ``KEY=VALUE`` lines of the environment field (blank lines left out)."""
    return [line.strip() for line in text.splitlines() if line.strip()]


class CommandDialog(ModalScreen[LaunchRequest | None]):
    """A command line, a name, environment lines and the GPUs; Launch starts the run."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="runs.command.cancel"),
    ]
    DEFAULT_CSS = """
    CommandDialog { align: center middle; }
    #command-box {
        width: 90%; max-width: 110; min-width: 60; height: auto; max-height: 100%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    #command-title, #command-error { width: 100%; }
    #command-box .launch-row { height: auto; margin-top: 1; }
    #command-box .launch-row > Label { width: 12; padding: 0 1 0 0; }
    #command-box .launch-row > Input { width: 1fr; }
    #command-env { width: 1fr; height: 5; }
    #command-gpus { height: auto; width: 1fr; }
    #command-argv {
        color: $text-muted; height: auto; padding: 0 1; border: round $panel; margin-top: 1;
    }
    #command-error { color: $error; height: auto; }
    #command-buttons { height: auto; }
    #command-buttons Button { margin-right: 1; }
    CommandDialog.-short #command-env { height: 3; }
    """

    def __init__(self, device_count: int | None, gpus: list[int] | None = None) -> None:
        super().__init__()
        self.device_count = device_count
        #: checked on opening (all of them, as ``gpustation run -- ...`` takes without --gpus)
        self.initial_gpus = gpus if gpus is not None else list(range(device_count or 0))

    def compose(self) -> ComposeResult:
        with Vertical(id="command-box"):
            yield Label(Text("Launch any command", style="bold"), id="command-title")
            with Horizontal(classes="launch-row"):
                yield Label("Command")
                yield Input(
                    placeholder="python train.py --lr 3e-4 (split as a shell would; no shell)",
                    id="command-line",
                    compact=True,
                )
            with Horizontal(classes="launch-row"):
                yield Label("Name")
                yield Input(placeholder="the program's name", id="command-name", compact=True)
            with Horizontal(classes="launch-row"):
                yield Label("Env")
                yield TextArea(
                    "",
                    id="command-env",
                    placeholder="KEY=VALUE, one a line",
                    soft_wrap=False,
                    show_line_numbers=False,
                    compact=True,
                )
            with Horizontal(classes="launch-row"):
                yield Label("GPUs")
                yield GpuChoice(self.device_count, self.initial_gpus, id="command-gpus")
            yield Static(id="command-argv")
            yield Label("", id="command-error")
            with Horizontal(id="command-buttons"):
                yield Button("Launch (Enter)", id="launch", variant="primary", compact=True)
                yield Button("Cancel (Esc)", id="cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one("#command-line", Input).focus()
        self.refresh_state()

    def on_resize(self, event: events.Resize) -> None:
        set_size_classes(self, event.size)

    # -- reading the form -------------------------------------------------------------------
    def gpus(self) -> list[int] | None:
        """The GPUs checked (None where the machine has none to choose)."""
        return self.query_one(GpuChoice).chosen()

    def preset(self) -> RunPreset:
        """The command preset the fields describe; raises UsageError with what is wrong."""
        argv = split_command(self.query_one("#command-line", Input).value)
        name = self.query_one("#command-name", Input).value.strip() or None
        env = env_lines(self.query_one("#command-env", TextArea).text)
        return command_preset(argv, name, env)

    def request(self) -> LaunchRequest:
        """The launch the form describes; raises UsageError with what is wrong."""

        preset = self.preset()
        gpus = self.gpus()
        resolve_gpus(preset, gpus, self.device_count)
        return LaunchRequest(preset, {}, gpus)

    def argv_text(self) -> str:
        """The environment the form adds and the argv, as a shell would read them."""

        request = self.request()
        gpus = request.gpus if request.gpus is not None else []
        env = [f"CUDA_VISIBLE_DEVICES={','.join(map(str, gpus))}"] if self.device_count else []
        env += [f"{k}={shlex.quote(v)}" for k, v in request.preset.env.items()]
        return " ".join([*env, shown_argv(build_argv(request.preset, gpus))])

    def refresh_state(self) -> None:
        """Show the argv, or what is wrong; the launch button only when nothing is."""
        error = self.query_one("#command-error", Label)
        launch = self.query_one("#launch", Button)
        try:
            text = self.argv_text()
        except UsageError as err:
            error.update(Text(self._words(err)))
            self.query_one("#command-argv", Static).update(Text(""))
            launch.disabled = True
            return
        self.query_one("#command-argv", Static).update(Text(text))
        error.update("")
        launch.disabled = False

    @staticmethod
    def _words(err: Exception) -> str:
        text = str(err)
        for cli, form in _WORDS:
            text = text.replace(cli, form)
        return text

    # -- events ----------------------------------------------------------------------------
    def on_input_changed(self, event: Input.Changed) -> None:
        self.refresh_state()

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        self.refresh_state()

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        self.refresh_state()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_launch()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "launch":
            self.action_launch()
        else:
            self.action_cancel()

    def action_launch(self) -> None:
        try:
            request = self.request()
        except UsageError as err:
            self.query_one("#command-error", Label).update(Text(self._words(err)))
            return
        self.dismiss(request)

    def action_cancel(self) -> None:
        self.dismiss(None)
