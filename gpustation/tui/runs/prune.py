"""Pruning and filtering the history from the runs screen.

``D`` asks for a span and a status, as ``gpustation runs prune --older-than
SPAN [--status S]`` takes them; a worker finds the runs that ended before
then (:func:`gpustation.runs.store.tidy.prune_candidates`) and posts
:class:`PruneFound`; the screen then asks, naming them, before a worker
deletes them through the same writer as Del. ``/`` filters the runs table as
``runs list --preset NAME --tag TAG`` does, and by any text of a run too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, Input, Label, Select

from gpustation.errors import UsageError
from gpustation.runs.rundir import FINAL_STATUSES
from gpustation.runs.store.index import RunStore
from gpustation.runs.store.tidy import parse_span, prune_candidates
from gpustation.runs.summary import RunSummary
from gpustation.textsafe import safe
from gpustation.tui.runs.model import RUNS_TITLE, RunView
from gpustation.tui.runs.tidy import confirm_delete, in_worker

ANY_STATUS = "any"


class PruneFound(Message):
    """The runs a prune would delete (or why none could be looked for)."""

    def __init__(self, found: list[RunSummary], span: str, error: str | None = None) -> None:
        super().__init__()
        self.found = found
        self.span = span
        self.error = error


class PruneDialog(ModalScreen[tuple[float, str, str | None] | None]):
    """Ask for the span and the status of the runs to prune; check the span here."""

    DEFAULT_CSS = """
    PruneDialog { align: center middle; }
    #prune-box { width: 64; max-width: 100%; height: auto; border: round $warning;
                 background: $panel; padding: 1 2; }
    #prune-box Label { width: 100%; }
    #prune-error { color: $error; height: auto; }
    #prune-buttons { height: auto; margin-top: 1; }
    #prune-buttons Button { margin-right: 2; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def compose(self) -> ComposeResult:
        with Vertical(id="prune-box"):
            yield Label("Delete the runs that ended before this long ago (e.g. 12h, 30d, 4w):")
            yield Input(value="30d", id="prune-span")
            yield Label("with the status:")
            options = [(ANY_STATUS, ANY_STATUS), *((s, s) for s in FINAL_STATUSES)]
            yield Select(options, value=ANY_STATUS, allow_blank=False, id="prune-status")
            yield Label("", id="prune-error")
            with Horizontal(id="prune-buttons"):
                yield Button("Find them", id="find", variant="warning")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#prune-span", Input).focus()

    def _answer(self) -> None:
        text = self.query_one("#prune-span", Input).value
        try:
            seconds = parse_span(text, "older than")
        except UsageError as err:
            self.query_one("#prune-error", Label).update(Text(str(err)))
            return
        status = self.query_one("#prune-status", Select).value
        chosen = status if isinstance(status, str) and status != ANY_STATUS else None
        self.dismiss((seconds, text.strip(), chosen))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._answer()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "find":
            self._answer()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)


def ask_prune(screen: Screen[Any]) -> None:
    """Ask what to prune; a worker looks the runs up and posts :class:`PruneFound`."""

    def answered(answer: tuple[float, str, str | None] | None) -> None:
        if answer is None:
            return
        seconds, text, status = answer

        def job() -> None:
            try:
                found = prune_candidates(RunStore(), seconds, status)
            except Exception as err:
                screen.post_message(PruneFound([], text, error=str(err)))
                return
            screen.post_message(PruneFound(found, text))

        in_worker(screen, job, "find runs to prune")

    screen.app.push_screen(PruneDialog(), answered)


def confirm_prune(screen: Screen[Any], message: PruneFound) -> None:
    """Name the runs found and delete them once the user says so."""
    if message.error is not None:
        screen.notify(message.error, title="Could not prune", severity="error")
        return
    if not message.found:
        screen.notify(f"No run ended before {message.span} ago.", title="Prune")
        return
    confirm_delete(screen, [RunView.of(s) for s in message.found], "prune runs")


# ---- the filter ---------------------------------------------------------------------


def matches(view: RunView, text: str, user_tags: Sequence[str] = ()) -> bool:
    """Whether a run matches every word of ``text``: ``preset:NAME``, ``tag:TAG``,
    ``status:S``, or a word found (any case) in its id, preset, tags or note."""
    s = view.summary
    tags = [t.lower() for t in (*s.tags, *user_tags)]
    for word in text.lower().split():
        key, sep, value = word.partition(":")
        if sep and key == "preset":
            if (s.preset or "").lower() != value:
                return False
        elif sep and key == "tag":
            if value not in tags:
                return False
        elif sep and key == "status":
            if view.status.lower() != value:
                return False
        else:
            haystack = " ".join([view.id, s.preset or "", *tags, s.note or ""]).lower()
            if word not in haystack:
                return False
    return True


def filtered(views: Sequence[RunView], text: str) -> list[RunView]:
    """The runs matching ``text``, with the tags set from the screen on runs going."""
    return [v for v in views if matches(v, text, v.annotations[0] if v.annotations else ())]


def filter_title(text: str) -> str | Text:
    """The runs table's title under the filter ``text`` ("" none)."""
    # The user's words, shown as they are (never read as markup).
    return Text(f"Runs (filter: {safe(text)} · / changes it)") if text else RUNS_TITLE


def ask_filter(screen: Screen[Any], current: str, answered: Callable[[str], None]) -> None:
    """Ask for the filter (``current`` to start with); ``answered`` gets the new one."""

    def done(text: str | None) -> None:
        if text is not None:
            answered(text)

    screen.app.push_screen(FilterDialog(current), done)


class FilterDialog(ModalScreen[str | None]):
    """The runs table's filter: Enter sets it, an empty one shows every run."""

    DEFAULT_CSS = """
    FilterDialog { align: center middle; }
    #filter-box { width: 70; max-width: 100%; height: auto; border: round $accent;
                  background: $panel; padding: 1 2; }
    #filter-box Label { width: 100%; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: str) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="filter-box"):
            yield Label("Show the runs matching (preset:NAME tag:TAG status:S or any text):")
            yield Input(value=self.current, id="filter-text")

    def on_mount(self) -> None:
        self.query_one("#filter-text", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
