"""The launch form: a preset's arguments as fields built from its runner's own parser.

A runner preset's fields come from the runner's ``build_parser()`` (read off
the UI thread by :mod:`gpustation.runs.launch.runner_args`): a ``Select`` for
choices, a ``Switch`` for flags, a checked ``Input`` for numbers, the help
text under each. A command preset has no parser: its fields are typed by the
preset's own values. The GPUs are checkboxes; the argv the run would get is
shown as the fields change, and under it the run's forecast (time, GPU energy
and cost, peak memory against the GPUs' free memory), made again in a worker
from the preset's history whenever the settings change. The launch button
stays disabled while a field holds a bad value. "Save as preset" writes a
user preset of the form's settings; "run again" opens the form with a past
run's settings; "Any command…" opens :mod:`.command_form` instead, for a
command of the user's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.validation import ValidationResult, Validator
from textual.widget import Widget
from textual.widgets import Button, Checkbox, Input, Label, Select, Static, Switch

from gpustation.errors import GpustationError, UsageError
from gpustation.redact import REDACTED
from gpustation.runs.argvalue import ArgValue
from gpustation.runs.cost import Price
from gpustation.runs.forecast.make import forecast_for
from gpustation.runs.forecast.model import GpuRoom
from gpustation.runs.forecast.text import forecast_line
from gpustation.runs.launch.argv import build_argv, resolve_gpus
from gpustation.runs.launch.runner_args import (
    RunnerArg,
    cached_runner_args,
    kind_of,
    parse_text,
    runner_args,
    value_text,
)
from gpustation.runs.preset_writer import check_name, write_user_preset
from gpustation.runs.presets import RunPreset, apply_values
from gpustation.textsafe import safe
from gpustation.tui.runs.command_form import CommandDialog
from gpustation.tui.runs.launch_request import (
    GpuChoice,
    LaunchRequest,
    Prefill,
    default_gpus,
    shown_argv,
)
from gpustation.tui.widgets import set_size_classes


@dataclass
class FormField:
    """One argument of the form: its key in the preset's [args] and how to type it."""

    key: str
    kind: str
    value: ArgValue | None
    help: str = ""
    choices: tuple[str, ...] | None = None
    #: the preset has this argument (else it was added in the form)
    in_preset: bool = True


def build_fields(
    preset: RunPreset, options: list[RunnerArg] | None, prefill: Prefill | None = None
) -> tuple[list[FormField], list[RunnerArg]]:
    """The form's fields (the preset's arguments, and a past run's extras) and the
    parser's other options, which can be added."""
    by_dest = {o.dest: o for o in options or []}
    values: dict[str, ArgValue] = dict(preset.args)
    if prefill is not None:
        values.update(prefill.args)
    fields = []
    for key, value in values.items():
        option = by_dest.get(key.replace("-", "_"))
        if option is not None:
            fields.append(
                FormField(key, option.kind, value, option.help, option.choices, key in preset.args)
            )
        else:
            fields.append(FormField(key, kind_of(value), value, "", None, key in preset.args))
    used = {f.key.replace("-", "_") for f in fields}
    others = [o for o in options or [] if o.dest not in used]
    return fields, others


class ArgValidator(Validator):
    """A field's text checked as its kind (the message is the form's)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def validate(self, value: str) -> ValidationResult:
        if not value.strip() and self.kind in ("str", "list"):
            return self.success()
        try:
            parse_text(self.kind, value)
        except ValueError as err:
            return self.failure(str(err))
        return self.success()


class PresetSaved(Message):
    def __init__(self, name: str, path: str | None, error: str | None) -> None:
        super().__init__()
        self.name = name
        self.path = path
        self.error = error


class ForecastMade(Message):
    """The forecast line for the form's settings as they were when it was asked for."""

    def __init__(self, asked: int, text: str) -> None:
        super().__init__()
        self.asked = asked
        self.text = text


class ArgsRead(Message):
    def __init__(self, options: list[RunnerArg] | None, error: str | None) -> None:
        super().__init__()
        self.options = options
        self.error = error


class LaunchDialog(ModalScreen[LaunchRequest | None]):
    """The preset's arguments (from its runner's parser), the GPUs and the argv; Enter launches."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="runs.launch.cancel"),
    ]
    # Compact fields (a line each, the help under it): a runner's dozen options fit
    # at 100x30. The list scrolls; the argv and the buttons stay in view.
    DEFAULT_CSS = """
    LaunchDialog { align: center middle; }
    #launch-box {
        width: 90%; max-width: 110; min-width: 60; height: auto; max-height: 100%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    #launch-description, #launch-error, #launch-reading { width: 100%; }
    #launch-title-row { height: auto; }
    #launch-title { width: 1fr; }
    #launch-description { color: $text-muted; max-height: 3; }
    #launch-args { height: auto; margin-top: 1; }
    .launch-field { height: auto; }
    .launch-row { height: auto; }
    .launch-row > Label { width: 24; padding: 0 1 0 0; text-wrap: nowrap; text-overflow: ellipsis; }
    .launch-row > Input { width: 1fr; }
    .launch-row > Select { width: 1fr; }
    .launch-row > Switch { width: auto; height: 1; border: none; padding: 0; }
    .launch-help { color: $text-muted; padding: 0 0 0 24; height: auto; width: 100%; }
    #launch-add-row { margin-top: 1; }
    #launch-gpus { height: auto; width: 1fr; }
    #launch-argv { color: $text-muted; height: auto; padding: 0 1; border: round $panel; }
    #launch-forecast { height: auto; padding: 0 1; }
    #launch-error { color: $error; height: auto; }
    #launch-buttons { height: auto; }
    #launch-buttons Button { margin-right: 1; }
    #launch-save-name { width: 1fr; margin-right: 1; }
    LaunchDialog.-short #launch-description { display: none; }
    """

    def __init__(
        self,
        preset: RunPreset,
        device_count: int | None,
        prefill: Prefill | None = None,
        options: list[RunnerArg] | None = None,
        saved: Callable[[], None] | None = None,
        rooms: Sequence[GpuRoom] = (),
        simulated: bool = False,
        price: Price | None = None,
    ) -> None:
        super().__init__()
        #: the GPUs' memory and power limit (the dashboard's last sample), for the forecast
        self.rooms = list(rooms)
        self.simulated = simulated
        self.price = price
        #: forecasts asked for so far; a worker's answer for older settings is dropped
        self.forecasts_asked = 0
        #: called once the form's settings are saved as a preset (the list reads them again)
        self.saved = saved
        self.preset = preset
        self.device_count = device_count
        self.prefill = prefill
        if options is None and preset.runner:
            options = cached_runner_args(preset.runner)
        #: the runner's options (None: not read yet, or a command preset)
        self.options = options
        self.fields, self.others = build_fields(preset, options, prefill)
        gpus = prefill.gpus if prefill is not None and prefill.gpus is not None else None
        self.initial_gpus = gpus if gpus is not None else default_gpus(preset, device_count) or []

    @property
    def keys(self) -> list[str]:
        """The argument keys, in the order of their fields (``#arg-N``)."""
        return [f.key for f in self.fields]

    # -- building -------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        p = self.preset
        with Vertical(id="launch-box"):
            with Horizontal(id="launch-title-row"):
                yield Label(Text(f"Launch {p.display_title}", style="bold"), id="launch-title")
                yield Button("Any command…", id="command", compact=True)
            if p.description:
                yield Label(Text(p.description), id="launch-description")
            with VerticalScroll(id="launch-args"):
                for n, f in enumerate(self.fields):
                    yield self._field(n, f)
                if p.runner and self.options is None:
                    yield Label(
                        Text("reading the runner's options…", style="dim"), id="launch-reading"
                    )
            with Horizontal(classes="launch-row", id="launch-add-row"):
                yield Label("Add argument")
                yield Select(
                    self._other_options(), prompt="another option…", id="launch-add", compact=True
                )
            with Horizontal(classes="launch-row"):
                yield Label("GPUs")
                yield GpuChoice(self.device_count, self.initial_gpus, id="launch-gpus")
            yield Static(id="launch-argv")
            yield Static(Text("forecast: reading the history…", style="dim"), id="launch-forecast")
            yield Label("", id="launch-error")
            with Horizontal(id="launch-buttons"):
                yield Button("Launch (Enter)", id="launch", variant="primary", compact=True)
                yield Button("Cancel (Esc)", id="cancel", compact=True)
                yield Input(placeholder="save as: preset name", id="launch-save-name", compact=True)
                yield Button("Save as preset", id="save", compact=True)

    def _field(self, n: int, f: FormField) -> Widget:
        widget: Widget
        ident = f"arg-{n}"
        if f.kind == "bool":
            widget = Switch(bool(f.value), id=ident)
        elif f.kind == "choice" and f.choices:
            value = value_text(f.value)
            widget = Select(
                [(c, c) for c in f.choices],
                value=value if value in f.choices else Select.NULL,
                prompt="the runner's default",
                id=ident,
                compact=True,
            )
        else:
            widget = Input(
                value_text(f.value),
                validators=[ArgValidator(f.kind)],
                validate_on=["changed", "submitted"],
                placeholder="the runner's default" if f.value is None else "",
                id=ident,
                compact=True,
            )
        label = f.key if f.in_preset else f"{f.key} (added)"
        children: list[Widget] = [Horizontal(Label(label), widget, classes="launch-row")]
        if f.help:
            children.append(Label(Text(f.help), classes="launch-help"))
        return Vertical(*children, classes="launch-field")

    def _other_options(self) -> list[tuple[str, str]]:
        return [(f"{o.flag}  {o.help}"[:80], o.dest) for o in self.others]

    def on_resize(self, event: events.Resize) -> None:
        set_size_classes(self, event.size)
        # The fields scroll; the rest of the box (about 18 lines) stays in view.
        self.query_one("#launch-args").styles.max_height = max(3, event.size.height - 18)

    def _focus_first(self) -> None:
        fields = self.query("#launch-args Input, #launch-args Select, #launch-args Switch")
        if fields:
            fields.first().focus()
        else:
            self.query_one("#launch", Button).focus()

    def on_mount(self) -> None:
        self.query_one("#launch-add-row").display = bool(self.others)
        self._focus_first()
        self.refresh_state()
        if self.preset.runner and self.options is None:
            self._read_options(self.preset.runner)

    def _read_options(self, runner: str) -> None:
        def job() -> None:
            try:
                options = runner_args(runner)
            except GpustationError as err:
                self.post_message(ArgsRead(None, str(err)))
                return
            self.post_message(ArgsRead(options, None))

        self.app.run_worker(job, thread=True, exit_on_error=False, name="runner options")

    async def on_args_read(self, message: ArgsRead) -> None:
        reading = self.query("#launch-reading")
        if message.options is None:
            reading.first(Label).update(
                Text(f"{message.error}; the fields are typed by the preset", style="dim")
            )
            return
        values = self.values(strict=False)
        self.options = message.options
        self.fields, self.others = build_fields(
            self.preset, message.options, Prefill({**self.preset.args, **values})
        )
        box = self.query_one("#launch-args", VerticalScroll)
        await box.remove_children()
        await box.mount_all([self._field(n, f) for n, f in enumerate(self.fields)])
        self.query_one("#launch-add", Select).set_options(self._other_options())
        self.query_one("#launch-add-row").display = bool(self.others)
        focused = self.focused
        if focused is None or focused is box or not focused.is_attached:
            self._focus_first()  # the field that had focus was replaced
        self.refresh_state()

    async def add_argument(self, dest: str) -> None:
        """Add the parser's option ``dest`` as a field, with its default."""
        option = next((o for o in self.others if o.dest == dest), None)
        if option is None:
            return
        self.others.remove(option)
        f = FormField(dest, option.kind, option.default, option.help, option.choices, False)
        self.fields.append(f)
        await self.query_one("#launch-args", VerticalScroll).mount(
            self._field(len(self.fields) - 1, f)
        )
        self.query_one("#launch-add", Select).set_options(self._other_options())
        self.query_one("#launch-add-row").display = bool(self.others)
        self.refresh_state()

    # -- reading the form -----------------------------------------------------------------
    def values(self, strict: bool = True) -> dict[str, ArgValue]:
        """The fields' values by key (a blank field: the runner's default, left out).

        ``strict``: a bad value raises UsageError naming the field.
        """
        out: dict[str, ArgValue] = {}
        for n, f in enumerate(self.fields):
            widget = self.query_one(f"#arg-{n}")
            if isinstance(widget, Switch):
                out[f.key] = widget.value
            elif isinstance(widget, Select):
                if isinstance(widget.value, str):
                    out[f.key] = widget.value
            elif isinstance(widget, Input):
                text = widget.value.strip()
                if not text:
                    continue  # blank: the preset's value, else the runner's default
                try:
                    out[f.key] = parse_text(f.kind, text, f.choices)
                except ValueError as err:
                    if strict:
                        raise UsageError(f"{f.key}: {err}") from None
        return out

    def gpus(self) -> list[int] | None:
        """The GPUs checked (None where the machine has none to choose)."""
        return self.query_one(GpuChoice).chosen()

    def request(self) -> LaunchRequest:
        """The launch the form describes; raises UsageError with what is wrong."""
        # typed by the fields (the runner's parser): handed on as values, never as text
        overrides = {
            key: value
            for key, value in self.values().items()
            if key not in self.preset.args or value != self.preset.args[key]
        }
        applied, _, _ = apply_values(self.preset, overrides)
        gpus = self.gpus()

        resolve_gpus(applied, gpus, self.device_count)
        return LaunchRequest(self.preset, overrides, gpus)

    def argv_text(self) -> str:
        """The argv the launch would run, as a shell would read it."""

        request = self.request()
        applied, _, _ = apply_values(request.preset, request.overrides)
        gpus = request.gpus if request.gpus is not None else []
        env = f"CUDA_VISIBLE_DEVICES={','.join(map(str, gpus))} " if self.device_count else ""
        return env + shown_argv(build_argv(applied, gpus))

    def refresh_state(self) -> None:
        """Show the argv, or what is wrong; the launch button only when nothing is."""
        error = self.query_one("#launch-error", Label)
        argv = self.query_one("#launch-argv", Static)
        try:
            argv.update(Text(self.argv_text()))
        except UsageError as err:
            error.update(self._words(err))
            self.query_one("#launch", Button).disabled = True
            return
        error.update("")
        self.query_one("#launch", Button).disabled = False
        self.ask_forecast()

    def ask_forecast(self) -> None:
        """Make the forecast of the form's settings in a worker (it reads the history)."""
        try:
            request = self.request()
        except UsageError:
            return
        applied, _, _ = apply_values(request.preset, request.overrides)
        gpus = resolve_gpus(applied, request.gpus, self.device_count)
        self.forecasts_asked += 1
        asked = self.forecasts_asked
        rooms, simulated, price = self.rooms, self.simulated, self.price
        hint = f"`gpustation run {applied.name} --dry-run --probe` makes one"

        def job() -> None:
            try:
                fc = forecast_for(applied, gpus, rooms, simulated=simulated, price=price)
                text = forecast_line(fc, hint)
            except Exception as err:  # a bug must say so, not leave the line waiting
                text = safe(f"no forecast: {type(err).__name__}: {err}")
            self.post_message(ForecastMade(asked, text))

        self.app.run_worker(job, thread=True, exit_on_error=False, name="forecast")

    def on_forecast_made(self, message: ForecastMade) -> None:
        if message.asked != self.forecasts_asked:
            return  # made for settings the form no longer holds
        line = Text("forecast: ", style="bold")
        line.append(message.text)
        self.query_one("#launch-forecast", Static).update(line)

    @staticmethod
    def _words(err: UsageError) -> str:
        # the form's words for the fields the command line calls --set and --gpus
        return err.worded({"set": "", "gpus": "GPUs"}.get(err.field or "", err.field or ""))

    # -- events ------------------------------------------------------------------------
    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id != "launch-save-name":
            self.refresh_state()

    def on_switch_changed(self, event: Switch.Changed) -> None:
        self.refresh_state()

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        self.refresh_state()

    async def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "launch-add":
            if isinstance(event.value, str):
                await self.add_argument(event.value)
            return
        self.refresh_state()

    def action_launch(self) -> None:
        try:
            request = self.request()
        except UsageError as err:
            self.query_one("#launch-error", Label).update(self._words(err))
            return
        self.dismiss(request)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.input.id == "launch-save-name":
            self.action_save()
        else:
            self.action_launch()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "launch":
            self.action_launch()
        elif event.button.id == "save":
            self.action_save()
        elif event.button.id == "command":
            self.open_command_form()
        else:
            self.action_cancel()

    def open_command_form(self) -> None:
        """Launch any command instead: the command form, whose launch this form's is."""

        def chosen(request: LaunchRequest | None) -> None:
            if request is not None:
                self.dismiss(request)

        self.app.push_screen(CommandDialog(self.device_count, self.gpus()), chosen)

    # -- saving as a preset -------------------------------------------------------------
    def action_save(self) -> None:
        """Write the form's settings as a user preset (in a worker)."""
        name = self.query_one("#launch-save-name", Input).value.strip()
        error = self.query_one("#launch-error", Label)
        try:
            check_name(name)
            values = self.values()
        except UsageError as err:
            error.update(self._words(err))
            return
        preset = self.preset
        title = preset.title if name == preset.name else f"{preset.display_title} ({name})"
        saved = replace(preset, title=title)
        gpus = self.gpus()

        def job() -> None:
            try:
                path = write_user_preset(name, saved, values, gpus)
            except (GpustationError, OSError) as err:
                self.post_message(PresetSaved(name, None, str(err)))
                return
            except Exception as err:  # a bug must say so, not leave the form waiting
                self.post_message(PresetSaved(name, None, f"{type(err).__name__}: {err}"))
                return
            self.post_message(PresetSaved(name, str(path), None))

        self.app.run_worker(job, thread=True, exit_on_error=False, name="save preset")

    def on_preset_saved(self, message: PresetSaved) -> None:
        if message.error is not None:
            self.query_one("#launch-error", Label).update(f"not saved: {message.error}")
            return
        self.app.notify(f"Saved preset {message.name} ({message.path}).", title="Runs")
        if self.saved is not None:
            self.saved()


def prefill_of(run: dict[str, Any]) -> Prefill:
    """A past run's settings from its ``run.json``: the arguments it ran with and its GPUs."""
    preset = run.get("preset") or {}
    args = dict(preset.get("args") or {})
    args.update(run.get("overrides") or {})
    gpus = run.get("gpus")
    return Prefill(args, [int(g) for g in gpus] if isinstance(gpus, list) else None)


def preset_of(run: dict[str, Any], presets: dict[str, RunPreset]) -> RunPreset | None:
    """The preset a past run came from: today's of that name, else the one it
    recorded, less the variables whose values run.json does not keep."""
    data = run.get("preset") or {}
    name = data.get("name")
    if isinstance(name, str) and name in presets:
        return presets[name]
    try:
        recorded = RunPreset.from_dict(data) if data.get("name") else None
    except TypeError:
        return None
    if recorded is None:
        return None
    return replace(recorded, env={k: v for k, v in recorded.env.items() if v != REDACTED})
