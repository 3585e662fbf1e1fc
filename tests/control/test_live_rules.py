"""A dashboard's live control, in-process on simulated cards: a profile's power and
fans, what its revert puts back, and the notes for cards without fans."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from gpustation.control import journal
from gpustation.control.confirm import Outcome
from gpustation.control.live import LiveControl
from gpustation.control.profiles import load_profile
from gpustation.errors import GpustationError
from tests.control.conftest import RecordingSim

WAIT_S = 30.0  # an upper bound: every wait ends on an event


def _modes(sim: RecordingSim, indices: list[int]) -> set[str]:
    return {m for s in sim.read_gpus(indices, slow=False) for m in s.fan_control}


def test_a_profile_sets_power_and_runs_its_curve_and_its_revert_puts_both_back(
    sim: RecordingSim,
) -> None:
    done = threading.Event()
    outcomes: list[Outcome] = []

    def outcome(o: Outcome) -> None:
        outcomes.append(o)
        done.set()

    polled = threading.Event()
    live = LiveControl(
        sim,
        [0, 1],
        command="gpustation dashboard",
        confirm_timeout_s=120.0,
        on_outcome=outcome,
        on_poll=lambda _r: polled.set(),
    )
    try:
        sim.control.set_power_limit(0, 400.0)
        balanced = load_profile("balanced")
        change = live.apply_profile(balanced)
        assert change.description == "profile balanced" and change.notes == []
        assert live.pending is change and live.applied_profile == "balanced"
        assert [s.power_limit_w for s in sim.read_gpus([0, 1], slow=False)] == [351.0, 351.0]
        assert live.curve_running and live.curve_profile is balanced
        assert polled.wait(WAIT_S) and set(live.last_poll) <= {0, 1} and live.last_poll
        commands = {e.command for e in journal.read_journal().entries}
        assert "gpustation dashboard: profile balanced" in commands
        assert live.revert() is True
        assert done.wait(WAIT_S)
        assert [o.kind for o in outcomes] == ["reverted"]
        assert [s.power_limit_w for s in sim.read_gpus([0, 1], slow=False)] == [400.0, 450.0]
        assert not live.curve_running and live.curve_profile is None
        assert _modes(sim, [0, 1]) == {"auto"}
        assert live.applied_profile is None
        assert "gpustation dashboard: revert profile balanced" in {
            e.command for e in journal.read_journal().entries
        }
    finally:
        live.close()


def test_a_profile_that_hands_fans_back_stops_a_running_curve(sim: RecordingSim) -> None:
    live = LiveControl(sim, [0], confirm_timeout_s=120.0)
    try:
        live.apply_profile(load_profile("balanced"))
        assert live.confirm() and live.curve_running
        stock = live.apply_profile(load_profile("stock"))
        assert not live.curve_running and _modes(sim, [0]) == {"auto"}
        assert sim.read_gpus([0], slow=False)[0].power_limit_w == 450.0
        assert live.applied_profile == "stock"
        assert stock.description == "profile stock"
        done = threading.Event()
        live.confirmer.on_outcome = lambda _o: done.set()
        live.revert()
        assert done.wait(WAIT_S)
        # the curve the dashboard ran before comes back with its limit
        assert live.curve_running and live.curve_profile is not None
        assert live.curve_profile.name == "balanced" and live.applied_profile == "balanced"
        assert sim.read_gpus([0], slow=False)[0].power_limit_w == 351.0
    finally:
        live.close()
    assert not live.curve_running and _modes(sim, [0]) == {"auto"}


def test_cards_without_fans_get_the_power_part_and_a_note(sim_h200: RecordingSim) -> None:
    live = LiveControl(sim_h200, [0], confirm_timeout_s=120.0)
    try:
        change = live.apply_profile(load_profile("balanced"))
        assert change.notes == ["no controllable fans on GPU 0: power only there"]
        assert not live.curve_running
        assert live.confirm()
    finally:
        live.close()


def test_a_power_limit_change_says_what_it_was_and_reverts_to_it(sim: RecordingSim) -> None:
    done = threading.Event()
    live = LiveControl(sim, [0, 1], confirm_timeout_s=120.0, on_outcome=lambda _o: done.set())
    try:
        change = live.set_power_limit(1, 300.0)
        assert change.description == "GPU 1 power limit 450 W -> 300 W"
        assert sim.read_gpus([1], slow=False)[0].power_limit_w == 300.0
        live.revert()
        assert done.wait(WAIT_S)
        assert sim.read_gpus([1], slow=False)[0].power_limit_w == 450.0
        assert sim.set_calls == [("power", 1, 300.0), ("power", 1, 450.0)]
        entries = journal.read_journal().entries
        assert [e.command for e in entries] == [
            "gpustation dashboard: power limit 300 W",
            "gpustation dashboard: revert power limit",
        ]
        assert live.confirm_timeout_s == 120.0
        live.confirm_timeout_s = 5.0
        assert live.confirmer.timeout_s == 5.0
    finally:
        live.close()


class _Started:
    """Stands in for the controller process a quitting dashboard starts: its argv and options."""

    calls: ClassVar[list[tuple[list[str], dict[str, object]]]] = []

    def __init__(self, argv: list[str], **options: object) -> None:
        self.calls.append((argv, options))
        self.pid = 4242


def test_a_kept_curve_is_handed_to_a_controller_of_its_own_after_it_stops(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch, gpustation_dirs: dict[str, Path]
) -> None:
    live = LiveControl(sim, [0, 1], confirm_timeout_s=120.0)
    try:
        with pytest.raises(GpustationError, match="no fan curve is running to leave behind"):
            live.leave_curve_running()
        live.apply_profile(load_profile("quiet"))
        assert live.confirm() and live.curve_running
        _Started.calls = []
        monkeypatch.setattr(subprocess, "Popen", _Started)
        assert live.leave_curve_running() == 4242
        ((argv, options),) = _Started.calls
        assert argv[-11:] == [
            "-m",
            "gpustation",
            "fan",
            "run",
            "quiet",
            "--gpus",
            "0,1",
            "--simulate",
            "2",
            "--sim-card",
            "rtx4090",
        ]
        assert options["stdin"] == subprocess.DEVNULL and options["stderr"] == subprocess.STDOUT
        assert options["start_new_session"] is True and options["close_fds"] is True
        log = gpustation_dirs["state"] / "fan-controller.log"
        assert getattr(options["stdout"], "name", None) == str(log)
        assert log.stat().st_mode & 0o777 == 0o600
        # this process's curve stopped first: the two never drive the fans at once
        assert not live.curve_running and live.curve_profile is None
        assert _modes(sim, [0, 1]) == {"auto"}
    finally:
        live.close()
