"""The snapshot table renders the real H200 document and missing values."""

from __future__ import annotations

import json
from pathlib import Path

from gpustation.telemetry.model import GpuSample, Snapshot
from gpustation.telemetry.table import render_snapshot

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "h200-snapshot.json"


def _h200() -> Snapshot:
    return Snapshot.from_dict(json.loads(FIXTURE.read_text()))


def test_real_h200_document_renders_its_values() -> None:
    snap = _h200()
    g = snap.gpus[0]
    text = render_snapshot(snap)
    row = next(line for line in text.splitlines() if line.startswith("0 NVIDIA H200"))
    assert "no fans" in row
    assert f"/{g.power_limit_w:.0f}" in row and g.power_limit_w == 700
    assert "Gen5 x16/Gen5 x16" in row
    assert f"{g.temperature_c:.0f}/{g.temperature_slowdown_c:.0f}" in row
    assert "SIMULATED" not in text
    assert f"driver {snap.driver_version}" in text
    assert "\x1b[" not in text  # no colour unless asked for


def test_missing_values_read_na_and_a_lost_gpu_says_so() -> None:
    snap = _h200()
    snap.gpus[0].temperature_c = None
    snap.gpus[0].throttle_reasons = None
    snap.gpus.append(GpuSample(index=1, name="NVIDIA H200", lost=True))
    lines = render_snapshot(snap).splitlines()
    row0 = next(line for line in lines if line.startswith("0 NVIDIA H200"))
    assert row0.split()[3].startswith("n/a/")  # temperature column
    assert row0.rstrip().endswith("n/a")  # throttle column
    row1 = next(line for line in lines if line.startswith("1 NVIDIA H200"))
    assert "GPU LOST" in row1


def test_simulated_snapshots_are_labelled_and_colour_is_optional() -> None:
    snap = _h200()
    snap.simulated = True
    plain = render_snapshot(snap)
    assert plain.splitlines()[0].startswith(" SIMULATED ")
    coloured = render_snapshot(snap, color=True)
    assert "\x1b[" in coloured and "SIMULATED" in coloured


def test_processes_show_their_sm_share_and_health_gets_a_line_each() -> None:
    from gpustation.telemetry.model import (
        MigInfo,
        MigInstance,
        ProcessInfo,
        RemappedRows,
        XidEvent,
    )

    snap = _h200()
    g = snap.gpus[0]
    g.memory_used_mib = 30_000.0
    g.minor_number = 0
    g.processes = [ProcessInfo(pid=441, gpu_memory_mib=20_000.0, command="python mm.py", sm_pct=71)]
    g.unowned_memory_mib = 10_000.0
    g.device_holders = [ProcessInfo(pid=777, command="python \x1b[31mzombie.py", kind="holder")]
    g.xid_events = [XidEvent(time=snap.time, code=79, meaning="GPU has fallen off the bus")]
    g.remapped_rows = RemappedRows(0, 1, True, False)
    g.mig = MigInfo(
        enabled=True,
        pending=True,
        instances=[
            MigInstance(
                index=0,
                gpu_instance_id=1,
                profile="3g.71gb",
                memory_used_mib=1024,
                memory_total_mib=72704,
                processes=[ProcessInfo(pid=5)],
            )
        ],
    )
    lines = render_snapshot(snap).splitlines()
    header = next(line for line in lines if line.startswith("GPU") and "PID" in line)
    assert header.split() == [
        *("GPU", "PID", "User", "VRAM", "SM", "%", "Power", "Container", "Command")
    ]
    proc = next(line for line in lines if " 441 " in line)
    assert proc.split()[4] == "71"
    assert any(
        line.startswith("GPU 0: XID 79 at ") and "fallen off the bus" in line for line in lines
    )
    assert any("row remap is pending" in line for line in lines)
    assert any(
        line.startswith("GPU 0 MIG 0 3g.71gb (GI 1)") and "1 process" in line for line in lines
    )
    held = next(line for line in lines if "held by no listed process" in line)
    assert "/dev/nvidia0 is also held open by 777 (python" in held
    assert "\x1b" not in held  # another user's argv is made safe


def test_no_health_lines_for_a_healthy_gpu() -> None:
    snap = _h200()
    snap.gpus[0].unowned_memory_mib = 12.0  # the driver's bookkeeping
    snap.gpus[0].device_holders = []
    text = render_snapshot(snap)
    assert "held by no listed process" not in text and "XID" not in text


def test_unowned_vram_is_named_from_a_gib_or_a_hundredth_of_a_big_card() -> None:
    from gpustation.telemetry.health import unowned_worth_noting

    def gpu(unowned: float | None, total: float) -> GpuSample:
        return GpuSample(index=0, memory_total_mib=total, unowned_memory_mib=unowned)

    # the driver's reservation where NVML's v1 memory info counts it as used
    assert not unowned_worth_noting(gpu(581, 143771))
    assert not unowned_worth_noting(gpu(372, 24564))
    assert not unowned_worth_noting(gpu(None, 24564))  # a process's share unknown
    assert unowned_worth_noting(gpu(1024, 24564))
    assert not unowned_worth_noting(gpu(1200, 143771))  # under 1 % of 140 GiB
    assert unowned_worth_noting(gpu(3277, 143771))

    snap = _h200()
    snap.gpus[0].unowned_memory_mib = 581.0
    snap.gpus[0].device_holders = []
    assert "held by no listed process" not in render_snapshot(snap)
    snap.gpus[0].unowned_memory_mib = 3277.0
    assert "GPU 0: 3.2G of VRAM held by no listed process" in render_snapshot(snap)
