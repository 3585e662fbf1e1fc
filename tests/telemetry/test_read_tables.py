"""Each backend's read table names every declared field, and only those."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from gpustation.telemetry import sim_reads
from gpustation.telemetry.model import GPM, IDENTITY, field_keys
from gpustation.telemetry.nvml import reads as nvml_reads
from gpustation.telemetry.sim import SimBackend

TABLES: dict[str, Mapping[str, object]] = {"nvml": nvml_reads.READS, "sim": sim_reads.READS}


@pytest.mark.parametrize("backend", sorted(TABLES))
def test_a_read_table_covers_every_declared_field(backend: str) -> None:
    table = TABLES[backend]
    declared = list(field_keys())
    missing = [k for k in declared if k not in table]
    unknown = [k for k in table if k not in field_keys()]
    assert not missing, f"{backend}: no read (nor an explicit None) for {missing}"
    assert not unknown, f"{backend}: reads for fields the model does not declare: {unknown}"
    assert list(table) == declared  # in the model's order, so the two read side by side


def test_field_keys_name_the_records_fields_not_the_records() -> None:
    keys = field_keys()
    assert "pcie.tx_kib_s" in keys and "remapped_rows.pending" in keys
    assert "pcie" not in keys and "remapped_rows" not in keys
    assert keys["uuid"].cost == IDENTITY and keys["sm_active_pct"].cost == GPM


def test_every_nvml_converter_named_exists() -> None:
    named = {r.convert for r in nvml_reads.READS.values() if r is not None}
    available = nvml_reads.converters(lambda name: None)
    assert named <= set(available), named - set(available)


def test_the_simulator_fills_what_its_table_reads(gpustation_dirs: dict[str, Path]) -> None:
    (sample,) = SimBackend(count=1, card="h200").read_gpus([0], slow=True)
    assert sample.uuid is not None and sample.uuid.startswith("GPU-SIM-")
    assert sample.pcie.max_gen == 5 and sample.pcie.width == 16
    assert sample.remapped_rows.correctable == 0  # an ECC card: its table reads 0
    (rtx,) = SimBackend(count=1, card="rtx4090").read_gpus([0], slow=True)
    assert rtx.remapped_rows.correctable is None
