"""`gpustation profile apply`: power then fans, all checked before anything is touched."""

from __future__ import annotations

from types import ModuleType

import pytest

from gpustation.errors import EXIT_NOT_SUPPORTED
from tests.control.conftest import RecordingSim, cli, journal_entries


def test_balanced_sets_78_percent_then_runs_the_curve(
    capsys: pytest.CaptureFixture[str], sim: RecordingSim
) -> None:
    code, out, err = cli(capsys, "profile", "apply", "balanced", "--simulate", "--once")
    assert code == 0, err
    assert "GPU 0: 450 W -> 351 W" in out
    samples = sim.read_gpus([0, 1], slow=False)
    assert [s.power_limit_w for s in samples] == [351.0, 351.0]
    # The curve ran (fans were set) and handed the fans back when it ended.
    assert any(c[0] == "fan" for c in sim.set_calls)
    assert all(m == "auto" for s in samples for m in s.fan_control)
    whats = [e.what for e in journal_entries()]
    assert whats[:2] == ["power_limit", "power_limit"] and "fan_speed" in whats


def test_power_only_leaves_the_fans(capsys: pytest.CaptureFixture[str], sim: RecordingSim) -> None:
    code, _, _ = cli(capsys, "profile", "apply", "quiet", "--simulate", "--power-only")
    assert code == 0
    assert [c[0] for c in sim.set_calls] == ["power", "power"]
    assert [s.power_limit_w for s in sim.read_gpus([0, 1], slow=False)] == [315.0, 315.0]


def test_curve_profile_on_a_card_without_fans_exits_5_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], sim_h200: RecordingSim
) -> None:
    code, _, err = cli(capsys, "profile", "apply", "balanced", "--simulate")
    assert code == EXIT_NOT_SUPPORTED
    assert "has no fans" in err and "--power-only" in err
    assert sim_h200.set_calls == []
    assert journal_entries() == []
    # The same profile's power part fits an H200: 78 % of 700 W.
    code, out, _ = cli(capsys, "profile", "apply", "balanced", "--simulate", "--power-only")
    assert code == 0 and "GPU 0: 700 W -> 546 W" in out


def test_stock_on_a_card_without_fans_only_resets_power(
    capsys: pytest.CaptureFixture[str], sim_h200: RecordingSim
) -> None:
    cli(capsys, "power", "set", "500", "--simulate")
    code, _, err = cli(capsys, "profile", "apply", "stock", "--simulate")
    assert code == 0, err
    assert sim_h200.read_gpus([0], slow=False)[0].power_limit_w == 700.0


def test_profile_dry_run_on_the_fake_driver_sets_nothing(
    capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType
) -> None:
    code, out, _ = cli(capsys, "profile", "apply", "balanced", "--gpus", "0", "--dry-run")
    assert code == 0
    assert "would set GPU 0: 450 W -> 351 W" in out
    assert "would set" in out and "2 fans" in out
    code, out, _ = cli(capsys, "profile", "apply", "stock", "--dry-run")
    assert code == 0 and "unchanged" in out
    assert fake_nvml.set_calls == []
    assert journal_entries() == []
