"""Handing fans back to the card, in-process: what the journal keeps of each fan,
how many were manual, which failed, and what a selection without fans says."""

from __future__ import annotations

import signal
import subprocess
from types import ModuleType
from typing import Any

import pytest

from gpustation.control import fans, journal
from gpustation.errors import GpustationError, NotSupportedError
from gpustation.paths import state_dir
from gpustation.telemetry.nvml import NvmlBackend
from tests.control.conftest import RecordingSim, standin


def test_each_fan_is_journalled_with_what_it_was_and_read_back_auto(sim: RecordingSim) -> None:
    sim.control.set_fan_speed(1, 0, 80)
    before = sim.read_gpus([1], slow=False)[0]
    done = fans.set_fans_auto(sim, [1], "gpustation fan auto --gpus 1")
    assert [(r.gpu, r.fans, r.were_manual, r.failed, r.journal_error) for r in done] == [
        (1, 2, 1, [], None)
    ]
    assert done[0].ok
    entries = journal.read_journal().entries
    assert [(e.gpu, e.fan, e.what, e.new, e.outcome, e.read_back) for e in entries] == [
        (1, 0, journal.FAN_AUTO, {"mode": "auto"}, journal.MADE, {"mode": "auto"}),
        (1, 1, journal.FAN_AUTO, {"mode": "auto"}, journal.MADE, {"mode": "auto"}),
    ]
    assert entries[0].previous == {"mode": "manual", "pct": before.fans_pct[0]}
    assert entries[1].previous == {"mode": before.fan_control[1], "pct": before.fans_pct[1]}
    assert {e.command for e in entries} == {"gpustation fan auto --gpus 1"}
    assert {e.uuid for e in entries} == {before.uuid} and {e.simulated for e in entries} == {True}
    assert set(sim.read_gpus([1], slow=False)[0].fan_control) == {"auto"}
    assert ("auto", 1, 0) in sim.set_calls and ("auto", 0, 0) not in sim.set_calls


def test_a_fan_that_failed_is_named_and_the_rest_go_back(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    for gpu in (0, 1):
        sim.control.set_fan_speed(gpu, 0, 70)
        sim.control.set_fan_speed(gpu, 1, 70)
    real = sim.control.set_fan_auto

    def refuse(index: int, fan: int) -> None:
        if (index, fan) == (0, 0):
            raise GpustationError("the driver refused")
        real(index, fan)

    monkeypatch.setattr(sim.control, "set_fan_auto", refuse)
    done = fans.set_fans_auto(sim, [0, 1], "cmd")
    assert [(r.gpu, r.were_manual, r.failed) for r in done] == [
        (0, 2, ["fan 0: the driver refused"]),
        (1, 2, []),
    ]
    assert not done[0].ok and done[1].ok
    outcomes = [(e.gpu, e.fan, e.outcome, e.error) for e in journal.read_journal().entries]
    assert outcomes == [
        (0, 0, journal.REFUSED, "the driver refused"),
        (0, 1, journal.MADE, None),
        (1, 0, journal.MADE, None),
        (1, 1, journal.MADE, None),
    ]


def test_fans_go_back_even_when_the_journal_cannot_be_written(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim.control.set_fan_speed(0, 1, 90)

    def full(**_kw: Any) -> journal.JournalEntry:
        raise GpustationError("cannot write the control journal: no space")

    monkeypatch.setattr(journal, "record", full)
    (done,) = fans.set_fans_auto(sim, [0], "cmd")
    assert done.journal_error == "cannot write the control journal: no space"
    assert done.ok and done.were_manual == 1
    assert set(sim.read_gpus([0], slow=False)[0].fan_control) == {"auto"}


def test_a_held_control_lock_does_not_keep_the_fans_manual(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim.control.set_fan_speed(0, 0, 90)

    def busy(**_kw: Any) -> Any:
        raise GpustationError("another gpustation process has held the lock")

    monkeypatch.setattr(journal, "control_lock", busy)
    monkeypatch.setattr(
        journal, "record", lambda **_kw: (_ for _ in ()).throw(GpustationError("x"))
    )
    (done,) = fans.set_fans_auto(sim, [0], "cmd")
    assert done.ok and set(sim.read_gpus([0], slow=False)[0].fan_control) == {"auto"}


def test_a_sample_that_lists_fewer_fans_than_the_card_has(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = sim.read_gpus

    def short(indices: list[int], slow: bool = False) -> list[Any]:
        out = real(indices, slow=slow)
        for s in out:
            s.fan_control = s.fan_control[:1]
            s.fans_pct = s.fans_pct[:1]
        return out

    monkeypatch.setattr(sim, "read_gpus", short)
    (done,) = fans.set_fans_auto(sim, [0], "cmd")
    assert done.fans == 2
    assert journal.read_journal().entries[1].previous == {"mode": None, "pct": None}


def test_a_selection_without_fans_is_refused_or_skipped(sim_h200: RecordingSim) -> None:
    with pytest.raises(NotSupportedError) as err:
        fans.set_fans_auto(sim_h200, [0], "cmd")
    name = sim_h200.read_gpus([0], slow=False)[0].name
    assert str(err.value) == (
        f"GPU 0 ({name}): no fans gpustation can control (datacenter cards are cooled by "
        "the chassis); nothing was changed."
    )
    assert fans.set_fans_auto(sim_h200, [0], "cmd", require_fans=False) == []
    assert fans.set_fans_auto(sim_h200, [0], "cmd", False) == []
    assert fans.fan_gpus(sim_h200, sim_h200.read_gpus([0], slow=False)) == []
    assert journal.read_journal().entries == []


def test_the_default_refuses_a_selection_without_fans(
    sim_h200: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = sim_h200.read_gpus

    def nameless(indices: list[int], slow: bool = False) -> list[Any]:
        out = real(indices, slow=slow)
        for s in out:
            s.name = ""
        return out

    monkeypatch.setattr(sim_h200, "read_gpus", nameless)
    with pytest.raises(NotSupportedError, match=r"^GPU 0: no fans gpustation can control"):
        fans.set_fans_auto(sim_h200, [0], "cmd")


def test_a_card_with_a_single_fan_is_handed_back(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim.control.set_fan_speed(0, 0, 80)
    monkeypatch.setattr(sim.control, "fan_count", lambda i: 1)
    assert [s.index for s in fans.fan_gpus(sim, sim.read_gpus([0, 1], slow=False))] == [0, 1]
    done = fans.set_fans_auto(sim, [0], "cmd")
    assert [(r.gpu, r.fans, r.were_manual) for r in done] == [(0, 1, 1)]
    assert sim.read_gpus([0], slow=False)[0].fan_control[0] == "auto"


def test_every_card_without_fans_is_named(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sim.control, "fan_count", lambda i: 0)
    names = [s.name for s in sim.read_gpus([0, 1], slow=False)]
    with pytest.raises(NotSupportedError) as err:
        fans.set_fans_auto(sim, [0, 1], "cmd")
    assert str(err.value).startswith(f"GPU 0 ({names[0]}), GPU 1 ({names[1]}): no fans ")


def test_handing_back_stops_another_program_s_controller_of_those_cards_first(
    sim: RecordingSim, standins: list[subprocess.Popen[bytes]]
) -> None:
    other = standin(state_dir() / "fan-control-sim-gpu0.lock", "gpustation fan run quiet")
    standins.append(other)
    fans.set_fans_auto(sim, [0], "gpustation fan auto")
    assert other.wait(timeout=30) == -signal.SIGTERM


def test_fans_of_a_real_card_go_back_through_the_driver(fake_nvml: ModuleType) -> None:
    backend = NvmlBackend(nvml=fake_nvml)
    try:
        (done,) = fans.set_fans_auto(backend, [0], "gpustation fan auto --gpus 0")
    finally:
        backend.close()
    assert (done.gpu, done.fans, done.ok) == (0, 2, True)
    assert fake_nvml.set_calls == [
        ("nvmlDeviceSetDefaultFanSpeed_v2", (0, 0)),
        ("nvmlDeviceSetDefaultFanSpeed_v2", (0, 1)),
    ]
