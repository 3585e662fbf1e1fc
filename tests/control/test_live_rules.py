"""A dashboard's live control, in-process on simulated cards: a profile's power and
fans, what its revert puts back, and the notes for cards without fans."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import pytest

from gpustation.control import journal
from gpustation.control import live as live_module
from gpustation.control.confirm import Outcome
from gpustation.control.fancurve import stop_controllers
from gpustation.control.live import LiveControl, PollReport
from gpustation.control.profiles import Profile, load_profile
from gpustation.errors import GpustationError, NotSupportedError
from gpustation.paths import state_dir, user_profiles_dir
from gpustation.telemetry.model import GpuSample
from gpustation.telemetry.sim import machine_path
from tests.control.conftest import RecordingSim, standin

WAIT_S = 30.0  # an upper bound: every wait ends on an event


class Outcomes:
    """Keeps each outcome and sets ``done`` at the first."""

    def __init__(self, seen: list[Outcome], done: threading.Event) -> None:
        self.seen, self.done = seen, done

    def __call__(self, outcome: Outcome) -> None:
        self.seen.append(outcome)
        self.done.set()


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


def _user_profile(name: str, text: str) -> Profile:
    directory = user_profiles_dir()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.toml").write_text(text, encoding="utf-8")
    return load_profile(name)


def _wait(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_curve_that_stops_on_an_error_is_reported_and_forgotten(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    errors: list[str] = []
    reports: list[PollReport] = []
    live = LiveControl(
        sim, [0, 1], confirm_timeout_s=120.0, on_error=errors.append, on_poll=reports.append
    )
    real_read = sim.read_gpus
    broken = threading.Event()

    def read(indices: list[int], slow: bool) -> list[GpuSample]:
        if broken.is_set() and threading.current_thread().name.startswith("gpustation-fan"):
            raise RuntimeError("driver hiccup")
        return real_read(indices, slow)

    monkeypatch.setattr(sim, "read_gpus", read)
    try:
        live.apply_profile(load_profile("quiet"))
        assert live.confirm()
        assert "gpustation-fan-curve-quiet" in {t.name for t in threading.enumerate()}
        _wait(lambda: reports, "a poll")
        assert reports[0] == live.last_poll or reports[-1] == live.last_poll
        assert all(isinstance(r, dict) and r for r in reports)
        taken = [e for e in journal.read_journal().entries if e.what == journal.FAN_SPEED]
        assert taken and {e.command for e in taken} == {"gpustation dashboard: profile quiet"}
        power = [e for e in journal.read_journal().entries if e.what == journal.POWER_LIMIT]
        assert {e.command for e in power} == {"gpustation dashboard: profile quiet"}
        broken.set()
        _wait(lambda: errors, "the curve's error")
        assert errors == [
            "fan curve 'quiet' stopped: the fan controller stopped on an error: "
            "RuntimeError('driver hiccup'). Every fan was returned to automatic control."
        ]
        _wait(lambda: not live.curve_running, "the curve to end")
        assert live.curve_profile is None
        with pytest.raises(GpustationError) as raised:
            live.leave_curve_running()
        assert str(raised.value) == "no fan curve is running to leave behind"
    finally:
        broken.clear()
        live.close()


def test_a_curve_that_will_not_stop_is_said_and_its_readings_dropped(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = LiveControl(sim, [0, 1], confirm_timeout_s=120.0)
    real_read = sim.read_gpus
    stuck, inside, release = threading.Event(), threading.Event(), threading.Event()

    def read(indices: list[int], slow: bool) -> list[GpuSample]:
        if stuck.is_set() and threading.current_thread().name.startswith("gpustation-fan"):
            inside.set()
            release.wait(WAIT_S)  # a driver call that does not come back
        return real_read(indices, slow)

    monkeypatch.setattr(sim, "read_gpus", read)
    try:
        live.apply_profile(load_profile("quiet"))
        assert live.confirm()
        _wait(lambda: live.last_poll, "a poll")
        [curve] = [t for t in threading.enumerate() if t.name == "gpustation-fan-curve-quiet"]
        stuck.set()
        assert inside.wait(WAIT_S)
        with pytest.raises(GpustationError) as raised:
            live.stop_curve(timeout_s=0.2)
        assert str(raised.value) == (
            "the fan curve did not stop within 0.2 s; run `gpustation fan auto`."
        )
        assert live.last_poll == {}
    finally:
        release.set()
        live.close()
    curve.join(WAIT_S)
    assert not curve.is_alive()
    assert _modes(sim, [0, 1]) == {"auto"}


def test_a_stop_request_ends_the_curve_with_its_signal_and_reverts_the_change(
    sim: RecordingSim,
) -> None:
    done = threading.Event()
    outcomes: list[Outcome] = []
    live = LiveControl(sim, [0, 1], confirm_timeout_s=120.0, on_outcome=Outcomes(outcomes, done))
    try:
        live.apply_profile(load_profile("quiet"))
        controller = live._controller
        assert controller is not None
        live.request_stop(signal.SIGTERM)
        assert done.wait(WAIT_S)
        assert [(o.kind, o.timed_out) for o in outcomes] == [("reverted", False)]
        assert controller.stop_signal == signal.SIGTERM
        _wait(lambda: not live.curve_running, "the curve to end")
        assert _modes(sim, [0, 1]) == {"auto"}
    finally:
        live.close()


def test_a_limit_the_card_did_not_report_is_not_put_back(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_read = sim.read_gpus

    def no_limit(indices: list[int], slow: bool) -> list[GpuSample]:
        samples = real_read(indices, slow)
        for s in samples:
            s.power_limit_w = None
        return samples

    monkeypatch.setattr(sim, "read_gpus", no_limit)
    done = threading.Event()
    outcomes: list[Outcome] = []
    live = LiveControl(sim, [0], confirm_timeout_s=120.0, on_outcome=Outcomes(outcomes, done))
    try:
        change = live.set_power_limit(0, 300.0)
        assert change.description == "GPU 0 power limit n/a -> 300 W"
        assert change.reverted_text == "GPU 0 power limit to n/a (from 300 W)"
        assert live.revert() and done.wait(WAIT_S)
        assert [o.kind for o in outcomes] == ["reverted"]
        assert sim.set_calls == [("power", 0, 300.0)]  # nothing known to go back to
    finally:
        live.close()


def test_a_revert_is_journalled_against_the_card(sim: RecordingSim) -> None:
    done = threading.Event()
    live = LiveControl(sim, [0], confirm_timeout_s=120.0, on_outcome=lambda o: done.set())
    try:
        live.set_power_limit(0, 300.0)
        assert live.revert() and done.wait(WAIT_S)
    finally:
        live.close()
    uuid = sim.read_gpus([0], slow=False)[0].uuid
    assert [(e.uuid, e.previous, e.new) for e in journal.read_journal().entries] == [
        (uuid, 450.0, 300.0),
        (uuid, 300.0, 450.0),
    ]


def test_a_profile_for_the_fans_alone_leaves_the_limits(sim: RecordingSim) -> None:
    fans_only = _user_profile("fans-auto", '[fans]\nmode = "auto"\n')
    sim.control.set_fan_speed(0, 0, 80)
    sim.set_calls.clear()
    live = LiveControl(sim, [0, 1], confirm_timeout_s=120.0)
    try:
        live.apply_profile(fans_only)
        assert live.confirm()
    finally:
        live.close()
    assert not [c for c in sim.set_calls if c[0] == "power"]
    assert _modes(sim, [0, 1]) == {"auto"}
    handed = [e for e in journal.read_journal().entries if e.what == journal.FAN_AUTO]
    assert handed and {e.command for e in handed} == {"gpustation dashboard: profile fans-auto"}


def test_cards_without_fans_are_named_together_in_the_note(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sim.control, "fan_count", lambda i: 0)
    live = LiveControl(sim, [0, 1], confirm_timeout_s=120.0)
    try:
        change = live.apply_profile(load_profile("quiet"))
        assert change.notes == ["no controllable fans on GPU 0, 1: power only there"]
        assert live.confirm()
    finally:
        live.close()


def test_a_curve_the_cards_cannot_run_is_refused_before_the_limits_change(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_range(index: int) -> tuple[int, int]:
        raise NotSupportedError(f"GPU {index} does not report its fan speed range")

    monkeypatch.setattr(sim.control, "fan_speed_range", no_range)
    live = LiveControl(sim, [0, 1], confirm_timeout_s=120.0)
    try:
        with pytest.raises(NotSupportedError):
            live.apply_profile(load_profile("quiet"))
    finally:
        live.close()
    assert sim.set_calls == [] and journal.read_journal().entries == []


def test_a_profile_stops_another_program_s_controller_on_its_cards(
    sim: RecordingSim, standins: list[subprocess.Popen[bytes]]
) -> None:
    other = standin(state_dir() / "fan-control-sim-gpu0.lock", "gpustation fan run quiet")
    standins.append(other)
    live = LiveControl(sim, [0, 1], confirm_timeout_s=120.0)
    try:
        live.apply_profile(load_profile("balanced"))
        assert other.wait(timeout=WAIT_S) == -signal.SIGTERM
        assert live.curve_running
        assert live.confirm()
    finally:
        live.close()


def test_a_profile_whose_fans_cannot_be_taken_puts_the_limits_back(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch, standins: list[subprocess.Popen[bytes]]
) -> None:
    stubborn = standin(
        state_dir() / "fan-control-sim-gpu1.lock", "gpustation fan run quiet", ignore_term=True
    )
    standins.append(stubborn)
    # The same wait for it, shortened: it never ends.
    monkeypatch.setattr(
        live_module, "stop_controllers", lambda i, s: stop_controllers(i, s, timeout_s=0.2)
    )
    live = LiveControl(sim, [0, 1], confirm_timeout_s=120.0)
    try:
        with pytest.raises(GpustationError, match=r"did not stop within 0\.2 s"):
            live.apply_profile(load_profile("quiet"))
        assert live.pending is None and live.applied_profile is None
    finally:
        live.close()
    assert [s.power_limit_w for s in sim.read_gpus([0, 1], slow=False)] == [450.0, 450.0]
    undo = [e for e in journal.read_journal().entries if e.new == 450.0]
    assert {e.command for e in undo} == {"gpustation dashboard: undo profile quiet after a failure"}


def test_reverting_a_power_profile_leaves_the_running_curve_alone(sim: RecordingSim) -> None:
    power_only = _user_profile("low", '[power]\nlimit = "300"\n')
    done = threading.Event()
    live = LiveControl(sim, [0, 1], confirm_timeout_s=120.0, on_outcome=lambda o: done.set())
    try:
        live.apply_profile(load_profile("quiet"))
        assert live.confirm()
        _wait(lambda: live.last_poll, "the curve to take the fans")
        fan_entries = len([e for e in journal.read_journal().entries if e.fan is not None])
        live.apply_profile(power_only)
        assert live.revert() and done.wait(WAIT_S)
        assert live.curve_running and live.curve_profile is not None
        assert live.curve_profile.name == "quiet"
        after = len([e for e in journal.read_journal().entries if e.fan is not None])
        assert after == fan_entries  # no fan was handed back or taken again
    finally:
        live.close()


def test_the_controller_left_behind_runs_on_as_many_simulated_cards(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    three = RecordingSim(count=3, card="rtx4090", state_path=machine_path("rtx4090", 3))
    live = LiveControl(three, [0, 1, 2], confirm_timeout_s=120.0)
    try:
        live.apply_profile(load_profile("quiet"))
        assert live.confirm()
        _Started.calls = []
        monkeypatch.setattr(subprocess, "Popen", _Started)
        assert live.leave_curve_running() == 4242
        ((argv, _),) = _Started.calls
        assert argv[-6:] == ["--gpus", "0,1,2", "--simulate", "3", "--sim-card", "rtx4090"]
    finally:
        live.close()
