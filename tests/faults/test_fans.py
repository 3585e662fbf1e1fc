"""Fans can always be handed back, and fans left manual with nobody driving them
are found and said."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.core import Metric

from gpustation.control import journal
from gpustation.errors import GpustationError
from gpustation.serve.exporter import Exporter
from gpustation.telemetry.sampler import Sampler
from tests.control.conftest import RecordingSim, cli


def fan_modes(sim: RecordingSim) -> set[str]:
    return {m for g in sim.read_gpus([0, 1], slow=False) for m in g.fan_control}


def test_fan_auto_hands_fans_back_when_the_journal_cannot_be_written(
    sim: RecordingSim, capsys: pytest.CaptureFixture[str]
) -> None:
    sim.control.set_fan_speed(0, 0, 80)
    sim.control.set_fan_speed(1, 1, 80)
    assert "manual" in fan_modes(sim)
    journal.journal_path().mkdir(parents=True)  # a directory where the file should be
    code, out, err = cli(capsys, "fan", "auto", "--simulate")
    assert code == 0, err
    assert fan_modes(sim) == {"auto"}
    assert "handed back, but not journalled" in err
    assert "GPU 0: 2 fans on automatic control" in out


def test_profile_apply_stock_hands_fans_back_when_the_journal_cannot_be_written(
    sim: RecordingSim, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(capsys, "power", "set", "300", "--simulate")[0] == 0
    sim.control.set_fan_speed(0, 1, 90)
    journal.journal_path().unlink()
    journal.journal_path().mkdir()
    code, _, err = cli(capsys, "profile", "apply", "stock", "--simulate")
    assert fan_modes(sim) == {"auto"}
    assert "not journalled" in err
    # the power limit could not be journalled, so it was not changed, and that is an error
    assert code == 1 and "nothing was changed" in err
    assert {g.power_limit_w for g in sim.read_gpus([0, 1], slow=False)} == {300.0}


def test_a_fan_the_card_refuses_to_hand_back_is_said_not_hidden(
    sim: RecordingSim, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sim.control.set_fan_speed(0, 0, 80)
    sim.control.set_fan_speed(0, 1, 80)
    real = sim.control.set_fan_auto

    def refuse_fan_1(index: int, fan: int) -> None:
        if fan == 1:
            raise GpustationError("the driver refused")
        real(index, fan)

    monkeypatch.setattr(sim.control, "set_fan_auto", refuse_fan_1)
    code, out, err = cli(capsys, "fan", "auto", "--simulate", "--gpus", "0")
    assert code == 1
    assert "GPU 0: 1 of 2 fans on automatic control" in out
    assert "fan 1: the driver refused" in err
    entries = list(journal.read_entries())
    assert [e.outcome for e in entries] == [journal.MADE, journal.REFUSED]


def test_the_hand_back_goes_on_past_a_fan_that_failed(
    sim: RecordingSim, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first fan of the first card refuses: every later fan, and the next
    card's, is still handed back (a fan left manual is the worst state)."""
    for gpu in (0, 1):
        for fan in (0, 1):
            sim.control.set_fan_speed(gpu, fan, 80)
    real = sim.control.set_fan_auto

    def refuse_the_first(index: int, fan: int) -> None:
        if (index, fan) == (0, 0):
            raise GpustationError("the driver refused")
        real(index, fan)

    monkeypatch.setattr(sim.control, "set_fan_auto", refuse_the_first)
    code, out, err = cli(capsys, "fan", "auto", "--simulate")
    assert code == 1 and "fan 0: the driver refused" in err
    modes = [g.fan_control for g in sim.read_gpus([0, 1], slow=False)]
    assert modes == [["manual", "auto"], ["auto", "auto"]]
    assert "GPU 0: 1 of 2 fans on automatic control" in out
    assert "GPU 1: 2 fans on automatic control" in out


def _families(exporter: Exporter) -> dict[str, Metric]:
    return {m.name: m for m in exporter.registry.collect()}


def test_fans_left_manual_with_no_controller_are_flagged(
    sim: RecordingSim, capsys: pytest.CaptureFixture[str], gpustation_dirs: dict[str, Path]
) -> None:
    sim.control.set_fan_speed(1, 0, 70)  # as a controller killed with SIGKILL leaves them
    code, out, _ = cli(capsys, "fan", "show", "--simulate")
    assert code == 0
    (line,) = [x for x in out.splitlines() if "NO CONTROLLER" in x]
    assert line.startswith("GPU 1")
    code, out, _ = cli(capsys, "snapshot", "--simulate")
    assert "WARNING: GPU 1 fan 0 on manual control with no fan controller" in out
    exporter = Exporter(Sampler(sim).sample, interval_s=60)
    exporter.sample_once()
    exporter._refresh_extras()
    metric = _families(exporter)["gpustation_fan_manual_unattended"]
    flagged = {(s.labels["gpu"], s.labels["fan"]) for s in metric.samples if s.value == 1.0}
    assert flagged == {("1", "0")}


def test_fans_a_live_controller_drives_are_not_flagged(
    sim: RecordingSim, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpustation.control import fancurve

    sim.control.set_fan_speed(1, 0, 70)
    path = fancurve._lock_path(1, True)
    path.parent.mkdir(parents=True, exist_ok=True)
    with fancurve._hold_locks([1], True):
        code, out, _ = cli(capsys, "fan", "show", "--simulate")
    assert code == 0 and "NO CONTROLLER" not in out
    assert os.getpid() > 0
