"""The exporter's per-container series: power and VRAM summed per container, never per PID."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpustation.serve.exporter import Exporter
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend
from tests.conftest import known
from tests.telemetry.cgroups import process_in_cgroup

FROZEN = 1e6


def test_power_and_vram_are_exported_per_container(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'none.sock'}")
    backend = SimBackend(count=1, card="h200", clock=lambda: FROZEN)
    sampler = Sampler(backend, with_host=False, clock=lambda: FROZEN)
    with (
        process_in_cgroup("system.slice/slurmstepd.scope/job_9/step_0") as first,
        process_in_cgroup("system.slice/slurmstepd.scope/job_9/step_1") as second,
        process_in_cgroup("system.slice/vllm.service") as third,
    ):
        backend.poke(
            0,
            load=0.5,
            guests=[[first, 30.0, 2048.0], [second, 10.0, 1024.0], [third, 20.0, 512.0]],
        )
        exporter = Exporter(sampler.sample, with_extras=False)
        exporter.sample_once()
        text = generate_latest(exporter.registry).decode()
    series: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("gpustation_container_"):
                assert "pid" not in s.labels
                series.setdefault(s.name, {})[s.labels["container"]] = s.value
    snap = exporter.latest().snapshot
    assert snap is not None
    procs = snap.gpus[0].processes
    watts = {p.pid: p.power_w for p in procs}
    assert series["gpustation_container_processes"] == {
        "-": 1.0,  # the simulator's own job
        "slurm/job_9": 2.0,
        "systemd/vllm.service": 1.0,
    }
    assert series["gpustation_container_memory_used_mib"]["slurm/job_9"] == 3072.0
    assert series["gpustation_container_power_watts"]["slurm/job_9"] == pytest.approx(
        known(watts[first]) + known(watts[second])
    )
    assert series["gpustation_container_power_watts"]["systemd/vllm.service"] == watts[third]
    assert sum(series["gpustation_container_power_watts"].values()) == pytest.approx(
        known(snap.gpus[0].power_w), abs=0.2
    )
