"""The confirm-or-revert deadline, without any UI."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpustation.control.confirm import Change, Confirmer, Outcome
from gpustation.control.live import LiveControl
from gpustation.control.profiles import Profile
from gpustation.errors import GpustationError
from tests.control.conftest import RecordingSim

WAIT_S = 30.0  # only an upper bound: every wait below ends on an event


class Recorder:
    """A change's revert and the confirmer's outcomes, each with an event to wait on."""

    def __init__(self) -> None:
        self.reverted_on: list[str] = []
        self.outcomes: list[Outcome] = []
        self.done = threading.Event()

    def revert(self) -> None:
        self.reverted_on.append(threading.current_thread().name)

    def outcome(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        self.done.set()


def test_an_unconfirmed_change_is_reverted_by_the_confirmer_s_own_thread() -> None:
    rec = Recorder()
    confirmer = Confirmer(timeout_s=0.05, on_outcome=rec.outcome)
    change = Change("power limit 300 W", rec.revert)
    confirmer.propose(change)
    assert confirmer.pending is change
    # Nothing else runs: no UI, no event loop, no call from the caller.
    assert rec.done.wait(WAIT_S)
    assert rec.reverted_on == ["gpustation-confirm-deadline"]
    assert rec.outcomes == [Outcome("reverted", change, timed_out=True)]
    assert confirmer.pending is None
    assert confirmer.confirm() is False  # too late to keep it


def test_a_confirmed_change_stays() -> None:
    rec = Recorder()
    confirmer = Confirmer(timeout_s=120.0, on_outcome=rec.outcome)
    confirmer.propose(Change("profile quiet", rec.revert))
    remaining = confirmer.remaining_s()
    assert remaining is not None and 0 < remaining <= 120.0
    assert confirmer.confirm() is True
    assert confirmer._thread is not None
    confirmer._thread.join(WAIT_S)  # the deadline thread ends with the answer
    assert not confirmer._thread.is_alive()
    assert rec.reverted_on == [] and rec.outcomes == []
    assert confirmer.pending is None and confirmer.remaining_s() is None
    confirmer.close()  # nothing to revert on exit
    assert rec.reverted_on == []


def test_revert_now_runs_on_the_confirmer_s_thread_and_returns_at_once() -> None:
    release = threading.Event()
    rec = Recorder()

    def slow_revert() -> None:
        release.wait(WAIT_S)  # a driver that takes its time
        rec.revert()

    confirmer = Confirmer(timeout_s=120.0, on_outcome=rec.outcome)
    change = Change("profile balanced", slow_revert)
    confirmer.propose(change)
    assert confirmer.revert() is True  # returned while the revert is still blocked
    assert not rec.done.is_set()
    assert confirmer.confirm() is False  # being reverted: it cannot be kept any more
    with pytest.raises(GpustationError, match="confirm or revert profile balanced"):
        confirmer.propose(Change("another", rec.revert))
    release.set()
    assert rec.done.wait(WAIT_S)
    assert rec.outcomes == [Outcome("reverted", change, timed_out=False)]
    assert rec.reverted_on == ["gpustation-confirm-deadline"]


def test_closing_reverts_an_unconfirmed_change_and_a_failed_revert_is_reported() -> None:
    rec = Recorder()

    def broken() -> None:
        raise OSError("driver gone")

    confirmer = Confirmer(timeout_s=120.0, on_outcome=rec.outcome)
    change = Change("power limit 200 W", broken)
    confirmer.propose(change)
    confirmer.close()  # the program ends: quitting is not confirming
    assert rec.outcomes == [Outcome("error", change, "OSError: driver gone", timed_out=False)]
    assert confirmer.pending is None


def test_live_control_changes_revert_by_themselves(sim: RecordingSim) -> None:
    rec = Recorder()
    live = LiveControl(sim, [0, 1], confirm_timeout_s=0.05, on_outcome=rec.outcome)
    try:
        change = live.set_power_limit(0, 300.0)
        assert live.pending is change
        assert rec.done.wait(WAIT_S)
        assert [o.kind for o in rec.outcomes] == ["reverted"]
        assert sim.set_calls == [("power", 0, 300.0), ("power", 0, 450.0)]

        rec.done.clear()
        live.confirm_timeout_s = 120.0
        live.set_power_limit(1, 400.0)
        with pytest.raises(GpustationError, match="first"):
            live.apply_profile(Profile(name="x", path=Path("x.toml")))
        assert live.confirm() is True
        assert live.pending is None
    finally:
        live.close()
    assert sim.read_gpus([1], slow=False)[0].power_limit_w == 400.0  # kept
