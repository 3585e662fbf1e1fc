"""Tidying the history from the runs screen: delete runs, a run's note, tags.

The same writers as ``gpustation runs delete | note | tag``
(:mod:`gpustation.runs.store.tidy`), run in a worker: the screen asks (a
dialog), a worker changes the files and the index and posts
:class:`Tidied`, and the screen folds that into its views and asks the
poller for the history again. A run still going is never deleted: the
screen says so before asking, and the writer refuses it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Input, Label

from gpustation.runs.presets import RunPreset
from gpustation.runs.store.index import RunStore
from gpustation.runs.store.tidy import annotate, delete_runs
from gpustation.runs.summary import RunSummary
from gpustation.textsafe import safe
from gpustation.tui.dialogs import ChoiceDialog
from gpustation.tui.runs.model import RunView

if TYPE_CHECKING:
    from gpustation.tui.runs.controller import RunsUI

#: characters of a note's first line shown in the runs table
NOTE_CELL = 32


class Tidied(Message):
    """What a tidying worker did: runs deleted, or the runs' records after a note or tag."""

    def __init__(
        self,
        action: str,
        run_ids: list[str],
        records: Sequence[RunSummary] = (),
        error: str | None = None,
    ) -> None:
        super().__init__()
        self.action = action
        self.run_ids = run_ids
        self.records = list(records)
        self.error = error


# ---- what the table shows -------------------------------------------------------------------


def user_tags(summary: RunSummary, presets: dict[str, RunPreset] | None) -> list[str]:
    """The run's tags less its preset's own (which every run of the preset has)."""
    preset = (presets or {}).get(summary.preset or "")
    own = set(preset.tags) if preset is not None else set()
    return [t for t in summary.tags if t not in own]


def notes_cell(summary: RunSummary, presets: dict[str, RunPreset] | None) -> str:
    """The runs table's cell: the user's tags, then the note's first line (cut short)."""
    parts = [" ".join(f"#{t}" for t in user_tags(summary, presets))]
    if summary.note:
        first = summary.note.strip().splitlines()[0] if summary.note.strip() else ""
        more = "\n" in summary.note.strip()
        if len(first) > NOTE_CELL or more:
            first = first[:NOTE_CELL].rstrip() + "…"
        parts.append(first)
    return safe(" ".join(p for p in parts if p))


def names(views: Sequence[RunView], limit: int = 6) -> str:
    text = ", ".join(v.id for v in views[:limit])
    if len(views) > limit:
        text += f" +{len(views) - limit}"
    return safe(text)


# ---- the dialogs ------------------------------------------------------------------------------


class DeleteRunsDialog(ChoiceDialog):
    """ "Delete these runs?" naming them; Cancel is the default."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer('delete')", "Delete", id="runs.delete.yes"),
        Binding("escape,n", "answer(None)", "Cancel", id="runs.delete.no"),
    ]
    BOX = "delete"
    ANSWERS = (
        ("delete", "Delete (y)", "error"),
        ("cancel", "Cancel (n)", "primary"),
    )

    def __init__(self, views: Sequence[RunView]) -> None:
        super().__init__()
        self.views = list(views)

    def lines(self) -> list[tuple[str, Any]]:
        n = len(self.views)
        question = f"Delete {n} run{'s' if n != 1 else ''}?"
        return [
            ("delete-question", Text(question, style="bold")),
            ("delete-runs", names(self.views)),
            ("delete-note", "Their run directories (log, metrics, telemetry) go too."),
        ]


class NoteDialog(ModalScreen[str | None]):
    """The run's note in a field, as it is now; Enter saves (an empty note clears it)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="runs.note.cancel"),
    ]
    DEFAULT_CSS = """
    NoteDialog, TagDialog { align: center middle; }
    .tidy-box { width: 80; height: auto; border: thick $primary; background: $surface;
                padding: 1 2; }
    .tidy-box Label { width: 100%; }
    .tidy-buttons { height: auto; margin-top: 1; }
    .tidy-buttons Button { margin-right: 2; }
    """

    def __init__(self, view: RunView) -> None:
        super().__init__()
        self.view = view

    def compose(self) -> ComposeResult:
        with Vertical(id="note-box", classes="tidy-box"):
            yield Label(Text(f"Note on {safe(self.view.id)}", style="bold"), id="note-title")
            yield Input(self._current(), placeholder="a note", id="note-input")
            yield Label("Enter saves; an empty note clears it.", id="note-hint")
            with Horizontal(classes="tidy-buttons"):
                yield Button("Save (Enter)", id="save", variant="primary")
                yield Button("Cancel (Esc)", id="cancel")

    def _current(self) -> str:
        """The note as it is, made safe to draw."""
        return safe(self.view.summary.note or "")

    def on_mount(self) -> None:
        self.query_one("#note-input", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._save()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self._save()
        else:
            self.dismiss(None)

    def _save(self) -> None:
        text = self.query_one("#note-input", Input).value.strip()
        # Unchanged: nothing to write (a note of several lines stays as it is).
        self.dismiss(None if text == self._current().strip() else text)

    def action_cancel(self) -> None:
        self.dismiss(None)


class TagDialog(ModalScreen[tuple[str, list[str]] | None]):
    """Tags to add (Enter) or remove, for the selected or marked runs."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="runs.tag.cancel"),
    ]
    DEFAULT_CSS = NoteDialog.DEFAULT_CSS

    def __init__(self, views: Sequence[RunView], presets: dict[str, RunPreset] | None) -> None:
        super().__init__()
        self.views = list(views)
        self.presets = presets

    def compose(self) -> ComposeResult:
        tags: list[str] = []
        for v in self.views:
            tags += [t for t in user_tags(v.summary, self.presets) if t not in tags]
        with Vertical(id="tag-box", classes="tidy-box"):
            yield Label(Text(f"Tags of {names(self.views)}", style="bold"), id="tag-title")
            yield Label(f"now: {safe(' '.join(tags)) or 'none'}", id="tag-now")
            yield Input(placeholder="tags, separated by spaces", id="tag-input")
            yield Label("letters, digits and . _ : - + /; a preset's own tags stay", id="tag-hint")
            with Horizontal(classes="tidy-buttons"):
                yield Button("Add (Enter)", id="add", variant="primary")
                yield Button("Remove", id="remove", variant="warning")
                yield Button("Cancel (Esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#tag-input", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._answer("add")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self._answer(event.button.id or "cancel")

    def _answer(self, choice: str) -> None:
        tags = self.query_one("#tag-input", Input).value.split()
        self.dismiss((choice, tags) if choice in ("add", "remove") and tags else None)

    def action_cancel(self) -> None:
        self.dismiss(None)


# ---- asking, then the work off the UI thread ------------------------------------------------


def targets(ui: RunsUI) -> list[RunView]:
    """The marked runs, or else the selected one."""
    marked = [v for v in ui.ordered() if v.marked]
    if marked:
        return marked
    view = ui.views.get(ui.selected) if ui.selected else None
    return [view] if view is not None else []


def in_worker(screen: Screen[Any], job: Any, name: str) -> None:
    screen.app.run_worker(job, thread=True, exit_on_error=False, group="runs", name=name)


def ask_delete(screen: Screen[Any], views: Sequence[RunView]) -> None:
    """Delete ``views`` (the marked or selected runs) after a confirmation; never a run
    still going. The worker posts :class:`Tidied` to ``screen``."""
    if not views:
        screen.notify("Select a run first.", severity="warning")
        return
    going = [v for v in views if v.active]
    if going:
        screen.notify(
            f"{names(going)} {'is' if len(going) == 1 else 'are'} still going: "
            "stop it first (x), then delete it.",
            title="Not deleted",
            severity="warning",
        )
        return
    confirm_delete(screen, views)


def confirm_delete(
    screen: Screen[Any], views: Sequence[RunView], name: str = "delete runs"
) -> None:
    """Name ``views`` in a confirmation; once given, a worker deletes them (Tidied)."""
    run_ids = [v.id for v in views]

    def job() -> None:
        try:
            deleted = delete_runs(RunStore(), run_ids)
        except Exception as err:
            screen.post_message(Tidied("delete", run_ids, error=str(err)))
            return
        screen.post_message(Tidied("delete", deleted))

    def answered(choice: str | None) -> None:
        if choice == "delete":
            in_worker(screen, job, name)

    screen.app.push_screen(DeleteRunsDialog(views), answered)


def _annotate(
    screen: Screen[Any],
    action: str,
    run_ids: list[str],
    note: str | None = None,
    add: Sequence[str] = (),
    remove: Sequence[str] = (),
) -> None:
    def job() -> None:
        store = RunStore()
        try:
            records = [annotate(store, i, note=note, add=add, remove=remove) for i in run_ids]
        except Exception as err:
            screen.post_message(Tidied(action, run_ids, error=str(err)))
            return
        screen.post_message(Tidied(action, run_ids, records))

    in_worker(screen, job, f"{action} runs")


def ask_note(screen: Screen[Any], view: RunView | None) -> None:
    """Edit the selected run's note."""
    if view is None:
        screen.notify("Select a run first.", severity="warning")
        return

    def answered(text: str | None) -> None:
        if text is not None:
            _annotate(screen, "note", [view.id], note=text)

    screen.app.push_screen(NoteDialog(view), answered)


def ask_tags(
    screen: Screen[Any], views: Sequence[RunView], presets: dict[str, RunPreset] | None
) -> None:
    """Add or remove tags of ``views`` (the marked or selected runs)."""
    if not views:
        screen.notify("Select a run first.", severity="warning")
        return

    def answered(answer: tuple[str, list[str]] | None) -> None:
        if answer is None:
            return
        choice, tags = answer
        add, remove = (tags, []) if choice == "add" else ([], tags)
        _annotate(screen, "tag", [v.id for v in views], add=add, remove=remove)

    screen.app.push_screen(TagDialog(views, presets), answered)


def tidied(screen: Screen[Any], ui: RunsUI, message: Tidied) -> None:
    """Fold a worker's result into ``ui``'s views, then read the history again (the
    screen draws them again)."""
    if message.error is not None:
        screen.notify(message.error, title=f"Could not {message.action}", severity="error")
    elif message.action == "delete":
        for run_id in message.run_ids:
            ui.views.pop(run_id, None)
            ui.work.drop(run_id)
            if run_id in ui.history_ids:
                ui.history_ids.remove(run_id)
            if ui.selected == run_id:
                ui.selected = None
        n = len(message.run_ids)
        screen.notify(f"Deleted {n} run{'s' if n != 1 else ''}.", title="Runs")
    else:
        for record in message.records:
            view = ui.views.get(record.id)
            if view is not None:
                view.annotate(record.tags, record.note)
    ui.work.want_history()
    ui.poll_soon()
