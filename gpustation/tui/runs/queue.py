"""The GPU queue, over the runs screen (``Q``): what waits, for what, and in which order.

The rows are ``gpustation queue``'s: position, run, preset, the GPUs it wants,
what it waits for (the scheduler's words), when it was submitted and its
priority. Keys act on the highlighted run as the command does: ``c`` cancels
it (after a question naming it), ``f`` moves it to the front, ``u`` and ``d``
one place up or down, and ``p`` pauses or resumes the whole queue. The queue
lives in files (``runs/queue/``): a :class:`~gpustation.tui.poll.Poller`
reads it every second, and every change is made on a worker thread, never
the UI's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from gpustation import timefmt
from gpustation.errors import GpustationError
from gpustation.runs.queue import entries as queue
from gpustation.runs.queue.scheduler import ensure_running
from gpustation.telemetry import format as fmt
from gpustation.textsafe import safe
from gpustation.tui.dialogs import ChoiceDialog
from gpustation.tui.poll import Poller
from gpustation.tui.readonly import refused
from gpustation.tui.runs.model import short_ids
from gpustation.tui.widgets import set_size_classes

#: seconds between reads of the queue
READ_EVERY_S = 1.0
COLUMNS = ("#", "run", "preset", "wants", "waits for", "submitted", "priority")


class QueueRead(Message):
    """The queue in its order, whether it is paused, or why it could not be read."""

    def __init__(
        self, order: list[queue.Entry], paused: bool, error: str | None = None, said: str = ""
    ) -> None:
        super().__init__()
        self.order = order
        self.paused = paused
        self.error = error
        #: what the change just made says (cancelled, moved ...)
        self.said = said


class CancelQueuedDialog(ChoiceDialog):
    """Cancel a queued run? (It never starts; its directory says so.)"""

    BOX = "cancel-queued"
    ANSWERS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("cancel-run", "Cancel the run", "error"),
        ("cancel", "Keep it queued", "primary"),
    )
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,n", "answer('cancel')", "Keep", id="queue.cancel.keep"),
    ]

    def __init__(self, entry: queue.Entry) -> None:
        super().__init__()
        self.entry = entry

    def lines(self) -> list[tuple[str, Text]]:
        e = self.entry
        text = Text()
        text.append(f"Cancel queued run {safe(e.id)}?\n", style="bold")
        text.append(f"{safe(e.title)}, waiting for {e.wants()}; it will not start.")
        return [("cancel-queued-text", text)]


class QueueScreen(ModalScreen[None]):
    """The queued runs and what each waits for; cancel, reorder, pause."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "cancel_run", "Cancel run", id="queue.cancel"),
        Binding("f", "first", "To the front", id="queue.first"),
        Binding("u", "move(-1)", "Up", id="queue.up"),
        Binding("d", "move(1)", "Down", id="queue.down"),
        Binding("p", "pause", "Pause/resume", id="queue.pause"),
        Binding("escape,Q,q", "close", "Close", id="queue.close"),
    ]
    DEFAULT_CSS = """
    QueueScreen { align: center middle; }
    #queue-box { width: 98%; height: 90%; border: thick $primary; background: $surface; }
    #queue-head { height: auto; padding: 0 1; }
    #queue-table { height: 1fr; }
    #queue-said { height: auto; padding: 0 1; color: $text-muted; }
    QueueScreen.-narrow #queue-box, QueueScreen.-short #queue-box { width: 100%; height: 100%; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.order: list[queue.Entry] = []
        self.paused = False
        #: the run to highlight after the next read (one just moved)
        self._follow: str | None = None
        self._poller = Poller(self._read, target=self, name="gpustation-queue")

    def compose(self) -> ComposeResult:
        with Vertical(id="queue-box"):
            yield Static("reading the queue…", id="queue-head")
            yield DataTable(id="queue-table", cursor_type="row", zebra_stripes=True)
            yield Static(id="queue-said")

    def on_mount(self) -> None:
        set_size_classes(self, self.app.size)
        box = self.query_one("#queue-box")
        box.border_title = "GPU queue"
        box.border_subtitle = "c cancel · f front · u/d up/down · p pause · Esc close"
        table = self.query_one("#queue-table", DataTable)
        for column in COLUMNS:
            table.add_column(column, key=column)
        table.focus()
        self._poller.run_now()

    def on_resize(self, event: events.Resize) -> None:
        set_size_classes(self, event.size)

    def on_unmount(self) -> None:
        self._poller.close()

    # -- reading and changing (off the UI thread) ---------------------------------------

    def _read(self, said: str = "") -> QueueRead:
        try:
            return QueueRead(queue.entries(), queue.paused(), said=said)
        except Exception as err:  # posted, so the pane says it and reads again
            known = isinstance(err, OSError | GpustationError)
            why = str(err) if known else f"{type(err).__name__}: {err}"
            return QueueRead([], False, f"could not read the queue: {why}", said)

    def _change(self, change: Callable[[], str]) -> None:
        """Make ``change`` on a worker; it returns what to say, and the queue is read again."""

        def work() -> None:
            try:
                said = change()
            except (OSError, GpustationError) as err:
                said = str(err)
            self.post_message(self._read(said))  # thread-safe

        self.run_worker(work, thread=True, exit_on_error=False, name="change the queue")

    def on_queue_read(self, message: QueueRead) -> None:
        keep, self._follow = self._follow or self.selected(), None
        self.order, self.paused = message.order, message.paused
        head = Text()
        if message.error:
            head.append(message.error, style="red")
        elif not self.order:
            head.append("The queue is empty: `gpustation run PRESET --queue` adds a run.")
        else:
            head.append(f"{len(self.order)} queued", style="bold")
            head.append(", in the order they start")
        if self.paused:
            head.append(" · PAUSED: no queued run starts (p resumes)", style="bold yellow")
        self.query_one("#queue-head", Static).update(head)
        if message.said:
            self.query_one("#queue-said", Static).update(Text(safe(message.said)))
        self._fill(keep)
        self._poller.schedule(READ_EVERY_S)

    def _fill(self, selected: str | None) -> None:
        table = self.query_one("#queue-table", DataTable)
        short = short_ids([e.id for e in self.order])
        wide = self.app.size.width >= 160
        table.clear()
        for position, e in enumerate(self.order, 1):
            table.add_row(
                str(position),
                Text(safe(e.id if wide else short.get(e.id, e.id))),
                Text(safe(e.preset)),
                e.wants(),
                Text(safe(e.waiting) if e.waiting else "not looked at yet", style="dim"),
                timefmt.recent(e.submitted_at) if e.submitted_at else fmt.NA,
                str(e.priority),
                key=e.id,
            )
        ids = [e.id for e in self.order]
        if selected in ids:
            table.move_cursor(row=ids.index(selected), animate=False)

    def selected(self) -> str | None:
        """The highlighted queued run's id (None: the queue is empty)."""
        table = self.query_one("#queue-table", DataTable)
        if not self.order or table.row_count == 0:
            return None
        row = min(table.cursor_row, len(self.order) - 1)
        return self.order[row].id

    # -- actions ----------------------------------------------------------------------

    def _entry(self) -> queue.Entry | None:
        run_id = self.selected()
        return next((e for e in self.order if e.id == run_id), None)

    def action_cancel_run(self) -> None:
        entry = self._entry()
        if entry is None or refused(self.app, "changes to the queue"):
            return

        def answered(choice: str | None) -> None:
            if choice == "cancel-run":
                self._change(lambda: f"cancelled {queue.cancel(entry.id).id}: it will not start")

        self.app.push_screen(CancelQueuedDialog(entry), answered)

    def action_first(self) -> None:
        entry = self._entry()
        if entry is None or refused(self.app, "changes to the queue"):
            return

        def first() -> str:
            queue.move(entry.id, first=True)
            return f"{entry.id} goes first"

        self._follow = entry.id
        self._change(first)

    def action_move(self, delta: int) -> None:
        entry = self._entry()
        if entry is None or refused(self.app, "changes to the queue"):
            return
        at = [e.id for e in self.order].index(entry.id)
        to = at + delta
        if not 0 <= to < len(self.order) or to == at:
            return
        if to == 0:
            self.action_first()
            return
        # just behind the run that is to be before it
        anchor = self.order[to - 1 if delta < 0 else to].id

        def move() -> str:
            queue.move(entry.id, after=anchor)
            return f"{entry.id} moved to place {to + 1}"

        self._follow = entry.id
        self._change(move)

    def action_pause(self) -> None:
        if refused(self.app, "changes to the queue"):
            return

        def resume() -> str:
            queue.resume()
            return "queue resumed" + (" (scheduler started)" if ensure_running() else "")

        def pause() -> str:
            queue.pause()
            return "queue paused: no queued run starts until it is resumed (p)"

        self._change(resume if self.paused else pause)

    def action_close(self) -> None:
        self.dismiss(None)
