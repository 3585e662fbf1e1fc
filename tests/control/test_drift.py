"""Limits that drifted from what the control journal says was applied last:
found by UUID, shown by power show and snapshot, an alert and a metric, and
applied again by ``profile apply --again``, journalled."""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from gpustation.control import drift, journal
from gpustation.control.drift import applied_now, find_drift, mark_drift
from gpustation.serve.exporter import snapshot_metrics
from gpustation.telemetry.alerts import conditions
from gpustation.telemetry.sampler import Sampler
from gpustation.tui.cards import card_text
from tests.control.conftest import RecordingSim, cli, journal_entries


def reboot(fake_nvml: ModuleType, index: int) -> None:
    """What a reboot or driver reload does to a limit: back to the default, unjournalled."""
    dev = fake_nvml.DRIVER.devices[index]
    dev["power_limit_mw"] = dev["power_default_mw"]


def test_no_journal_no_drift(capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType) -> None:
    code, out, _ = cli(capsys, "power", "show")
    assert code == 0 and "drift" not in out and "--again" not in out


def test_a_limit_the_journal_explains_has_not_drifted(
    capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType
) -> None:
    assert cli(capsys, "power", "set", "300", "--gpus", "0")[0] == 0
    code, out, _ = cli(capsys, "power", "show")
    assert code == 0 and "--again" not in out


def test_a_limit_reset_behind_the_journals_back_is_said_everywhere(
    capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType
) -> None:
    assert cli(capsys, "power", "set", "300", "--gpus", "0")[0] == 0
    reboot(fake_nvml, 0)
    code, out, _ = cli(capsys, "power", "show")
    assert code == 0
    want = (
        "WARNING: GPU 0: power limit 450 W, not the 300 W `gpustation power set 300 --gpus 0` "
        "set (a reboot or driver reload?): gpustation profile apply --again"
    )
    assert want in out and "GPU 1:" not in out.split("WARNING")[-1]
    code, out, _ = cli(capsys, "power", "show", "--json")
    gpus = json.loads(out)["gpus"]
    assert "300 W" in gpus[0]["limit_drift"] and gpus[1]["limit_drift"] is None
    # the snapshot JSON's field, and its table's warning
    code, out, _ = cli(capsys, "snapshot", "--json")
    doc = json.loads(out)
    assert "300 W" in doc["gpus"][0]["limit_drift"] and doc["gpus"][1]["limit_drift"] is None
    code, out, _ = cli(capsys, "snapshot")
    assert "WARNING: GPU 0: power limit 450 W" in out


def test_cards_are_matched_by_uuid_not_index(
    capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType
) -> None:
    assert cli(capsys, "power", "set", "300", "--gpus", "0")[0] == 0
    # The cards swap places (moved to other slots): the 4090 is now GPU 1.
    fake_nvml.DRIVER.devices.reverse()
    reboot(fake_nvml, 1)
    code, out, _ = cli(capsys, "power", "show", "--json")
    assert code == 0
    gpus = json.loads(out)["gpus"]
    assert gpus[0]["limit_drift"] is None and "300 W" in gpus[1]["limit_drift"]


def test_apply_again_puts_the_journalled_limit_back_and_journals_it(
    capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType
) -> None:
    assert cli(capsys, "power", "set", "300", "--gpus", "0")[0] == 0
    reboot(fake_nvml, 0)
    fake_nvml.set_calls.clear()
    code, out, _ = cli(capsys, "profile", "apply", "--again", "--dry-run")
    assert code == 0 and "would set GPU 0: 450 W -> 300 W" in out
    assert fake_nvml.set_calls == []
    code, out, _ = cli(capsys, "profile", "apply", "--again")
    assert code == 0 and "set GPU 0: 450 W -> 300 W" in out
    assert fake_nvml.set_calls == [("nvmlDeviceSetPowerManagementLimit", (0, 300_000))]
    last = journal_entries()[-1]
    assert (last.what, last.previous, last.new, last.outcome) == ("power_limit", 450, 300, "made")
    assert last.command == "gpustation profile apply --again"
    code, out, _ = cli(capsys, "profile", "apply", "--again")
    assert code == 0 and "Nothing drifted" in out


def test_apply_again_with_a_name_or_apply_without_one_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType
) -> None:
    code, _, err = cli(capsys, "profile", "apply", "quiet", "--again")
    assert code == 2 and "takes no NAME" in err
    code, _, err = cli(capsys, "profile", "apply")
    assert code == 2 and "needs a NAME" in err


def test_fans_a_curve_held_that_are_back_on_automatic_drifted(
    capsys: pytest.CaptureFixture[str], sim: RecordingSim
) -> None:
    # A curve took the fans (journalled), then the machine rebooted: fans automatic.
    journal.record(
        gpu=0, uuid=sim.read_gpus([0], slow=False)[0].uuid, what=journal.FAN_SPEED,
        previous={"mode": "auto"}, new=60, command="gpustation profile apply quiet",
        fan=0, simulated=True,
    )  # fmt: skip
    samples = sim.read_gpus([0, 1], slow=False)
    drifted = find_drift(samples, applied_now(simulated=True))
    assert list(drifted) == [0] and drifted[0].fans_left == (0,) and drifted[0].power_w is None
    assert "fans 0 on automatic, no longer under `gpustation profile apply quiet`" in (
        drifted[0].text()
    )
    code, out, _ = cli(capsys, "profile", "apply", "--again")
    assert code == 0 and "run it again" in out
    assert sim.set_calls == []  # a curve is started by its own command, not here
    # real entries never count for simulated cards
    assert find_drift(samples, applied_now(simulated=False)) == {}


def test_drift_is_an_alert_and_on_the_card(
    sim_h200: RecordingSim, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(capsys, "power", "set", "400")[0] == 0
    sim_h200.control.set_power_limit(0, 700.0)  # not journalled: like a driver reload
    snap = Sampler(sim_h200, with_host=False).sample()
    found = mark_drift(snap)
    assert list(found) == [0]
    assert snap.gpus[0].limit_drift is not None
    assert "limit_drifted" in {a.rule for a in conditions(snap)}
    assert "limit drifted: profile apply --again" in card_text(snap.gpus[0], 160).plain
    names = {m.name: m for m in snapshot_metrics(snap)}
    (sample,) = names["gpustation_limit_drifted"].samples
    assert sample.value == 1.0 and "400 W" in sample.labels["note"]


def test_the_journal_file_drift_reads_is_the_journal() -> None:
    assert drift.JOURNAL_NAME == journal.JOURNAL_NAME
