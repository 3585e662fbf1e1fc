"""The one poll pattern: a thread's pass posts a typed message; its handler re-arms."""

from __future__ import annotations

import threading

from textual.app import App
from textual.message import Message

from gpustation.tui.poll import Poller

from .conftest import wait_for


class Counted(Message):
    def __init__(self, n: int, thread: str) -> None:
        super().__init__()
        self.n = n
        self.thread = thread


class Counter(App[None]):
    def __init__(self, passes: int) -> None:
        super().__init__()
        self.wanted = passes
        self.running = 0
        self.overlapped = False
        self.seen: list[Counted] = []
        self.failed = threading.Event()
        self.ui_thread = threading.current_thread().name
        self.poller = Poller(self.work, target=self, name="test-poller")

    def work(self) -> Counted | None:
        self.running += 1
        self.overlapped |= self.running > 1
        n = len(self.seen)
        self.running -= 1
        if n == 2:
            self.failed.set()
            raise RuntimeError("a failed pass")  # the thread survives it
        return Counted(n, threading.current_thread().name)

    def on_mount(self) -> None:
        self.poller.run_now()

    def on_counted(self, event: Counted) -> None:
        self.seen.append(event)
        if len(self.seen) < self.wanted:
            self.poller.schedule(0.0 if len(self.seen) != 2 else 0.01)

    def on_unmount(self) -> None:
        self.poller.close()


async def test_passes_post_typed_messages_and_are_re_armed_by_the_handler() -> None:
    app = Counter(passes=2)
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: len(app.seen) == 2)
        assert [m.n for m in app.seen] == [0, 1]
        assert {m.thread for m in app.seen} == {"test-poller"}
        assert app.poller.pending_s is None  # not re-armed: no more passes
        assert not app.overlapped


async def test_a_failing_pass_posts_nothing_and_the_next_schedule_runs() -> None:
    app = Counter(passes=3)
    async with app.run_test() as pilot:
        await wait_for(pilot, app.failed.is_set)
        # The third pass raised: nothing came, and nothing re-armed it.
        assert app.poller.pending_s is None and len(app.seen) == 2
        app.wanted = 4
        app.seen.append(Counted(-1, "test"))  # the next pass sees n == 3
        app.poller.run_now()
        await wait_for(pilot, lambda: len(app.seen) == 4)
        assert app.seen[-1].n == 3 and app.seen[-1].thread == "test-poller"
