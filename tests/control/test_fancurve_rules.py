"""The fan-curve controller's rules, in-process: what its log and its journal say,
how it ends (signals, duration, errors, fans the card will not take back), which
cards it accepts, and how controllers of other processes are found and stopped."""

from __future__ import annotations

import fcntl
import io
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpustation.control import journal
from gpustation.control.fancurve import (
    CardFans,
    FanController,
    FanState,
    card_fans,
    decide,
    running_controllers,
    stop_controllers,
)
from gpustation.control.profiles import FanCurve
from gpustation.errors import (
    EXIT_INTERRUPTED,
    EXIT_NEEDS_ROOT,
    EXIT_NOT_SUPPORTED,
    GpustationError,
    NeedsRootError,
    NotSupportedError,
)
from gpustation.paths import state_dir
from gpustation.telemetry.model import GpuSample
from tests.control.conftest import RecordingSim, standin

#: 40 % at 30 C up to 100 % at 90 C, in a straight line
LINE = FanCurve(points=((30.0, 40.0), (90.0, 100.0)), min_pct=0.0, max_pct=100.0)
CLOCK_STAMP = re.compile(r"^\d\d:\d\d:\d\d ")

Report = dict[int, tuple[float | None, int | None]]


def controller(sim: RecordingSim, out: io.StringIO | None = None, **kw: object) -> FanController:
    return FanController(
        backend=sim,
        indices=[0, 1],
        curve=LINE,
        command="gpustation fan run line",
        out=out,
        interval_s=0.01,
        **kw,  # type: ignore[arg-type]
    )


def log_lines(out: io.StringIO) -> list[str]:
    lines = out.getvalue().splitlines()
    assert lines and all(CLOCK_STAMP.match(line) for line in lines), lines
    return [line[9:] for line in lines]


def entries(what: str) -> list[journal.JournalEntry]:
    return [e for e in journal.read_journal().entries if e.what == what]


def stop_after(ctl: FanController, polls: int, each: Callable[[int], None] | None = None) -> None:
    """Make ``ctl`` stop itself after that many polls, calling ``each(n)`` at each."""
    seen = 0

    def on_poll(report: Report) -> None:
        nonlocal seen
        seen += 1
        if each is not None:
            each(seen)
        if seen >= polls:
            ctl.request_stop()

    ctl.on_poll = on_poll


# ---- what the log says --------------------------------------------------------------


def test_the_log_names_each_card_its_fans_and_the_poll_then_each_speed_and_the_end(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_count = sim.control.fan_count
    monkeypatch.setattr(sim.control, "fan_count", lambda i: 1 if i == 1 else real_count(i))
    sim.poke(0, load=0.0, temperature_c=60.0)
    sim.poke(1, load=0.0, temperature_c=60.0)
    out = io.StringIO()
    assert controller(sim, out).run(once=True) == 0
    lines = log_lines(out)
    assert lines[0] == (
        "fan controller started on GPU 0 (2 fans, 30-100 %), GPU 1 (1 fan, 30-100 %); "
        "polling every 0.01 s"
    )
    assert re.fullmatch(r"GPU 0: [\d.]+ C -> fans \d+ %", lines[1])
    assert re.fullmatch(r"GPU 1: [\d.]+ C -> fans \d+ %", lines[2])
    assert lines[-1] == "stopped; fans are on automatic control"


def test_a_failed_read_is_logged_as_n_a_with_the_emergency(sim: RecordingSim) -> None:
    sim.poke(0, load=0.0, temperature_c=50.0, temperature_fails=True)
    out = io.StringIO()
    controller(sim, out).run(once=True)
    lines = log_lines(out)
    assert "GPU 0: temperature read failed: fans to maximum until readings recover" in lines
    assert "GPU 0: n/a -> fans 100 %" in lines


def test_each_log_line_reaches_the_file_as_it_is_written(sim: RecordingSim, tmp_path: Path) -> None:
    log = tmp_path / "fan-controller.log"
    seen: list[str] = []
    with open(log, "w", encoding="utf-8") as out:
        ctl = FanController(sim, [0], LINE, "cmd", out=out, interval_s=0.01)
        stop_after(ctl, 1, lambda n: seen.append(log.read_text(encoding="utf-8")))
        ctl.run()
    assert "fan controller started on GPU 0" in seen[0]
    assert "-> fans" in seen[0]


# ---- how it ends -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signum", "status"),
    [(signal.SIGINT, EXIT_INTERRUPTED), (signal.SIGTERM, 0), (signal.SIGHUP, 0)],
)
def test_a_stop_signal_is_named_in_the_log_and_sigint_exits_130(
    sim: RecordingSim, signum: signal.Signals, status: int
) -> None:
    before = signal.getsignal(signum)
    out = io.StringIO()
    ctl = controller(sim, out)
    stop_after(ctl, 10**6, lambda n: os.kill(os.getpid(), signum) if n == 2 else None)
    assert ctl.run() == status
    assert ctl.stop_signal == signum
    assert log_lines(out)[-1] == f"stopped by {signum.name}; fans are on automatic control"
    assert signal.getsignal(signum) == before
    assert [g.fan_control for g in sim.read_gpus([0, 1], slow=False)] == [["auto"] * 2] * 2


def test_the_first_stop_signal_is_the_one_reported() -> None:
    ctl = FanController(backend=None, indices=[0], curve=LINE, command="c")  # type: ignore[arg-type]
    ctl.request_stop()
    assert ctl.stop_event.is_set() and ctl.stop_signal is None
    ctl.request_stop(signal.SIGTERM)
    ctl.request_stop(signal.SIGINT)
    assert ctl.stop_signal == signal.SIGTERM


def test_a_duration_ends_the_loop_once_that_much_of_its_clock_has_passed(
    sim: RecordingSim,
) -> None:
    now = [100.0]
    polls: list[Report] = []

    def tick(report: Report) -> None:
        polls.append(report)
        now[0] += 1.0

    ctl = controller(sim, clock=lambda: now[0], on_poll=tick)
    assert ctl.run(duration_s=2.0) == 0
    assert len(polls) == 2


def test_fans_the_card_will_not_take_back_are_named_in_the_error_journal_and_log(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_auto = sim.control.set_fan_auto

    def stuck(index: int, fan: int) -> None:
        if index == 0:
            raise GpustationError("fan stuck")
        real_auto(index, fan)

    monkeypatch.setattr(sim.control, "set_fan_auto", stuck)
    out = io.StringIO()
    with pytest.raises(GpustationError) as raised:
        controller(sim, out).run(once=True)
    assert str(raised.value) == (
        "could not return every fan to automatic control: GPU 0 fan 0: fan stuck; "
        "GPU 0 fan 1: fan stuck. Run `gpustation fan auto` (as root if needed)."
    )
    lines = log_lines(out)
    assert "GPU 0 fan 0: could not return to automatic control: fan stuck" in lines
    assert "GPU 0 fan 1: could not return to automatic control: fan stuck" in lines
    back = {(e.gpu, e.fan): (e.outcome, e.error) for e in entries(journal.FAN_AUTO)}
    assert back == {
        (0, 0): (journal.REFUSED, "fan stuck"),
        (0, 1): (journal.REFUSED, "fan stuck"),
        (1, 0): (journal.MADE, None),
        (1, 1): (journal.MADE, None),
    }


def test_an_error_in_the_loop_keeps_its_exit_code_and_adds_the_fans_left_manual(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_read, real_auto = sim.read_gpus, sim.control.set_fan_auto
    reads = 0

    def read(indices: list[int], slow: bool) -> list[GpuSample]:
        nonlocal reads
        reads += 1
        if reads == 3:  # check(), one poll, then the driver refuses
            raise NeedsRootError("reading needs root now")
        return real_read(indices, slow)

    def stuck(index: int, fan: int) -> None:
        if index == 1:
            raise GpustationError("stuck")
        real_auto(index, fan)

    monkeypatch.setattr(sim, "read_gpus", read)
    monkeypatch.setattr(sim.control, "set_fan_auto", stuck)
    with pytest.raises(NeedsRootError) as raised:
        controller(sim, io.StringIO()).run()
    assert raised.value.exit_code == EXIT_NEEDS_ROOT
    assert str(raised.value) == (
        "reading needs root now Also, some fans could not be returned to automatic control: "
        "GPU 1 fan 0: stuck; GPU 1 fan 1: stuck."
    )


def test_an_unexpected_error_in_the_loop_is_reported_once_the_fans_are_back(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_read = sim.read_gpus
    reads = 0

    def read(indices: list[int], slow: bool) -> list[GpuSample]:
        nonlocal reads
        reads += 1
        if reads == 3:
            raise RuntimeError("driver hiccup")
        return real_read(indices, slow)

    monkeypatch.setattr(sim, "read_gpus", read)
    out = io.StringIO()
    with pytest.raises(GpustationError) as raised:
        controller(sim, out).run()
    assert str(raised.value) == (
        "the fan controller stopped on an error: RuntimeError('driver hiccup'). "
        "Every fan was returned to automatic control."
    )
    assert "error: driver hiccup; returning the fans to automatic control" in log_lines(out)
    monkeypatch.setattr(sim, "read_gpus", real_read)
    assert [g.fan_control for g in sim.read_gpus([0, 1], slow=False)] == [["auto"] * 2] * 2


def test_a_card_near_its_slowdown_runs_its_fans_flat_out_and_says_why(sim: RecordingSim) -> None:
    sim.poke(0, load=0.0, temperature_c=84.0)  # the RTX 4090 slows down at 87 C
    out = io.StringIO()
    ctl = controller(sim, out)
    ctl.run(once=True)
    assert ctl.states[0].pct == 100 and ctl.states[0].emergency is not None
    assert any(
        re.fullmatch(
            r"GPU 0: [\d.]+ C is within 5 C of the slowdown temperature 87 C: "
            r"fans to maximum until readings recover",
            line,
        )
        for line in log_lines(out)
    )


def test_after_an_emergency_or_a_rise_the_spin_down_delay_starts_afresh() -> None:
    card = CardFans(0, "u", "n", 2, 30, 100, lo_pct=30, hi_pct=100)
    state = FanState(pct=60)
    # A failed read: flat out; then a cool reading may slow the fans, after the delay.
    assert decide(LINE, card, state, None, 87.0, now=0.0) == (100, "temperature read failed")
    state.pct = 100
    assert decide(LINE, card, state, 40.0, 87.0, now=1.0) == (100, None)
    assert state.low_since == 1.0
    assert decide(LINE, card, state, 40.0, 87.0, now=11.0) == (53, None)
    assert state.low_since is None
    state.pct = 53
    # Warmer: up at once; then cooler again: the delay counts from then.
    assert decide(LINE, card, state, 60.0, 87.0, now=12.0) == (70, None)
    state.pct = 70
    assert decide(LINE, card, state, 40.0, 87.0, now=13.0) == (70, None)
    assert state.low_since == 13.0
    assert decide(LINE, card, state, 40.0, 87.0, now=22.9) == (70, None)
    assert decide(LINE, card, state, 40.0, 87.0, now=23.0) == (53, None)
    state.pct = 53
    # Near the slowdown temperature: flat out; cooler again: the delay counts from then.
    assert decide(LINE, card, state, 85.0, 87.0, now=30.0)[0] == 100
    state.pct = 100
    assert decide(LINE, card, state, 40.0, 87.0, now=31.0) == (100, None)
    assert state.low_since == 31.0


def test_a_sample_that_lists_fewer_fans_than_the_card_has_is_taken_over(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = sim.read_gpus

    def short(indices: list[int], slow: bool = False) -> list[GpuSample]:
        out = real(indices, slow)
        for s in out:
            s.fan_control, s.fans_pct = s.fan_control[:1], s.fans_pct[:1]
        return out

    monkeypatch.setattr(sim, "read_gpus", short)
    assert controller(sim).run(once=True) == 0
    taken = entries(journal.FAN_SPEED)
    assert [(e.gpu, e.fan) for e in taken] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert taken[1].previous == {"mode": None, "pct": None}
    assert taken[0].previous["mode"] == "auto"


# ---- what the journal keeps ----------------------------------------------------------


def test_the_takeover_is_journalled_once_per_fan_and_the_restore_says_what_each_ran_at(
    sim: RecordingSim,
) -> None:
    sim.poke(0, load=0.0, temperature_c=45.0)
    sim.poke(1, load=0.0, temperature_c=45.0)
    before = sim.read_gpus([0, 1], slow=False)
    ctl = controller(sim)

    # Hotter at every poll: the speed rises each time, journalled only at the takeover.
    def hotter(n: int) -> None:
        for i in (0, 1):
            sim.poke(i, temperature_c=45.0 + 15 * n)

    stop_after(ctl, 3, hotter)
    assert ctl.run() == 0
    taken = entries(journal.FAN_SPEED)
    assert [(e.gpu, e.fan) for e in taken] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for e in taken:
        card = before[e.gpu]
        assert e.fan is not None
        assert e.uuid == card.uuid and e.command == "gpustation fan run line" and e.simulated
        assert e.previous == {"mode": card.fan_control[e.fan], "pct": card.fans_pct[e.fan]}
        assert e.outcome == journal.MADE and e.read_back == {"mode": "manual", "pct": e.new}
    back = entries(journal.FAN_AUTO)
    assert [(e.gpu, e.fan) for e in back] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for e in back:
        assert e.uuid == before[e.gpu].uuid and e.command == "gpustation fan run line"
        assert e.previous == ctl.states[e.gpu].pct and e.previous is not None
        assert e.previous > taken[0].new  # the speed it rose to, not the first one
        assert e.new == {"mode": "auto"} and e.simulated is True
        assert e.outcome == journal.MADE and e.read_back == {"mode": "auto"}


def test_fans_go_back_even_when_the_journal_can_no_longer_be_written(sim: RecordingSim) -> None:
    ctl = controller(sim)

    def break_journal(n: int) -> None:
        path = journal.journal_path()
        path.unlink()
        path.mkdir()  # not a file any more: every later entry is refused

    stop_after(ctl, 1, break_journal)
    assert ctl.run() == 0
    assert [g.fan_control for g in sim.read_gpus([0, 1], slow=False)] == [["auto"] * 2] * 2


def test_a_refused_takeover_journals_the_refusal_and_the_fans_never_tried(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_set = sim.control.set_fan_speed

    def refuse(index: int, fan: int, pct: int) -> None:
        if index == 1:
            raise NotSupportedError("")  # a driver answer with no text
        real_set(index, fan, pct)

    monkeypatch.setattr(sim.control, "set_fan_speed", refuse)
    with pytest.raises(NotSupportedError) as raised:
        controller(sim).run(once=True)
    assert raised.value.exit_code == EXIT_NOT_SUPPORTED
    outcomes = [(e.gpu, e.fan, e.outcome, e.error) for e in entries(journal.FAN_SPEED)]
    assert outcomes == [
        (0, 0, journal.MADE, None),
        (0, 1, journal.MADE, None),
        (1, 0, journal.REFUSED, "NotSupportedError"),
        (1, 1, journal.REFUSED, "not tried: an earlier fan was refused (NotSupportedError)"),
    ]


# ---- which cards it takes -----------------------------------------------------------


def test_the_curve_is_kept_inside_the_cards_range(sim: RecordingSim) -> None:
    sample = sim.read_gpus([0], slow=False)[0]
    narrow = FanCurve(points=((30.0, 40.0), (90.0, 100.0)), min_pct=45.5, max_pct=80.5)
    card = card_fans(sim, sample, narrow)
    assert (card.index, card.uuid, card.name, card.fans) == (0, sample.uuid, sample.name, 2)
    assert (card.card_min_pct, card.card_max_pct, card.lo_pct, card.hi_pct) == (30, 100, 46, 80)
    plain = card_fans(sim, sample, None)
    assert (plain.lo_pct, plain.hi_pct) == (30, 100)
    # A curve whose maximum is below the card's minimum still runs at the card's minimum.
    low = FanCurve(points=((30.0, 10.0), (90.0, 20.0)), min_pct=0.0, max_pct=20.0)
    assert (card_fans(sim, sample, low).lo_pct, card_fans(sim, sample, low).hi_pct) == (30, 30)


def test_a_card_with_one_fan_is_driven_and_one_with_none_is_refused(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    sample = sim.read_gpus([0], slow=False)[0]
    monkeypatch.setattr(sim.control, "fan_count", lambda i: 1)
    assert card_fans(sim, sample, LINE).fans == 1
    monkeypatch.setattr(sim.control, "fan_count", lambda i: 0)
    with pytest.raises(NotSupportedError) as raised:
        card_fans(sim, sample, LINE)
    assert str(raised.value) == (
        f"GPU 0 ({sample.name}) has no fans gpustation can control (datacenter cards are "
        "cooled by the chassis)."
    )


def test_a_card_that_gives_no_fan_range_is_refused_in_its_own_words(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_range(index: int) -> tuple[int, int]:
        raise NotSupportedError(f"GPU {index} does not report its fan speed range")

    monkeypatch.setattr(sim.control, "fan_speed_range", no_range)
    with pytest.raises(NotSupportedError, match=r"^GPU 0 does not report its fan speed range$"):
        card_fans(sim, sim.read_gpus([0], slow=False)[0], LINE)


def test_a_lost_card_is_named_with_or_without_its_name(sim: RecordingSim) -> None:
    with pytest.raises(GpustationError) as raised:
        card_fans(sim, GpuSample(index=3, lost=True), LINE)
    assert str(raised.value) == "GPU 3 has fallen off the bus; its fans cannot be controlled."
    named = GpuSample(index=3, name="NVIDIA GeForce RTX 4090", lost=True)
    with pytest.raises(GpustationError, match=r"^GPU 3 \(NVIDIA GeForce RTX 4090\) has fallen"):
        card_fans(sim, named, LINE)


def test_check_lists_every_card_it_cannot_drive_with_the_highest_exit_code(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [g.name for g in sim.read_gpus([0, 1], slow=False)]
    real_count = sim.control.fan_count
    monkeypatch.setattr(sim.control, "fan_count", lambda i: 0 if i == 1 else real_count(i))
    sim.poke(0, lost=True)
    ctl = controller(sim)
    with pytest.raises(GpustationError) as raised:
        ctl.check()
    assert type(raised.value) is GpustationError  # the first card's kind of problem
    assert raised.value.exit_code == EXIT_NOT_SUPPORTED  # the worst of them
    lines = str(raised.value).splitlines()
    assert lines[0].startswith("GPU 0") and lines[0].endswith(
        "has fallen off the bus; its fans cannot be controlled."
    )
    assert lines[1].startswith(f"GPU 1 ({names[1]}) has no fans gpustation can control")
    assert lines[2:] == ["Nothing was changed."]
    assert sim.set_calls == []


def test_check_keeps_the_cards_it_found_within_the_curve(sim: RecordingSim) -> None:
    narrow = FanCurve(points=((30.0, 40.0), (90.0, 100.0)), min_pct=50.0, max_pct=90.0)
    ctl = FanController(sim, [0, 1], narrow, "cmd")
    cards = ctl.check()
    assert [(c.index, c.lo_pct, c.hi_pct) for c in cards] == [(0, 50, 90), (1, 50, 90)]
    assert ctl.cards == cards


def test_a_preview_says_what_would_be_set_and_sets_nothing(sim: RecordingSim) -> None:
    sim.poke(0, load=0.0, temperature_c=60.0)
    sim.poke(1, load=0.0, temperature_c=85.0)  # within 5 C of the 87 C slowdown
    rows = controller(sim).preview()
    assert [(card.index, pct) for card, _, pct, _ in rows][1] == (1, 100)
    card0, temp0, pct0, why0 = rows[0]
    assert card0.index == 0 and temp0 is not None and why0 is None
    assert pct0 == round(LINE.speed_at(temp0))
    assert rows[1][3] is not None and "slowdown temperature 87 C" in rows[1][3]
    assert sim.set_calls == []


# ---- controllers of other processes ------------------------------------------------


def test_a_running_controller_is_found_by_the_lock_of_each_card(sim: RecordingSim) -> None:
    found: list[tuple[dict[int, int], dict[int, int], bool]] = []
    ctl = controller(sim)

    def look(n: int) -> None:
        found.append(
            (
                running_controllers([0, 1, 2], True),
                running_controllers([0, 1], False),
                (state_dir() / "fan-control-sim-gpu0.lock").exists(),
            )
        )

    stop_after(ctl, 1, look)
    ctl.run()
    assert found == [({0: os.getpid(), 1: os.getpid()}, {}, True)]
    assert running_controllers([0, 1], True) == {}


def test_a_real_cards_controller_holds_a_lock_of_its_own_name(fake_nvml: object) -> None:
    # start-up time: the NVML backend is only needed by this test
    from gpustation.telemetry.nvml import NvmlBackend

    backend = NvmlBackend(nvml=fake_nvml)
    try:
        seen: list[tuple[bool, dict[int, int]]] = []
        ctl = FanController(backend, [0], LINE, "cmd", interval_s=0.01)
        stop_after(
            ctl,
            1,
            lambda n: seen.append(
                ((state_dir() / "fan-control-gpu0.lock").exists(), running_controllers([0], False))
            ),
        )
        ctl.run()
    finally:
        backend.close()
    assert seen == [(True, {0: os.getpid()})]


@pytest.fixture
def sim_lock() -> Iterator[Path]:
    path = state_dir() / "fan-control-sim-gpu0.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    yield path


def test_a_lock_held_with_no_pid_or_garbage_names_no_controller(sim_lock: Path) -> None:
    fd = os.open(sim_lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert running_controllers([0], True) == {}  # taken, its pid not written yet
        os.write(fd, b"not a pid")
        assert running_controllers([0], True) == {}
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"4242", 0)
        assert running_controllers([0], True) == {0: 4242}
    finally:
        os.close(fd)
    assert running_controllers([0], True) == {}  # the lock is free again


def test_a_controller_of_another_process_is_stopped_and_waited_for(
    sim_lock: Path, standins: list[subprocess.Popen[bytes]]
) -> None:
    proc = standin(sim_lock, "gpustation fan run quiet")
    standins.append(proc)
    assert stop_controllers([0, 1], simulated=False) == []  # the real cards' locks: none held
    assert proc.poll() is None
    began = time.monotonic()
    assert stop_controllers([0, 1], simulated=True, timeout_s=60.0) == [proc.pid]
    assert running_controllers([0], True) == {}  # it has let go by the time the call returns
    assert time.monotonic() - began < 30.0  # as soon as it let go, not at the deadline
    assert proc.wait(timeout=30) == -signal.SIGTERM


def test_a_controller_that_does_not_stop_in_time_is_named(
    sim_lock: Path, standins: list[subprocess.Popen[bytes]]
) -> None:
    first = standin(sim_lock, "gpustation fan run quiet", ignore_term=True)
    standins.append(first)
    second = standin(sim_lock.with_name("fan-control-sim-gpu1.lock"), "gpustation fan run x", True)
    standins.append(second)
    pids = ", ".join(map(str, sorted([first.pid, second.pid])))
    with pytest.raises(GpustationError) as raised:
        stop_controllers([0, 1], simulated=True, timeout_s=0.3)
    assert str(raised.value) == (
        f"the fan controller (pid {pids}) did not stop within 0.3 s; nothing was changed."
    )
    assert first.poll() is None and second.poll() is None


def test_a_lock_holder_that_is_not_gpustation_is_never_signalled(
    sim_lock: Path, standins: list[subprocess.Popen[bytes]]
) -> None:
    proc = standin(sim_lock, "some-other-fan-tool")
    standins.append(proc)
    assert stop_controllers([0], simulated=True, timeout_s=0.3) == []
    assert proc.poll() is None
