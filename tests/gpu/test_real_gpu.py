"""Read-only checks against a real GPU through NVML."""

from __future__ import annotations

import json
import subprocess

from gpustation.telemetry.model import SCHEMA, Snapshot
from gpustation.telemetry.nvml import NvmlBackend
from gpustation.telemetry.sampler import Sampler
from tests.conftest import child_env, gpustation_cmd


def test_snapshot_json_reads_every_gpu() -> None:
    result = subprocess.run(
        gpustation_cmd("snapshot", "--json"),
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == SCHEMA and doc["simulated"] is False
    snap = Snapshot.from_dict(doc)
    assert snap.gpus and snap.driver_version
    for g in snap.gpus:
        assert not g.lost
        assert g.name and g.uuid and g.pci_bus_id
        assert g.temperature_c is not None and 0 < g.temperature_c < 120
        assert g.power_w is not None and g.power_limit_w is not None
        assert g.power_min_w is not None and g.power_max_w is not None
        assert g.power_min_w <= g.power_limit_w <= g.power_max_w
        assert g.memory_total_mib and g.memory_used_mib is not None
        assert g.clock_sm_max_mhz and g.pcie.max_gen
        assert len(g.fans_pct) == len(g.fan_control)


def test_sampler_fast_and_slow_passes_agree() -> None:
    with NvmlBackend() as backend:
        sampler = Sampler(backend)
        slow = sampler.sample(slow=True)
        fast = sampler.sample(slow=False)
    for a, b in zip(slow.gpus, fast.gpus, strict=True):
        assert a.uuid == b.uuid
        # slow fields are carried over from the slow pass, not dropped
        assert b.energy_j == a.energy_j
        assert b.pcie.tx_kib_s == a.pcie.tx_kib_s
    assert len(slow.topology.gpus) == len(slow.gpus)
