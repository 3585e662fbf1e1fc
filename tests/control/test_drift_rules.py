"""Drift, in-process: which journal entries count as applied, when a card differs
from them, how a drift reads, and the journal read again only when it changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpustation.control import drift, journal
from gpustation.control.drift import Applied, Drift, applied_now, find_drift, last_applied
from gpustation.telemetry.model import GpuSample, Snapshot


def entry(what: str, new: Any, **kw: Any) -> journal.JournalEntry:
    base: dict[str, Any] = {
        "time": 1.0,
        "host": "h",
        "gpu": 0,
        "uuid": "GPU-a",
        "what": what,
        "previous": None,
        "new": new,
        "command": "cmd",
        "simulated": True,
        "outcome": journal.MADE,
    }
    base.update(kw)
    return journal.JournalEntry(**base)


def test_only_made_power_changes_of_the_same_kind_of_card_count() -> None:
    entries = [
        entry(journal.POWER_LIMIT, 250.0, uuid=None),  # no card to match it to
        entry(journal.POWER_LIMIT, 260.0, simulated=False),  # a real card's
        entry(journal.POWER_LIMIT, 270.0, outcome=journal.REFUSED),
        entry(journal.POWER_LIMIT, 300.0, command="gpustation power set 300", time=5.0),
        entry(journal.POWER_LIMIT, 320.0, outcome=journal.UNKNOWN),  # may never have happened
    ]
    applied = last_applied(entries, simulated=True)
    assert list(applied) == ["GPU-a"]
    got = applied["GPU-a"]
    assert (got.power_w, got.power_command, got.power_time) == (
        300.0,
        "gpustation power set 300",
        5.0,
    )
    assert got.fans == {}


def test_the_limit_read_back_wins_over_the_one_asked_for() -> None:
    read = last_applied([entry(journal.POWER_LIMIT, 300.0, read_back=299.5)], True)
    assert read["GPU-a"].power_w == 299.5
    asked = last_applied([entry(journal.POWER_LIMIT, 300.0, read_back=None)], True)
    assert asked["GPU-a"].power_w == 300.0


@pytest.mark.parametrize("value", [True, "300 W", None, {"mode": "auto"}])
def test_a_limit_that_is_not_a_number_is_no_limit(value: Any) -> None:
    applied = last_applied([entry(journal.POWER_LIMIT, value)], True)
    assert applied["GPU-a"].power_w is None


def test_fans_a_curve_took_are_manual_and_fans_handed_back_are_auto() -> None:
    entries = [
        entry(journal.FAN_SPEED, 60, fan=0, command="gpustation profile apply quiet"),
        entry(journal.FAN_SPEED, 60, fan=1, command="gpustation profile apply quiet"),
        entry(journal.FAN_AUTO, {"mode": "auto"}, fan=1, command="gpustation fan auto"),
        entry(journal.FAN_SPEED, 70, fan=None),  # no fan named: counts for none
        entry(journal.FAN_AUTO, {"mode": "auto"}, fan=None),
        entry("clock_offset", 100, fan=2),  # a kind this reader does not know
    ]
    got = last_applied(entries, True)["GPU-a"]
    assert got.fans == {0: "manual", 1: "auto"}
    assert got.fan_command == "gpustation profile apply quiet"
    assert got.power_w is None


def card(index: int, uuid: str | None, limit_w: float | None, fans: list[str]) -> GpuSample:
    return GpuSample(index=index, uuid=uuid, power_limit_w=limit_w, fan_control=fans)


def test_a_card_drifts_from_half_a_watt_and_each_field_is_said() -> None:
    applied = {
        "GPU-a": Applied(power_w=300.0, power_command="gpustation power set 300"),
        "GPU-b": Applied(power_w=300.0),
        "GPU-c": Applied(fans={0: "manual", 1: "auto", 2: "manual", 3: "auto"}, fan_command="q"),
    }
    gpus = [
        card(0, "GPU-b", 300.4, []),  # within half a watt: the same limit
        card(1, "GPU-a", 300.5, []),
        card(2, "GPU-c", None, ["auto", "manual", "manual", "auto"]),
        card(3, "GPU-z", 100.0, ["auto"]),  # nothing journalled for it
    ]
    found = find_drift(gpus, applied)
    assert found == {
        1: Drift(gpu=1, uuid="GPU-a", power_w=300.0, power_now_w=300.5,
                 power_command="gpustation power set 300"),
        2: Drift(gpu=2, uuid="GPU-c", power_w=None, power_now_w=None, power_command="",
                 fans_left=(0,), fan_command="q", fans_taken=(1,)),
    }  # fmt: skip


def test_a_fan_the_card_no_longer_lists_has_not_drifted() -> None:
    applied = {"GPU-a": Applied(fans={0: "auto", 2: "manual", 3: "auto"})}
    assert find_drift([card(0, "GPU-a", None, ["auto", "manual"])], applied) == {}


def test_a_lost_card_has_not_drifted() -> None:
    lost = GpuSample(index=0, uuid="GPU-a", lost=True)
    assert find_drift([lost], {"GPU-a": Applied(power_w=300.0)}) == {}


def test_a_drift_reads_as_what_differs_and_the_command_that_puts_it_back() -> None:
    full = Drift(
        gpu=0,
        uuid="GPU-a",
        power_w=300.0,
        power_now_w=None,
        power_command="gpustation power set 300",
        fans_left=(0, 1),
        fan_command="gpustation profile apply quiet",
        fans_taken=(2, 3),
    )
    assert full.text() == (
        "power limit n/a, not the 300 W `gpustation power set 300` set; "
        "fans 0,1 on automatic, no longer under `gpustation profile apply quiet`; "
        "fans 2,3 on manual control nothing journalled "
        "(a reboot or driver reload?): gpustation profile apply --again"
    )


def write_journal(path: Path, *entries: journal.JournalEntry) -> None:
    for e in entries:
        doc = e.to_dict()
        doc.pop("id")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(doc) + "\n")


def test_the_journal_is_read_again_only_when_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "elsewhere" / "control-journal.jsonl"
    write_journal(path, entry(journal.POWER_LIMIT, 300.0))
    reads: list[Path | None] = []
    real = journal.read_journal

    def counting(p: Path | None = None) -> journal.JournalRead:
        reads.append(p)
        return real(p)

    monkeypatch.setattr(journal, "read_journal", counting)
    assert applied_now(True, path)["GPU-a"].power_w == 300.0
    assert applied_now(True, path)["GPU-a"].power_w == 300.0
    assert reads == [path]  # the second call found the journal unchanged
    write_journal(path, entry(journal.POWER_LIMIT, 250.0))
    assert applied_now(True, path)["GPU-a"].power_w == 250.0
    assert reads == [path, path]
    assert applied_now(False, path) == {}  # real cards: another answer, read on its own


def test_two_journals_are_two_answers(tmp_path: Path) -> None:
    one, two = tmp_path / "one" / "j.jsonl", tmp_path / "two" / "j.jsonl"
    write_journal(one, entry(journal.POWER_LIMIT, 300.0))
    write_journal(two, entry(journal.POWER_LIMIT, 200.0))
    assert applied_now(True, one)["GPU-a"].power_w == 300.0
    assert applied_now(True, two)["GPU-a"].power_w == 200.0
    assert applied_now(True, tmp_path / "none.jsonl") == {}


def test_drift_is_marked_from_the_journal_it_is_given(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere.jsonl"
    write_journal(path, entry(journal.POWER_LIMIT, 300.0))
    snap = Snapshot(hostname="h", time=0.0, gpus=[card(0, "GPU-a", 450.0, [])], simulated=True)
    found = drift.mark_drift(snap, path)
    assert list(found) == [0]
    assert snap.gpus[0].limit_drift == found[0].text()
    assert drift.mark_drift(snap, tmp_path / "none.jsonl") == {}
    assert snap.gpus[0].limit_drift is None
