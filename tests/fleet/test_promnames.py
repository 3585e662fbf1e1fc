"""The series table: every field with a Prometheus name is written by the exporter and read
back by the fleet, at its scale (no Prometheus server: the exporter's families become
instant-query results directly)."""

from __future__ import annotations

from typing import Any

import pytest

from gpustation.fleet import promseries
from gpustation.fleet.promseries import snapshots_from_series
from gpustation.serve.exporter import snapshot_metrics
from gpustation.telemetry import promnames
from gpustation.telemetry.model import (
    GpuSample,
    MigInfo,
    MigInstance,
    RemappedRows,
    Snapshot,
    XidEvent,
    specs,
)
from gpustation.telemetry.promnames import (
    GPU_SERIES,
    SERIES,
    UNREAD_AGGREGATE,
    GpuSeries,
    Series,
    field_series,
)
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend
from tests.conftest import known

FROZEN = 1e6
INSTANCE = "h200-box:9400"


def as_results(snap: Snapshot, instance: str = INSTANCE) -> list[dict[str, Any]]:
    """The exporter's families as ``/api/v1/query`` would give them back from Prometheus."""
    out: list[dict[str, Any]] = []
    for family in snapshot_metrics(snap):
        for sample in family.samples:
            labels = {"__name__": sample.name, **sample.labels, "instance": instance, "job": "gpu"}
            out.append({"metric": labels, "value": [FROZEN, repr(float(sample.value))]})
    return out


def served(snap: Snapshot) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every series the exporter writes for ``snap``: (name, labels but the card's) -> value."""
    card = {"UUID", "pci_bus_id", "modelName", "hostname"}
    out = {}
    for family in snapshot_metrics(snap):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in card))
            out[(sample.name, labels)] = sample.value
    return out


def busy_h200() -> Snapshot:
    """Two simulated H200s, one busy with GPM read and an XID; MIG on, rows remapped."""
    backend = SimBackend(count=2, card="h200", state_path=None, clock=lambda: FROZEN)
    backend.read_gpm = True
    backend.poke(0, load=0.8)
    backend.poke(0, xid=79)
    backend.poke(1, load=0.0)
    snap = Sampler(backend, clock=lambda: FROZEN).sample()
    gpu = snap.gpus[0]
    gpu.remapped_rows = RemappedRows(correctable=3, uncorrectable=1, pending=True, failure=False)
    gpu.mig = MigInfo(enabled=True, instances=[MigInstance(index=0), MigInstance(index=1)])
    gpu.unowned_memory_mib = 612.0
    return snap


def test_every_field_with_a_prometheus_name_is_read_back() -> None:
    for series in GPU_SERIES:
        if series.write is None:
            assert series.unread, f"{series.name} is not read back and does not say why"
        else:
            assert series.name in promseries.GPU_SERIES, series.name
    for other in SERIES:
        if not other.unread:
            assert other.name in promseries.ALL_SERIES, other.name
    # a field carried only by series not read back (a count) is said to be so
    carried = {f for s in GPU_SERIES if s.write is not None for f in s.fields}
    carried |= {"fans_pct", "lost"}  # the per-fan and lost series
    for series in GPU_SERIES:
        for path in series.fields:
            assert path in carried or series.unread == UNREAD_AGGREGATE, (series.name, path)


def test_every_exported_series_reads_back_to_the_value_served() -> None:
    snap = busy_h200()
    back = snapshots_from_series(as_results(snap))[INSTANCE]
    want, got = served(snap), served(back)
    every: tuple[GpuSeries | Series, ...] = (*GPU_SERIES, *SERIES)
    counts = {s.name for s in every if s.unread == UNREAD_AGGREGATE}
    compared = {k: v for k, v in want.items() if k[0] not in counts}
    # the series this sample has: the twelve once left at n/a among them
    names = {name for name, _ in compared}
    for name in (
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    ):
        assert name in names
    assert {k: pytest.approx(v, rel=1e-12) for k, v in compared.items()} == {
        k: got.get(k) for k in compared
    }


def test_read_back_fields_equal_the_served_ones() -> None:
    snap = busy_h200()
    back = snapshots_from_series(as_results(snap))[INSTANCE]
    for mine, theirs in zip(back.gpus, snap.gpus, strict=True):
        assert mine.encoder_utilization_pct == theirs.encoder_utilization_pct
        assert mine.sm_active_pct == pytest.approx(theirs.sm_active_pct)
        assert mine.energy_j == pytest.approx(theirs.energy_j)
        assert mine.pcie.tx_kib_s == theirs.pcie.tx_kib_s
        assert mine.remapped_rows == theirs.remapped_rows
        assert mine.pstate == theirs.pstate and isinstance(mine.pstate, int)
        # the links' sum, not links Prometheus does not have
        assert mine.nvlink is None and mine.nvlink_sum_mb_s is not None
        total = sum(known(x.tx_kib_s) + known(x.rx_kib_s) for x in theirs.nvlink or () if x.active)
        assert mine.nvlink_sum_mb_s == pytest.approx(total * 1024 / 1e6)
        assert mine.mig is not None and mine.mig.enabled == (theirs.mig and theirs.mig.enabled)
    xids = known(back.gpus[0].xid_events)
    assert xids == [XidEvent(time=FROZEN, code=79, meaning=xids[0].meaning)]
    assert xids[0].meaning  # XID 79 is known: the bus
    assert back.gpus[1].xid_events == []  # watched, none seen


def test_a_series_is_static_when_its_field_is() -> None:
    static = set(promseries.STATIC_SERIES)
    assert "DCGM_FI_DEV_FB_TOTAL" in static and "gpustation_pcie_link_width_max" in static
    assert "DCGM_FI_DEV_FB_USED" not in static and "DCGM_FI_DEV_ENC_UTIL" in promseries.FAST_SERIES
    for series in GPU_SERIES:
        if series.write is not None:
            assert (series.name in static) == series.static


def test_a_series_naming_no_declared_field_is_refused() -> None:
    with pytest.raises(ValueError, match=r"pcie\.speed"):
        field_series("gpustation_pcie_speed", "pcie.speed")
    with pytest.raises(ValueError, match="index"):
        field_series("gpustation_index", "index")  # the key, not a declared field


def test_the_fleet_reads_only_declared_series() -> None:
    declared = {s.name for s in GPU_SERIES} | {s.name for s in SERIES}
    assert set(promseries.ALL_SERIES) - declared == set()
    assert set(promseries.PRESENCE) - declared == set()


def test_each_series_name_is_declared_once() -> None:
    names = [s.name for s in GPU_SERIES] + [s.name for s in SERIES]
    assert len(names) == len(set(names))
    assert all(not s.exported or s.help for s in GPU_SERIES)
    assert set(specs(GpuSample)) >= {s.fields[0] for s in GPU_SERIES if "." not in s.fields[0]}
    assert promnames.GPU_LABELS[0] == "gpu"
