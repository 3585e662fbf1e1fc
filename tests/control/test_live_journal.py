"""The fan changes a fan curve makes are journalled with their real outcome,
never left "unknown" (which says the process died in between)."""

from __future__ import annotations

import threading

import pytest

from gpustation.control import journal
from gpustation.control.fancurve import FanController
from gpustation.control.live import LiveControl
from gpustation.control.profiles import load_profile
from gpustation.errors import GpustationError
from tests.control.conftest import RecordingSim, journal_entries

WAIT_S = 30.0  # an upper bound: the waits end on events


def test_the_dashboard_s_fan_curve_journals_every_fan_change_as_made(sim: RecordingSim) -> None:
    polled = threading.Event()
    live = LiveControl(sim, [0, 1], on_poll=lambda report: polled.set())
    try:
        live.apply_profile(load_profile("balanced"))
        assert polled.wait(WAIT_S)  # the curve has taken the fans over
        assert live.confirm()
    finally:
        live.close()  # the curve stops: fans back to automatic
    fans = [e for e in journal_entries() if e.what in (journal.FAN_SPEED, journal.FAN_AUTO)]
    assert [e.what for e in fans] == [journal.FAN_SPEED] * 4 + [journal.FAN_AUTO] * 4
    assert [e.outcome for e in fans] == [journal.MADE] * 8
    taken = [e for e in fans if e.what == journal.FAN_SPEED]
    assert all(e.read_back == {"mode": "manual", "pct": e.new} for e in taken)
    assert all(e.read_back == {"mode": "auto"} for e in fans if e.what == journal.FAN_AUTO)


class SecondFanRefuses(RecordingSim):
    """GPU 0's second fan refuses a speed, as a driver can."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        inner = self.control.set_fan_speed

        def set_fan_speed(index: int, fan: int, pct: int) -> None:
            if (index, fan) == (0, 1):
                raise GpustationError("GPU 0 fan 1: Insufficient Permissions")
            inner(index, fan, pct)

        self.control.set_fan_speed = set_fan_speed  # type: ignore[method-assign]


def test_a_fan_the_card_refuses_is_journalled_as_refused(sim: RecordingSim) -> None:
    refusing = SecondFanRefuses(count=2, card="rtx4090", state_path=sim.state_path)
    curve = load_profile("balanced").curve
    assert curve is not None
    controller = FanController(refusing, [0], curve, command="test", interval_s=0.01)
    with pytest.raises(GpustationError, match="Insufficient Permissions"):
        controller.run(once=True)
    entries = journal_entries()
    speed = {e.fan: e for e in entries if e.what == journal.FAN_SPEED}
    assert speed[0].outcome == journal.MADE
    assert speed[1].outcome == journal.REFUSED
    assert speed[1].error is not None and "Insufficient Permissions" in speed[1].error
    restored = [e for e in entries if e.what == journal.FAN_AUTO]
    assert [e.outcome for e in restored] == [journal.MADE, journal.MADE]
