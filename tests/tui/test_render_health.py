"""The GPU card's deep readings: GPM on the SM line, the last XID, MIG devices."""

from __future__ import annotations

from gpustation.telemetry.model import (
    GpuSample,
    MigInfo,
    MigInstance,
    ProcessInfo,
    RemappedRows,
    XidEvent,
)
from gpustation.tui.cards import card_text


def h200(**kw: object) -> GpuSample:
    return GpuSample(index=0, name="NVIDIA H200", memory_total_mib=143771.0, **kw)  # type: ignore[arg-type]


def test_a_plain_card_keeps_its_seven_lines() -> None:
    text = card_text(h200(), 120).plain
    assert len(text.splitlines()) == 7
    assert "tensor" not in text and "XID" not in text and "MIG" not in text


def test_gpm_xid_remap_and_mig_instances_show_on_the_card() -> None:
    gpu = h200(
        sm_active_pct=92.7,
        tensor_active_pct=87.8,
        dram_active_pct=17.0,
        xid_events=[XidEvent(time=0.0, code=79, meaning="GPU has fallen off the bus")],
        remapped_rows=RemappedRows(0, 1, True, False),
        mig=MigInfo(
            enabled=True,
            pending=True,
            instances=[
                MigInstance(
                    index=0,
                    gpu_instance_id=1,
                    profile="3g.71gb",
                    memory_used_mib=20480,
                    memory_total_mib=72704,
                    processes=[ProcessInfo(pid=1)],
                ),
                MigInstance(index=1, gpu_instance_id=2, profile="3g.71gb", memory_total_mib=72704),
            ],
        ),
    )
    lines = card_text(gpu, 160).plain.splitlines()
    assert len(lines) == 9  # a line per MIG device under its GPU
    sm = next(line for line in lines if line.startswith("SM"))
    assert "active 93 %" in sm and "tensor 88 %" in sm and "dram 17 %" in sm
    throttle = next(line for line in lines if line.startswith("Throttle"))
    assert "XID 79 GPU has fallen off the bus" in throttle and "row remap pending" in throttle
    assert "MIG 0 3g.71gb" in lines[7] and "1 proc" in lines[7]
    assert "MIG 1 3g.71gb" in lines[8] and "0 procs" in lines[8]


def test_a_lost_gpu_says_lost_on_both_cards_and_shows_no_stale_figure() -> None:
    """A lost GPU's last readings are never drawn as if live, on the full card
    or on the two-line card used for small terminals and many GPUs."""
    from gpustation.tui.cards import compact_text

    gpu = h200(
        lost=True,
        temperature_c=61.0,
        power_w=412.0,
        power_limit_w=700.0,
        utilization_gpu_pct=97.0,
        memory_used_mib=80000.0,
    )
    for text in (card_text(gpu, 120).plain, compact_text(gpu, 120).plain):
        assert "LOST" in text
        for stale in ("61", "412", "97", "80000", "78.1"):
            assert stale not in text, (stale, text)
    assert len(compact_text(gpu, 120).plain.splitlines()) <= 2
    alive = compact_text(h200(temperature_c=61.0, power_w=412.0, power_limit_w=700.0), 120).plain
    assert "LOST" not in alive and "61" in alive and "412" in alive
