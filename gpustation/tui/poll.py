"""The one poll pattern of every screen: a worker thread that re-arms itself.

A screen (or the app) owns a :class:`Poller` whose ``work`` reads what the
screen shows (a backend, a run directory, a database) off the UI thread and
returns a typed :class:`~textual.message.Message`. The poller posts that
message to its target; the target's handler updates widgets and calls
``schedule(delay)`` for the next pass. Nothing else touches widgets from a
thread. One long-lived thread per poller (rather than a Textual worker and a
timer per pass) keeps the UI thread's cost to the message it is handed; the
dashboard's steady CPU figures are in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from textual.message import Message
from textual.message_pump import MessagePump


class Poller:
    """Runs passes of ``work`` on one long-lived thread, when scheduled.

    ``work`` runs off the UI thread and returns a typed :class:`Message` (or
    None); the poller posts it to ``target``. The handler of that message
    calls :meth:`schedule` to re-arm the next pass, so passes never overlap
    and a slow pass never queues up behind itself.
    """

    def __init__(
        self,
        work: Callable[[], Message | None],
        target: MessagePump | None = None,
        name: str = "gpustation-poller",
    ) -> None:
        self._work = work
        self._target = target
        self._name = name
        self._cond = threading.Condition()
        self._due: float | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def schedule(self, delay_s: float) -> None:
        """Run the next pass ``delay_s`` from now (replaces a pass already scheduled)."""
        with self._cond:
            if self._closed:
                return
            self._due = time.monotonic() + max(0.0, delay_s)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def run_now(self) -> None:
        """Run a pass as soon as the thread is free."""
        self.schedule(0.0)

    def cancel(self) -> None:
        """Forget the scheduled pass (one that is running finishes)."""
        with self._cond:
            self._due = None

    @property
    def pending_s(self) -> float | None:
        """Seconds until the scheduled pass, or None when none is scheduled."""
        due = self._due
        return None if due is None else max(0.0, due - time.monotonic())

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop the thread; waits up to ``timeout_s`` for a pass in progress."""
        with self._cond:
            self._closed = True
            self._due = None
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if self._due is not None:
                        wait = self._due - time.monotonic()
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait()
                if self._closed:
                    return
                self._due = None
            try:
                message = self._work()
            except Exception:  # work reports its own errors; this only keeps the thread alive
                message = None
            if message is not None and self._target is not None:
                try:
                    self._target.post_message(message)  # thread-safe in Textual
                except RuntimeError:
                    return  # the app's event loop has closed: nothing is listening
