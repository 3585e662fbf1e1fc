"""The topology view renders what two real NVLink-connected H200s reported."""

from __future__ import annotations

import json
from pathlib import Path

from gpustation.telemetry.alerts import topology_findings
from gpustation.telemetry.model import Snapshot
from gpustation.tui.render import topology_text

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _two_h200() -> Snapshot:
    return Snapshot.from_dict(json.loads((FIXTURES / "h200x2-snapshot.json").read_text()))


def test_two_gpu_matrix_matches_nvidia_smi_topo() -> None:
    snap = _two_h200()
    lines = topology_text(snap).plain.splitlines()
    # nvidia-smi topo -m on the same machine (kept beside the snapshot)
    smi = (FIXTURES / "h200x2-nvidia-smi-topo.txt").read_text()
    assert "GPU0\t X \tNV18" in smi
    matrix = lines[lines.index("GPU interconnect") + 2 : lines.index("GPU interconnect") + 4]
    assert matrix[0].split()[:3] == ["GPU0", "X", "NV18"]
    assert matrix[1].split()[:3] == ["GPU1", "NV18", "X"]
    p2p_at = next(i for i, line in enumerate(lines) if line.startswith("Peer-to-peer"))
    assert lines[p2p_at + 2].split() == ["GPU0", "X", "RW", "NV18"]
    assert lines[p2p_at + 3].split() == ["GPU1", "RW", "NV18", "X"]


def test_nvlinked_gpus_raise_no_topology_finding() -> None:
    assert topology_findings(_two_h200()) == []
