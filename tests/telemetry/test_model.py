from __future__ import annotations

import json

import pytest

from gpustation.telemetry.model import (
    SCHEMA,
    GpuLink,
    GpuPlacement,
    GpuSample,
    HostSample,
    NamedVersion,
    PcieInfo,
    ProcessInfo,
    Snapshot,
    Topology,
    decode_throttle,
    encode_throttle,
    specs,
)


def _snapshot() -> Snapshot:
    gpu = GpuSample(
        index=0,
        uuid="GPU-1",
        name="Card",
        temperature_c=61.5,
        power_w=300.0,
        power_limit_w=450.0,
        fans_pct=[40.0, 41.0],
        fan_control=["auto", "manual"],
        throttle_reasons=["sw_power_cap"],
        pcie=PcieInfo(gen=3, width=16, max_gen=4, max_width=16, tx_kib_s=10.0),
        processes=[ProcessInfo(pid=42, gpu_memory_mib=1024.0, user="alice", name="python")],
    )
    lost = GpuSample(index=1, uuid="GPU-2", lost=True)
    return Snapshot(
        hostname="box",
        time=1234.5,
        simulated=True,
        driver_version="580.1",
        gpus=[gpu, lost],
        host=HostSample(cpu_pct=12.0, cpu_per_core_pct=[10.0, 14.0], load_avg=[0.1, 0.2, 0.3]),
        topology=Topology(
            links=[GpuLink(0, 1, "NV4", True, False, 4)],
            gpus=[GpuPlacement(0, numa_node=0, cpu_affinity="0-7", pcie_below_max=True)],
        ),
    )


def test_versions_round_trip_and_an_older_document_with_the_old_keys_reads() -> None:
    snap = _snapshot()
    snap.library_version = NamedVersion("NVML", "13.580.1")
    snap.compute_runtime_version = NamedVersion("CUDA", "13.0")
    doc = json.loads(json.dumps(snap.to_dict()))
    assert doc["library_version"] == {"name": "NVML", "version": "13.580.1"}
    assert (doc["nvml_version"], doc["cuda_driver_version"]) == ("13.580.1", "13.0")
    assert Snapshot.from_dict(doc) == snap
    # a library of another vendor is not written under NVML's deprecated key
    snap.library_version = NamedVersion("AMD SMI", "25.1")
    snap.compute_runtime_version = None
    doc = snap.to_dict()
    assert doc["nvml_version"] is None and doc["cuda_driver_version"] is None
    # what an older gpustation wrote (over ssh, in a recording) reads as the new fields
    for key in ("library_version", "compute_runtime_version"):
        del doc[key]
    doc.update(nvml_version="12.550.1", cuda_driver_version="12.4")
    old = Snapshot.from_dict(doc)
    assert old.library_version == NamedVersion("NVML", "12.550.1")
    assert str(old.compute_runtime_version) == "CUDA 12.4"


def test_round_trip_through_json_keeps_every_field() -> None:
    snap = _snapshot()
    doc = json.loads(json.dumps(snap.to_dict()))
    assert doc["schema"] == SCHEMA
    back = Snapshot.from_dict(doc)
    assert back == snap
    assert back.gpus[0].pcie.below_max
    link = back.topology.link(1, 0)
    assert link is not None and link.level == "NV4"


def test_missing_values_are_null_not_numbers() -> None:
    doc = _snapshot().to_dict()
    lost = doc["gpus"][1]
    assert lost["lost"] is True
    assert lost["temperature_c"] is None
    assert lost["power_w"] is None
    assert lost["fans_pct"] == []


def test_from_dict_refuses_other_documents() -> None:
    with pytest.raises(ValueError, match="schema"):
        Snapshot.from_dict({"schema": "something/2", "hostname": "x", "time": 0})


def test_throttle_bits_decode_to_names_and_back() -> None:
    assert decode_throttle(0x1 | 0x4 | 0x40) == ["gpu_idle", "sw_power_cap", "hw_thermal"]
    assert decode_throttle(0) == []
    assert encode_throttle(decode_throttle(0x1FF)) == 0x1FF


def test_derived_percentages_and_flags() -> None:
    g = _snapshot().gpus[0]
    assert g.power_pct == pytest.approx(300 / 450 * 100)
    assert g.power_throttled and not g.thermal_throttled
    assert GpuSample(index=0).memory_pct is None


def test_records_compare_by_value_and_keep_defaults_apart() -> None:
    a, b = GpuSample(index=0), GpuSample(index=0)
    assert a == b and a is not b
    b.fans_pct.append(30.0)  # each sample has its own lists
    assert a.fans_pct == [] and a != b
    assert a.pcie is not b.pcie and a.processes is not b.processes
    other: object = GpuPlacement(index=1)
    assert ProcessInfo(pid=1) != other  # other class: never equal
    with pytest.raises(TypeError):
        hash(a)  # mutable: unhashable, as a dataclass with eq
    with pytest.raises(AttributeError):
        a.temprature_c = 1.0  # type: ignore[attr-defined]  # slots catch typos
    assert repr(PcieInfo(gen=4)).startswith("PcieInfo(gen=4, width=None,")


def test_json_document_keeps_the_model_order() -> None:
    doc = _snapshot().to_dict()
    assert list(doc)[:3] == ["hostname", "time", "simulated"]
    assert list(doc)[-1] == "schema"
    gpu = doc["gpus"][0]
    assert list(gpu)[:5] == ["index", "uuid", "name", "pci_bus_id", "lost"]
    assert list(gpu["pcie"]) == list(specs(PcieInfo))
