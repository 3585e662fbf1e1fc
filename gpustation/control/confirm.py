"""Confirm-or-revert: a change is undone by itself unless confirmed in time.

A long-running program (the dashboard) makes a change at once and hands it
to a :class:`Confirmer`. From that moment a thread of the confirmer's own
waits for the deadline; unless :meth:`Confirmer.confirm` is called first,
that thread calls the change's ``revert()``. It does not depend on the
program's UI: a frozen event loop, a dialog that was closed or never drawn,
an exception on the UI thread all leave the deadline running. The thread is
not a daemon, so a program on its way out still reverts at the deadline at
the latest; :meth:`Confirmer.close` (the program's exit) reverts at once.

The confirmer never touches a UI. It reports what its thread did through
``on_outcome`` (called on that thread); a UI turns that into a message of
its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from gpustation.errors import GpustationError

#: seconds a change stays unless confirmed
CONFIRM_TIMEOUT_S = 10.0


@dataclass
class Change:
    """A change that has been made, with how to undo it."""

    description: str
    revert: Callable[[], None]
    notes: list[str] = field(default_factory=list)
    #: what a revert puts back, said after "reverted" ("GPU 0 power limit to
    #: 400 W (from 450 W)"); the description when empty
    undone: str = ""

    @property
    def reverted_text(self) -> str:
        return self.undone or self.description


@dataclass(frozen=True)
class Outcome:
    """How an unconfirmed change ended on the confirmer's thread."""

    kind: Literal["reverted", "error"]
    change: Change
    #: why the revert failed (kind "error")
    error: str | None = None
    #: True when the deadline passed; False when revert() was asked for
    timed_out: bool = False


class Confirmer:
    """Holds at most one unconfirmed change and reverts it at its deadline."""

    def __init__(
        self,
        timeout_s: float = CONFIRM_TIMEOUT_S,
        on_outcome: Callable[[Outcome], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self.on_outcome = on_outcome
        self._clock = clock
        self._cond = threading.Condition()
        self._pending: Change | None = None
        self._deadline = 0.0
        self._revert_now = False
        self._reverting = False
        self._thread: threading.Thread | None = None

    # ---- asking -------------------------------------------------------------------
    def propose(self, change: Change, timeout_s: float | None = None) -> None:
        """Start ``change``'s deadline: reverted unless confirmed within ``timeout_s``."""
        with self._cond:
            if self._pending is not None:
                raise GpustationError(
                    f"confirm or revert {self._pending.description} before another change"
                )
            self._pending = change
            self._revert_now = False
            self._deadline = self._clock() + (self.timeout_s if timeout_s is None else timeout_s)
            thread = threading.Thread(
                target=self._watch, args=(change,), name="gpustation-confirm-deadline"
            )
            self._thread = thread
            thread.start()

    @property
    def pending(self) -> Change | None:
        """The change waiting for confirmation (None: nothing is)."""
        return self._pending

    def remaining_s(self) -> float | None:
        """Seconds left to confirm, or None when nothing waits."""
        with self._cond:
            if self._pending is None:
                return None
            return max(0.0, self._deadline - self._clock())

    # ---- answering ----------------------------------------------------------------
    def confirm(self) -> bool:
        """Keep the pending change; False when none waits or it is being reverted."""
        with self._cond:
            if self._pending is None or self._reverting or self._revert_now:
                return False
            self._pending = None
            self._cond.notify_all()
            return True

    def revert(self) -> bool:
        """Revert the pending change now, on the confirmer's thread (returns at once).

        False when no change waits. The outcome comes through ``on_outcome``.
        """
        with self._cond:
            if self._pending is None or self._reverting:
                return False
            self._revert_now = True
            self._cond.notify_all()
            return True

    def close(self, timeout_s: float = 30.0) -> None:
        """The program is ending: quitting is not confirming, so revert now and wait."""
        self.revert()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    # ---- the deadline thread ------------------------------------------------------
    def _watch(self, change: Change) -> None:
        with self._cond:
            while self._pending is change and not self._revert_now:
                left = self._deadline - self._clock()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._pending is not change:
                return  # confirmed
            timed_out = not self._revert_now
            # Still pending while it is reverted: no second change can start
            # meanwhile, and a late confirm() cannot claim to have kept it.
            self._reverting = True
        try:
            change.revert()
        except Exception as err:  # reported; the thread must end either way
            outcome = Outcome("error", change, f"{type(err).__name__}: {err}", timed_out)
        else:
            outcome = Outcome("reverted", change, timed_out=timed_out)
        finally:
            with self._cond:
                self._reverting = False
                if self._pending is change:
                    self._pending = None
        if self.on_outcome is not None:
            try:
                self.on_outcome(outcome)
            except Exception:  # a listener's fault must not hide that the revert ran
                pass
