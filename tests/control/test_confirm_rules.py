"""Confirm-or-revert, in-process: the deadline is the confirmer's clock and a
change's own timeout, a change being reverted cannot be kept or reverted twice,
and closing never waits longer than it is told."""

from __future__ import annotations

import threading
import time

from gpustation.control.confirm import Change, Confirmer, Outcome

WAIT_S = 30.0  # only an upper bound: every wait below ends on an event


class Outcomes:
    """Keeps each outcome and sets ``done`` at the first."""

    def __init__(self, seen: list[Outcome], done: threading.Event) -> None:
        self.seen, self.done = seen, done

    def __call__(self, outcome: Outcome) -> None:
        self.seen.append(outcome)
        self.done.set()


class FakeClock:
    """A clock that moves only when the test moves it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_confirmer_that_never_held_a_change_closes_and_refuses_to_revert() -> None:
    confirmer = Confirmer(timeout_s=0.05)
    assert confirmer.revert() is False and confirmer.confirm() is False
    assert confirmer.remaining_s() is None
    confirmer.close()


def test_a_change_s_own_timeout_wins_over_the_confirmer_s() -> None:
    done = threading.Event()
    outcomes: list[Outcome] = []
    confirmer = Confirmer(timeout_s=3600.0, on_outcome=Outcomes(outcomes, done))
    change = Change("profile quiet", lambda: None)
    confirmer.propose(change, timeout_s=0.05)
    assert done.wait(WAIT_S)
    assert outcomes == [Outcome("reverted", change, timed_out=True)]


def test_the_deadline_is_read_on_the_confirmer_s_clock() -> None:
    clock = FakeClock(100.0)
    reverted = threading.Event()
    confirmer = Confirmer(timeout_s=0.5, clock=clock)
    confirmer.propose(Change("power limit 300 W", reverted.set))
    # Real time passes, the confirmer's clock does not: the change waits.
    assert not reverted.wait(1.0)
    assert confirmer.remaining_s() == 0.5
    clock.now = 100.0 + 0.5  # exactly the deadline
    assert reverted.wait(WAIT_S)
    assert confirmer.remaining_s() is None


def test_time_left_never_goes_below_zero() -> None:
    clock = FakeClock(10.0)
    confirmer = Confirmer(timeout_s=1.0, clock=clock)
    confirmer.propose(Change("profile balanced", lambda: None))
    clock.now = 10.25
    assert confirmer.remaining_s() == 0.75
    clock.now = 50.0  # past the deadline
    assert confirmer.remaining_s() == 0.0
    confirmer.close()
    assert confirmer.remaining_s() is None


def test_a_change_reverted_at_its_deadline_cannot_be_kept_or_reverted_again() -> None:
    started, release, done = threading.Event(), threading.Event(), threading.Event()
    outcomes: list[Outcome] = []

    def slow_revert() -> None:
        started.set()
        release.wait(WAIT_S)

    confirmer = Confirmer(timeout_s=0.01, on_outcome=Outcomes(outcomes, done))
    change = Change("power limit 300 W", slow_revert)
    confirmer.propose(change)
    assert started.wait(WAIT_S)
    # Timed out and being reverted: a late answer changes nothing.
    assert confirmer.confirm() is False
    assert confirmer.revert() is False
    assert confirmer.pending is change
    release.set()
    assert done.wait(WAIT_S)
    assert outcomes == [Outcome("reverted", change, timed_out=True)]
    assert confirmer.pending is None


def test_a_revert_that_fails_at_the_deadline_says_it_timed_out() -> None:
    done = threading.Event()
    outcomes: list[Outcome] = []

    def broken() -> None:
        raise RuntimeError("the driver is gone")

    confirmer = Confirmer(timeout_s=0.01, on_outcome=Outcomes(outcomes, done))
    change = Change("profile quiet", broken)
    confirmer.propose(change)
    assert done.wait(WAIT_S)
    assert outcomes == [Outcome("error", change, "RuntimeError: the driver is gone", True)]


def test_closing_waits_for_the_revert_no_longer_than_it_is_told() -> None:
    release, done = threading.Event(), threading.Event()
    confirmer = Confirmer(timeout_s=3600.0, on_outcome=lambda o: done.set())

    def slow_revert() -> None:
        release.wait(WAIT_S)  # a driver that takes its time

    confirmer.propose(Change("profile balanced", slow_revert))
    began = time.monotonic()
    confirmer.close(timeout_s=0.2)
    assert time.monotonic() - began < WAIT_S / 2
    assert not done.is_set()  # still reverting when close() gave up waiting
    release.set()
    assert done.wait(WAIT_S)
