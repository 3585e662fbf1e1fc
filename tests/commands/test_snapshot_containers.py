"""`gpustation snapshot` names each GPU process's container and sums them per container."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpustation.telemetry.sim import SimBackend
from tests.commands.test_snapshot import run
from tests.telemetry.cgroups import process_in_cgroup

DOCKER_ID = "ab" * 32


@pytest.fixture
def no_docker(tmp_path: Path) -> str:
    """The runtime socket the children ask (DOCKER_HOST): none there (short ids)."""
    return f"unix://{tmp_path / 'no-docker.sock'}"


def test_processes_are_named_and_summed_per_container(no_docker: str) -> None:
    with (
        process_in_cgroup(f"system.slice/docker-{DOCKER_ID}.scope") as first,
        process_in_cgroup("system.slice/slurmstepd.scope/job_42/step_0") as second,
        process_in_cgroup("system.slice/slurmstepd.scope/job_42/step_1") as third,
    ):
        sim = SimBackend.open(count=1)
        sim.poke(
            0,
            load=0.0,
            guests=[[first, 60.0, 4096.0], [second, 20.0, 1024.0], [third, 10.0, 1024.0]],
        )
        doc = json.loads(run("snapshot", "--simulate", "1", "--json", DOCKER_HOST=no_docker).stdout)
        table = run("snapshot", "--simulate", "1", DOCKER_HOST=no_docker)
        grouped = run("snapshot", "--simulate", "1", "--group", "container", DOCKER_HOST=no_docker)
    gpu = doc["gpus"][0]
    by_pid = {p["pid"]: p for p in gpu["processes"]}
    assert by_pid[first]["container"] == f"docker/{DOCKER_ID[:12]}"
    assert by_pid[second]["container"] == by_pid[third]["container"] == "slurm/job_42"
    # each process's part of the GPU's power, which they add up to
    power = [by_pid[pid]["power_w"] for pid in (first, second, third)]
    assert power[0] > power[1] > power[2] > 0
    assert sum(power) == pytest.approx(gpu["power_w"], abs=0.2)
    line = next(ln for ln in table.stdout.splitlines() if f" {first} " in f" {ln} ")
    assert f"docker/{DOCKER_ID[:12]}" in line and f"{power[0]:.0f} W" in line
    assert grouped.returncode == 0, grouped.stderr
    rows = {ln.split()[1]: ln.split() for ln in grouped.stdout.splitlines()[-2:]}
    assert rows["slurm/job_42"][2:4] == ["2", "2.0G"] and rows["slurm/job_42"][5] == "W"
    assert float(rows["slurm/job_42"][4]) == pytest.approx(power[1] + power[2], abs=1)
    assert rows[f"docker/{DOCKER_ID[:12]}"][2] == "1"


def test_group_is_a_table_s_option() -> None:
    result = run("snapshot", "--simulate", "1", "--group", "container", "--json")
    assert result.returncode == 2 and "--group goes with the table" in result.stderr
    result = run("snapshot", "--simulate", "1", "--group", "pod")
    assert result.returncode == 2 and "invalid choice" in result.stderr
