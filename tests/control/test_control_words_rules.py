"""Small control rules stated exactly: a power value and a card as people read them,
the profile listing, the controller a dashboard leaves behind, and which process is
taken for a gpustation fan controller."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpustation.control import fancurve, live, power, profiles
from gpustation.errors import GpustationError
from gpustation.paths import user_profiles_dir
from tests.control.conftest import RecordingSim


def test_power_values_as_people_read_them() -> None:
    assert str(profiles.PowerValue("default", 0.0)) == "default"
    assert str(profiles.PowerValue("percent", 78.0)) == "78%"
    assert str(profiles.PowerValue("percent", 62.5)) == "62.5%"
    assert str(profiles.PowerValue("watts", 300.0)) == "300 W"


def test_a_card_that_cannot_be_set_is_named_with_its_model(sim_h200: RecordingSim) -> None:
    sample = sim_h200.read_gpus([0], slow=False)[0]
    assert power._label(sample) == f"GPU 0 ({sample.name})"
    sample.name = ""
    assert power._label(sample) == "GPU 0"
    sample.lost = True
    with pytest.raises(GpustationError) as err:
        power.plan_power([sample], profiles.PowerValue("watts", 300.0))
    assert str(err.value).startswith("GPU 0 has fallen off the bus")


def test_the_profile_listing_names_user_files_that_replace_shipped_ones(
    gpustation_dirs: dict[str, Path],
) -> None:
    shipped = {p.stem for p in profiles.shipped_profiles_dir().glob("*.toml")}
    user_dir = user_profiles_dir()
    user_dir.mkdir(parents=True, exist_ok=True)
    (user_dir / "quiet.toml").write_text('description = "mine"\n[power]\nlimit = "60%"\n')
    (user_dir / "broken.toml").write_text("power_limit = [")
    listed = {item.name: item for item in profiles.list_profiles()}
    assert set(listed) == shipped | {"quiet", "broken"}
    assert not listed["quiet"].shipped and listed["quiet"].overrides_shipped
    assert listed["quiet"].profile is not None and listed["quiet"].profile.description == "mine"
    assert listed["broken"].profile is None and listed["broken"].error
    assert not listed["broken"].overrides_shipped
    stock = listed["stock"]
    assert stock.shipped and not stock.overrides_shipped and stock.error is None
    assert [item.name for item in profiles.list_profiles()] == sorted(listed)


def test_the_controller_a_dashboard_leaves_running_is_gpustation_fan_run() -> None:
    argv = live.fan_controller_argv("balanced", "0,1")
    assert argv[0] == sys.executable
    assert argv[-7:] == ["-m", "gpustation", "fan", "run", "balanced", "--gpus", "0,1"]


def test_only_a_gpustation_process_is_taken_for_a_fan_controller() -> None:
    named = subprocess.Popen(["bash", "-c", "exec -a gpustation sleep 30"])
    other = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 30
        while not fancurve._is_gpustation(named.pid):  # until bash has become it
            assert time.monotonic() < deadline, "the named process never started"
            time.sleep(0.01)
        assert fancurve._is_gpustation(other.pid) is False
    finally:
        for proc in (named, other):
            proc.kill()
            proc.wait()
    assert fancurve._is_gpustation(named.pid) is False  # gone: nothing to read
