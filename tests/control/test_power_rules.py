"""Power limits, in-process: what a plan says of each card, what apply reads again
under the lock, what it skips, what a lease refuses, and what the journal keeps of
a refusal, an undo and a read-back that does not match."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpustation.control import journal, lease
from gpustation.control.power import PowerChange, apply_power, plan_power, power_range
from gpustation.control.profiles import PowerValue
from gpustation.errors import GpustationError, NotSupportedError, UsageError
from gpustation.telemetry.model import GpuSample
from gpustation.telemetry.sim import machine_path
from tests.control.conftest import RecordingSim, journal_entries


def limits(sim: RecordingSim) -> list[float | None]:
    return [g.power_limit_w for g in sim.read_gpus([0, 1], slow=False)]


def test_a_change_says_n_a_for_what_the_card_did_not_report() -> None:
    change = PowerChange(0, None, None, None, 300.0, None, 100.0, 400.0)
    assert change.describe() == "GPU 0: n/a -> 300 W (range 100-400 W)"
    assert not change.unchanged
    known = PowerChange(1, None, None, 299.6, 300.0, 350.0, 100.0, 400.0)
    assert known.describe() == "GPU 1: 299.6 W -> 300 W (range 100-400 W, default 350 W)"
    assert known.unchanged  # within half a watt


def test_a_card_that_gives_only_one_end_of_its_range_cannot_be_set() -> None:
    for sample in (
        GpuSample(index=2, power_min_w=100.0),
        GpuSample(index=2, power_max_w=400.0),
    ):
        with pytest.raises(NotSupportedError) as raised:
            power_range(sample)
        assert str(raised.value) == (
            "GPU 2 does not report the power limits it accepts; its power limit cannot be changed."
        )
    assert power_range(GpuSample(index=2, power_min_w=100.0, power_max_w=400.0)) == (100.0, 400.0)


def test_every_card_that_cannot_take_the_value_is_named() -> None:
    samples = [
        GpuSample(index=0, name="A", power_min_w=100.0, power_max_w=400.0),
        GpuSample(index=1, name="B"),
        GpuSample(index=2, name="C", power_min_w=100.0, power_max_w=400.0),
        GpuSample(index=3),
    ]
    with pytest.raises(NotSupportedError) as raised:
        plan_power(samples, PowerValue("percent", 80.0))
    assert str(raised.value) == (
        "GPU 0 (A) does not report its default power limit, so 80% cannot be worked out; give "
        "the limit in watts. GPU 1 (B) does not report the power limits it accepts; its power "
        "limit cannot be changed. GPU 2 (C) does not report its default power limit, so 80% "
        "cannot be worked out; give the limit in watts. GPU 3 does not report the power limits "
        "it accepts; its power limit cannot be changed. Nothing was changed."
    )


def test_apply_reads_each_limit_again_under_the_lock(sim: RecordingSim) -> None:
    changes = plan_power(sim.read_gpus([0, 1], slow=False), PowerValue("watts", 300))
    sim.control.set_power_limit(1, 350.0)  # changed by someone else after the plan
    apply_power(sim, changes, "test")
    assert [c.current_w for c in changes] == [450.0, 350.0]
    assert [(e.gpu, e.previous, e.new) for e in journal_entries()] == [
        (0, 450.0, 300.0),
        (1, 350.0, 300.0),
    ]


def test_a_card_already_at_the_limit_is_skipped_and_the_next_one_is_set(
    sim: RecordingSim,
) -> None:
    sim.control.set_power_limit(0, 300.0)
    sim.set_calls.clear()
    changes = plan_power(sim.read_gpus([0, 1], slow=False), PowerValue("watts", 300))
    seen: list[int] = []
    done = apply_power(sim, changes, "test", on_change=lambda c: seen.append(c.gpu))
    assert [c.gpu for c in done] == [1] and seen == [1]
    assert sim.set_calls == [("power", 1, 300.0)]
    assert limits(sim) == [300.0, 300.0]


def test_a_lease_on_the_cards_refuses_everyone_but_its_owner(sim: RecordingSim) -> None:
    uuids = [g.uuid for g in sim.read_gpus([0, 1], slow=False)]
    lease.take(lease.Lease("sweep-a", "sweep a", [(1, uuids[1])], simulated=True))
    lease.take(lease.Lease("real", "sweep real", [(0, uuids[0])], simulated=False))
    changes = plan_power(sim.read_gpus([0, 1], slow=False), PowerValue("watts", 300))
    with pytest.raises(lease.LeaseHeld) as raised:
        apply_power(sim, changes, "gpustation power set 300")
    assert str(raised.value).startswith("`gpustation power set 300` is refused: sweep a (pid ")
    assert limits(sim) == [450.0, 450.0] and journal_entries() == []
    # The owner itself may, and a lease on real cards says nothing of simulated ones.
    apply_power(sim, changes, "sweep a: point 1", owner="sweep-a")
    assert limits(sim) == [300.0, 300.0]


def test_an_undo_is_journalled_as_an_undo(sim: RecordingSim) -> None:
    changes = plan_power(sim.read_gpus([0, 1], slow=False), PowerValue("watts", 300))
    real = sim.control.set_power_limit

    def refuse_gpu1(index: int, watts: float) -> None:
        if index == 1:
            raise GpustationError("")  # a refusal with no text
        real(index, watts)

    sim.control.set_power_limit = refuse_gpu1  # type: ignore[method-assign]
    with pytest.raises(GpustationError):
        apply_power(sim, changes, "gpustation power set 300")
    got = [(e.gpu, e.command, e.outcome, e.error) for e in journal_entries()]
    assert got == [
        (0, "gpustation power set 300", journal.MADE, None),
        (1, "gpustation power set 300", journal.REFUSED, "GpustationError"),
        (0, "gpustation power set 300 (undo after a failure)", journal.MADE, None),
    ]
    assert limits(sim) == [450.0, 450.0]


@pytest.mark.parametrize("off_w", [0.5, 1.0])
def test_a_limit_the_card_does_not_read_back_is_an_error(sim: RecordingSim, off_w: float) -> None:
    real = sim.control.set_power_limit

    def rounds_down(index: int, watts: float) -> None:
        real(index, watts - off_w)

    sim.control.set_power_limit = rounds_down  # type: ignore[method-assign]
    changes = plan_power(sim.read_gpus([0], slow=False), PowerValue("watts", 300))
    with pytest.raises(GpustationError) as raised:
        apply_power(sim, changes, "test")
    assert str(raised.value) == (
        f"GPU 0: the driver accepted 300 W but the card reads back {300 - off_w:g} W; "
        "check `nvidia-smi -q -d POWER`."
    )
    [entry, *_] = journal_entries()
    assert entry.outcome == journal.MADE and entry.read_back == 300 - off_w


def test_a_limit_read_back_within_half_a_watt_is_the_limit(
    sim: RecordingSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = sim.control.set_power_limit
    monkeypatch.setattr(sim.control, "set_power_limit", lambda i, w: real(i, w - 0.25))
    changes = plan_power(sim.read_gpus([0], slow=False), PowerValue("watts", 300))
    assert [c.gpu for c in apply_power(sim, changes, "test")] == [0]


def test_a_limit_at_either_end_of_the_range_fits_and_every_card_past_it_is_named(
    sim: RecordingSim,
) -> None:
    samples = sim.read_gpus([0, 1], slow=False)
    low = plan_power(samples, PowerValue("watts", 150.0))
    assert [(c.gpu, c.new_w, c.name) for c in low] == [(s.index, 150.0, s.name) for s in samples]
    assert [c.new_w for c in plan_power(samples, PowerValue("watts", 600.0))] == [600.0, 600.0]
    with pytest.raises(UsageError) as raised:
        plan_power(samples, PowerValue("percent", 140.0))
    assert str(raised.value) == (
        "GPU 0: 630 W (140%) is outside the card's range 150-600 W; "
        "GPU 1: 630 W (140%) is outside the card's range 150-600 W. Nothing was changed."
    )


def test_an_undo_skips_a_card_whose_limit_was_unknown_and_puts_the_others_back(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    three = RecordingSim(count=3, card="rtx4090", state_path=machine_path("rtx4090", 3))
    real_read, real_set = three.read_gpus, three.control.set_power_limit

    def unknown_on_1(indices: list[int], slow: bool) -> list[GpuSample]:
        samples = real_read(indices, slow)
        for s in samples:
            if s.index == 1:
                s.power_limit_w = None
        return samples

    def refuse_2(index: int, watts: float) -> None:
        if index == 2:
            raise GpustationError("GPU 2 refused")
        real_set(index, watts)

    monkeypatch.setattr(three, "read_gpus", unknown_on_1)
    monkeypatch.setattr(three.control, "set_power_limit", refuse_2)
    changes = plan_power(three.read_gpus([0, 1, 2], slow=False), PowerValue("watts", 300))
    with pytest.raises(GpustationError, match="GPU 2 refused"):
        apply_power(three, changes, "test")
    assert [g.power_limit_w for g in real_read([0, 1, 2], False)] == [450.0, 300.0, 450.0]
    assert three.set_calls == [("power", 0, 300.0), ("power", 1, 300.0), ("power", 0, 450.0)]
