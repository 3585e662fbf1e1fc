"""The runs screen's log pane: the selected run's kept lines, followed as they come.

:class:`LogPane` holds the log (:class:`~gpustation.tui.runs.widgets.RunLog`)
and the hint under it. Selecting a run shows its kept lines; new ones are
written at the end while the user follows, and only counted while they have
scrolled back (``End`` follows again). A flood is written in bigger steps, at
most every ``FLOOD_FLUSH_S``, so the keys stay quick (``bench/log_flood.py``);
lines that come while another screen is on top are shown when the screen is
back.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.timer import Timer

from gpustation.tui.runs.controller import RunsUI
from gpustation.tui.runs.model import FLOOD_FLUSH_S, FLOOD_LINES, MAX_LOG_LINES, RunDelta, RunView
from gpustation.tui.runs.widgets import RunLog
from gpustation.tui.widgets import LiveText


class LogPane(Vertical):
    """The selected run's log (``#run-log``) and the hint under it (``#run-log-hint``)."""

    DEFAULT_CSS = "LogPane { height: 1fr; }"

    def __init__(self, ui: RunsUI, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ui = ui
        self._log_run: str | None = None
        #: lines that arrived for the shown run while the user had scrolled up
        self._unseen = 0
        #: lines for the log not written yet (a flood is written in bigger steps)
        self._pending: deque[str] = deque(maxlen=MAX_LOG_LINES)
        self._flush_timer: Timer | None = None
        self._flushed_at = 0.0
        #: lines came while the pane was not on screen: reload it when it is
        self.dirty = True

    def compose(self) -> ComposeResult:
        # One more than a run keeps: room for the "earlier lines" note.
        yield RunLog(self._log_scrolled, max_lines=MAX_LOG_LINES + 1, id="run-log")
        yield LiveText(id="run-log-hint")

    def on_mount(self) -> None:
        self.query_one("#run-log", RunLog).border_title = "Log"

    def _view(self) -> RunView | None:
        selected = self.ui.selected
        return self.ui.views.get(selected) if selected else None

    def reload(self) -> None:
        """Show the selected run's kept lines, at the end unless the user has scrolled back."""
        log = self.query_one("#run-log", RunLog)
        view = self._view()
        if self._log_run != (view.id if view else None):
            log.follow = True  # another run: start at its end
        self.dirty = False
        self._unseen = 0
        self._pending.clear()
        self._log_run = view.id if view else None
        lines: list[str] = []
        if view is not None:
            if view.dropped:
                lines.append(f"… {view.dropped:,} earlier lines in {view.run_dir / 'output.log'}")
            lines.extend(view.lines)
            log.border_title = f"Log · {view.id}"
        log.replace(lines)
        if log.follow:
            log.show_end()
        self.show_hint()

    def append(self, view: RunView, delta: RunDelta) -> None:
        """New lines for the shown run (called with each batch, so at most once a pass)."""
        if not self.is_mounted or self.app.screen is not self.screen:
            self.dirty = True
            return
        if delta.reset or self._log_run != view.id:
            self.reload()
            return
        if not delta.lines:
            return
        log = self.query_one("#run-log", RunLog)
        if log.follow:
            self._pending.extend(delta.lines)
            self._flush_soon()
        else:
            # Scrolled back: keep the view still; the lines wait in the run's buffer.
            self._unseen += len(delta.lines) + delta.dropped
            self.show_hint()

    def _flush_soon(self) -> None:
        """Write the pending lines now, or a little later during a flood."""
        if self._flush_timer is not None:
            return
        spacing = FLOOD_FLUSH_S if len(self._pending) >= FLOOD_LINES else 0.0
        wait = self._flushed_at + spacing - time.monotonic()
        if wait <= 0:
            self._flush_log()
        else:
            self._flush_timer = self.set_timer(wait, self._flush_log)

    def _flush_log(self) -> None:
        self._flush_timer = None
        self._flushed_at = time.monotonic()
        if not self._pending or not self.is_mounted:
            return
        log = self.query_one("#run-log", RunLog)
        lines = list(self._pending)
        self._pending.clear()
        if not log.follow:
            self._unseen += len(lines)
            self.show_hint()
            return
        log.write_lines(lines)
        log.show_end()

    def _log_scrolled(self) -> None:
        log = self.query_one("#run-log", RunLog)
        if log.follow and self._unseen:
            self.reload()
        else:
            self.show_hint()

    def show_hint(self) -> None:
        log = self.query_one("#run-log", RunLog)
        hint = Text()
        if not log.follow:
            hint.append(" paused — End to follow ", style="bold black on yellow")
            if self._unseen:
                hint.append(f" {self._unseen:,} new lines", style="yellow")
        elif self._log_run is not None:
            view = self.ui.views.get(self._log_run)
            if view is not None and view.active:
                hint.append("following the log", style="dim")
        self.query_one("#run-log-hint", LiveText).show(hint)

    def follow(self) -> None:
        """Follow the log again (``End``): the lines that came meanwhile, then the new ones."""
        log = self.query_one("#run-log", RunLog)
        log.follow = True
        if self._unseen:
            self.reload()
        log.show_end()
        self.show_hint()
