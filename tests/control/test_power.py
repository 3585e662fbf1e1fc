"""Power limits: planning against each card's range, dry runs, journal, reset, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from gpustation.control import journal
from gpustation.control.power import apply_power, plan_power
from gpustation.control.profiles import PowerValue
from gpustation.errors import EXIT_NEEDS_ROOT, EXIT_NOT_SUPPORTED, GpustationError, UsageError
from tests.control.conftest import RecordingSim, cli, journal_entries


def limits(sim: RecordingSim) -> list[float | None]:
    return [g.power_limit_w for g in sim.read_gpus([0, 1], slow=False)]


def test_set_percentage_and_watts_on_simulated_cards(
    capsys: pytest.CaptureFixture[str], sim: RecordingSim
) -> None:
    code, out, _ = cli(capsys, "power", "set", "80%", "--simulate")
    assert code == 0
    assert "SIMULATED" in out
    assert "GPU 0: 450 W -> 360 W (range 150-600 W, default 450 W)" in out
    assert "do not survive a reboot" in out
    assert limits(sim) == [360.0, 360.0]

    code, out, _ = cli(capsys, "power", "set", "300 w", "--gpus", "1", "--simulate")
    assert code == 0
    assert limits(sim) == [360.0, 300.0]


def test_out_of_range_is_refused_with_the_range_and_nothing_changes(
    capsys: pytest.CaptureFixture[str], sim: RecordingSim
) -> None:
    cli(capsys, "power", "set", "400", "--gpus", "1", "--simulate")
    code, _, err = cli(capsys, "power", "set", "120%", "--simulate")
    # 120 % of 450 W = 540 W fits; 140 % = 630 W does not.
    assert code == 0
    code, _, err = cli(capsys, "power", "set", "140%", "--simulate")
    assert code == 2
    assert "GPU 0: 630 W (140%) is outside the card's range 150-600 W" in err
    assert "GPU 1: 630 W (140%) is outside the card's range 150-600 W" in err
    assert limits(sim) == [540.0, 540.0]
    entries_before = len(journal_entries())
    code, _, err = cli(capsys, "power", "set", "100W", "--simulate")
    assert code == 2 and "100 W is outside the card's range 150-600 W" in err
    assert len(journal_entries()) == entries_before


def test_plan_refuses_every_card_when_one_does_not_fit(sim: RecordingSim) -> None:
    samples = sim.read_gpus([0, 1], slow=False)
    samples[1].power_max_w = 350.0  # a smaller card beside a bigger one
    with pytest.raises(UsageError, match="GPU 1: 400 W is outside the card's range 150-350 W"):
        plan_power(samples, PowerValue("watts", 400))
    assert sim.set_calls == []


def test_bad_value_is_a_usage_error(capsys: pytest.CaptureFixture[str], sim: RecordingSim) -> None:
    code, _, err = cli(capsys, "power", "set", "lots", "--simulate")
    assert code == 2 and "expected watts" in err


def test_dry_run_validates_prints_and_touches_nothing(
    capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType, gpustation_dirs: dict[str, Path]
) -> None:
    # The fake driver's machine: an RTX 4090 (450 W default) and an H200 (200-700 W).
    code, out, _ = cli(capsys, "power", "set", "80%", "--dry-run")
    assert code == 0, out
    assert "GPU 0: 450 W -> 360 W (range 150-600 W, default 450 W)" in out
    assert "GPU 1: 700 W -> 560 W (range 200-700 W, default 700 W)" in out
    code, _, err = cli(capsys, "power", "set", "650W", "--dry-run")
    assert code == 2 and "GPU 0: 650 W is outside the card's range 150-600 W" in err
    code, out, _ = cli(capsys, "power", "reset", "--dry-run")
    assert code == 0
    assert fake_nvml.set_calls == []
    assert not (gpustation_dirs["state"] / "control-journal.jsonl").exists()


def test_set_goes_through_nvml_in_milliwatts_after_the_journal(
    capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType
) -> None:
    code, _, _ = cli(capsys, "power", "set", "78%", "--gpus", "0")
    assert code == 0
    assert fake_nvml.set_calls == [("nvmlDeviceSetPowerManagementLimit", (0, 351_000))]
    [entry] = journal_entries()
    assert (entry.gpu, entry.what, entry.previous, entry.new) == (0, "power_limit", 450.0, 351.0)
    assert entry.uuid and entry.command == "gpustation power set 78% --gpus 0"
    assert not entry.simulated


def test_needs_root_exits_4_with_sudo_hint_and_journal_came_first(
    capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType
) -> None:
    fake_nvml.reset(require_root=True)
    code, _, err = cli(capsys, "power", "set", "300", "--gpus", "0")
    assert code == EXIT_NEEDS_ROOT
    assert "sudo gpustation" in err
    assert fake_nvml.set_calls == []
    # The intent was written before the driver was asked.
    [entry] = journal_entries()
    assert (entry.previous, entry.new) == (450.0, 300.0)


def test_a_failure_on_a_later_card_undoes_the_earlier_ones(sim: RecordingSim) -> None:
    samples = sim.read_gpus([0, 1], slow=False)
    changes = plan_power(samples, PowerValue("watts", 300))
    original = sim.control.set_power_limit

    def refuse_gpu1(index: int, watts: float) -> None:
        if index == 1:
            raise GpustationError("GPU 1 refused")
        original(index, watts)

    sim.control.set_power_limit = refuse_gpu1  # type: ignore[method-assign]
    with pytest.raises(GpustationError, match="GPU 1 refused"):
        apply_power(sim, changes, "test")
    assert limits(sim) == [450.0, 450.0]
    whats = [(e.gpu, e.previous, e.new) for e in journal_entries()]
    assert whats == [(0, 450.0, 300.0), (1, 450.0, 300.0), (0, 300.0, 450.0)]


def test_reset_restores_the_default_and_skips_cards_already_there(
    capsys: pytest.CaptureFixture[str], sim: RecordingSim
) -> None:
    cli(capsys, "power", "set", "250", "--gpus", "0", "--simulate")
    sim.set_calls.clear()
    code, out, _ = cli(capsys, "power", "reset", "--simulate")
    assert code == 0
    assert limits(sim) == [450.0, 450.0]
    assert "GPU 1: already at 450 W, unchanged" in out
    entries = journal_entries()
    assert [(e.gpu, e.previous, e.new, e.command) for e in entries] == [
        (0, 450.0, 250.0, "gpustation power set 250 --gpus 0"),
        (0, 250.0, 450.0, "gpustation power reset"),
    ]


def test_show_lists_limits_and_says_they_are_not_persistent(
    capsys: pytest.CaptureFixture[str], sim: RecordingSim
) -> None:
    cli(capsys, "power", "set", "350", "--gpus", "1", "--simulate")
    code, out, _ = cli(capsys, "power", "show", "--simulate")
    assert code == 0
    assert "350 W (78%)" in out and "150-600 W" in out
    assert "do not survive a reboot or a driver reload" in out
    code, out, _ = cli(capsys, "power", "show", "--json", "--simulate")
    doc = json.loads(out)
    assert doc["persistent"] is False and doc["simulated"] is True
    assert [g["power_limit_w"] for g in doc["gpus"]] == [450.0, 350.0]


def test_journal_command_prints_entries(
    capsys: pytest.CaptureFixture[str], sim: RecordingSim
) -> None:
    code, out, _ = cli(capsys, "power", "journal")
    assert code == 0 and "empty" in out
    cli(capsys, "power", "set", "300", "--gpus", "0", "--simulate")
    cli(capsys, "power", "reset", "--simulate")
    code, out, _ = cli(capsys, "power", "journal")
    lines = out.splitlines()
    assert len(lines) == 2
    assert (
        "GPU 0  power_limit: 450 W -> 300 W  (gpustation power set 300 --gpus 0) [SIMULATED]"
        in lines[0]
    )
    code, out, _ = cli(capsys, "power", "journal", "--json", "--last", "1")
    [line] = out.splitlines()
    assert json.loads(line)["new"] == 450.0


def test_journal_survives_a_torn_last_line(gpustation_dirs: dict[str, Path]) -> None:
    journal.record(gpu=0, uuid="u", what="power_limit", previous=450, new=300, command="t")
    with journal.journal_path().open("a") as f:
        f.write('{"time": 1, "gpu"')  # a crash mid-write
    assert [e.new for e in journal.read_entries()] == [300]


def test_unsupported_power_control_exits_5(
    capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType
) -> None:
    fake_nvml.fail(
        0, "nvmlDeviceGetPowerManagementLimitConstraints", fake_nvml.NVML_ERROR_NOT_SUPPORTED
    )
    code, _, err = cli(capsys, "power", "set", "300", "--gpus", "0")
    assert code == EXIT_NOT_SUPPORTED
    assert "does not report the power limits it accepts" in err
    assert fake_nvml.set_calls == []
