"""Simulated machines never disturb each other, and a damaged state file never
stops a command."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from gpustation.telemetry.sim import SimBackend, machine_path
from gpustation.telemetry.sim_last import LAST_MACHINE_FILE
from tests.conftest import child_env, gpustation_cmd


def gs(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpustation_cmd(*argv), env=child_env(), capture_output=True, text=True, timeout=60
    )


def test_a_snapshot_of_other_simulated_cards_leaves_an_open_machine_alone(
    gpustation_dirs: dict[str, Path],
) -> None:
    dashboard = SimBackend.open(count=2, card="rtx4090")  # what an open dashboard holds
    assert gs("power", "set", "300", "--simulate", "2", "--sim-card", "rtx4090").returncode == 0
    other = gs("snapshot", "--json", "--simulate", "4", "--sim-card", "h200")
    assert other.returncode == 0, other.stderr
    assert len(json.loads(other.stdout)["gpus"]) == 4
    # the RTX 4090 machine still reads, with its limits and fans as they were
    gpus = dashboard.read_gpus([0, 1], slow=False)
    assert [g.power_limit_w for g in gpus] == [300.0, 300.0]
    assert all(len(g.fans_pct) == 2 for g in gpus)


def test_plain_simulate_means_the_machine_last_opened_and_the_default_first(
    gpustation_dirs: dict[str, Path],
) -> None:
    first = json.loads(gs("snapshot", "--json", "--simulate").stdout)
    assert len(first["gpus"]) == 2 and "4090" in first["gpus"][0]["name"]  # the documented default
    assert gs("snapshot", "--simulate", "3", "--sim-card", "h200").returncode == 0
    again = json.loads(gs("snapshot", "--json", "--simulate").stdout)
    assert len(again["gpus"]) == 3 and "H200" in again["gpus"][0]["name"]
    assert (gpustation_dirs["state"] / LAST_MACHINE_FILE).exists()


def test_a_state_file_of_the_wrong_shape_is_started_afresh(
    gpustation_dirs: dict[str, Path],
) -> None:
    path = machine_path("rtx4090", 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    for damaged in (
        "[1, 2]",
        '{"gpus": 5}',
        '{"gpus": [{"power_limit_w": "high"}, {}], "updated": 1}',
        "[" * 5000,
        "\x00\xff",
    ):
        path.write_text(damaged)
        result = gs("power", "set", "310", "--simulate", "2")
        assert result.returncode == 0, (damaged, result.stderr)
        shown = json.loads(gs("snapshot", "--json", "--simulate", "2").stdout)
        assert [g["power_limit_w"] for g in shown["gpus"]] == [310.0, 310.0]


def test_an_absurd_fan_count_in_the_static_cache_is_read_again_from_the_driver(
    fake_nvml: object, tmp_path: Path
) -> None:
    import marshal

    from gpustation.telemetry.nvml.backend import NvmlBackend

    path = tmp_path / "static-cache"
    first = NvmlBackend(nvml=fake_nvml, one_shot=True, static_cache=str(path))
    first.read_gpus([0, 1], slow=False)
    first.close()
    doc = marshal.loads(path.read_bytes())
    for entry in doc["gpus"].values():
        entry["num_fans"] = 10**7  # a damaged file
    path.write_bytes(marshal.dumps(doc))
    backend = NvmlBackend(nvml=fake_nvml, one_shot=True, static_cache=str(path))
    try:
        samples = backend.read_gpus([0, 1], slow=False)
    finally:
        backend.close()
    assert [len(s.fans_pct) for s in samples] == [
        backend.control.fan_count(0),
        backend.control.fan_count(1),
    ]
    assert max(backend.control.fan_count(0), backend.control.fan_count(1)) <= 32


def test_a_card_kept_from_last_time_is_said_on_stderr_and_an_explicit_flag_wins(
    gpustation_dirs: dict[str, Path],
) -> None:
    assert gs("snapshot", "--simulate", "1", "--sim-card", "h200").returncode == 0
    kept = gs("snapshot", "--json", "--simulate", "2")
    assert kept.returncode == 0, kept.stderr
    assert "2 simulated H200, as last time; --sim-card to change" in kept.stderr
    assert all("H200" in g["name"] for g in json.loads(kept.stdout)["gpus"])
    asked = gs("snapshot", "--json", "--simulate", "2", "--sim-card", "rtx4090")
    assert "as last time" not in asked.stderr
    assert all("4090" in g["name"] for g in json.loads(asked.stdout)["gpus"])
    # the built-in defaults need no word
    assert "as last time" not in gs("snapshot", "--simulate").stderr


def test_help_names_the_default_a_command_would_open(gpustation_dirs: dict[str, Path]) -> None:
    def help_text() -> str:
        return " ".join(gs("power", "set", "--help").stdout.split())

    assert "(default rtx4090)" in help_text() and "(default N: 2)" in help_text()
    assert gs("snapshot", "--simulate", "3", "--sim-card", "h200").returncode == 0
    assert "(default h200, as last simulated)" in help_text()
    assert "(default N: 3, as last simulated)" in help_text()
    env = child_env(GPUSTATION_SIM_CARD="rtx4090")
    shown = subprocess.run(
        gpustation_cmd("snapshot", "--help"), env=env, capture_output=True, text=True, timeout=60
    )
    assert "(default rtx4090, from GPUSTATION_SIM_CARD)" in " ".join(shown.stdout.split())


def test_the_cards_help_offers_are_the_simulated_cards() -> None:
    from gpustation.telemetry.sim_cards import CARDS, card_label
    from gpustation.telemetry.sim_last import CARD_KEYS

    assert tuple(CARDS) == CARD_KEYS
    assert [card_label(c) for c in CARD_KEYS] == ["RTX 4090", "H200"]
