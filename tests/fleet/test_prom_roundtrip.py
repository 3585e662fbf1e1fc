"""Every series ``gpustation serve`` writes comes back through a real Prometheus into the
fleet's Snapshot at the value served.

Two exporters of simulated machines (two H200s with GPM, NVLink, remapped rows and an
XID; two RTX 4090s with fans) sample once and keep serving that sample, so what they
serve stands still while a real Prometheus (``/usr/bin/prometheus``, loopback) scrapes
it and the fleet reads it. The fleet's Snapshot, rendered by the exporter's own code,
must give back every series served, value for value: a series the fleet does not read
is missing, one read at the wrong scale differs.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pytest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gpustation.fleet.prometheus import PrometheusClient, PrometheusFleet
from gpustation.fleet.ssh import UP
from gpustation.serve.exporter import snapshot_metrics
from gpustation.telemetry.model import Snapshot
from gpustation.telemetry.promnames import (
    GPU_SERIES,
    SERIES,
    THROTTLE_REASON,
    UNREAD_AGGREGATE,
)
from gpustation.telemetry.sim import SimBackend
from tests.fleet.promserver import (
    LoopbackPrometheus,
    http_get,
    start_exporter,
    stop_process,
)
from tests.tools import tool

pytestmark = pytest.mark.timeout(240)

Key = tuple[str, tuple[tuple[str, str], ...]]
#: the labels that name a card rather than tell its series apart
CARD_LABELS = {"UUID", "pci_bus_id", "modelName", "hostname", "Hostname"}
#: every series the fleet reads back (or, the throttle reasons, re-derives from what it reads)
READ_BACK = (
    {s.name for s in GPU_SERIES if s.exported and s.unread != UNREAD_AGGREGATE}
    | {s.name for s in SERIES if s.exported and not s.unread}
    | {THROTTLE_REASON.name}
)


def by_key(families: Iterable[Metric]) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for family in families:
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in CARD_LABELS))
            out[(sample.name, labels)] = float(sample.value)
    return out


@dataclass
class Machine:
    card: str
    port: int
    served: dict[Key, float]

    @property
    def instance(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class Lab:
    url: str
    machines: list[Machine]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    binary = tool("prometheus", "Debian: prometheus")
    work = tmp_path_factory.mktemp("roundtrip")
    procs = []
    prom = LoopbackPrometheus(binary, work)
    try:
        out = []
        for card in ("h200", "rtx4090"):
            state = work / card
            state.mkdir()
            # the machine's state before its exporter opens it: a busy card with an XID
            sim = SimBackend(2, card, 0, state_path=state / f"sim-{card}-2.json")
            sim.poke(0, load=0.8)
            sim.poke(0, xid=79)
            sim.poke(1, load=0.0)
            proc, port = start_exporter(state, count=2, interval=3600, card=card)
            procs.append(proc)
            text = http_get(f"http://127.0.0.1:{port}/metrics").decode()
            out.append(Machine(card, port, by_key(list(text_string_to_metric_families(text)))))
        prom.start({"gpu": [m.instance for m in out]})
        prom.wait_targets(len(out))
        yield Lab(prom.url, out)
    finally:
        prom.stop()
        for proc in procs:
            stop_process(proc)


def _read_back(fleet: PrometheusFleet, machine: Machine) -> Snapshot | None:
    for st in fleet.states():
        if machine.instance in st.name and st.state == UP:
            return st.snapshot
    return None


def test_every_served_series_is_declared_and_every_read_one_served(lab: Lab) -> None:
    declared = {s.name for s in GPU_SERIES if s.exported} | {s.name for s in SERIES if s.exported}
    served = {name for m in lab.machines for name, _ in m.served}
    assert served - declared == set()
    # the simulated machines exercise every series the fleet reads
    assert READ_BACK - served == set()


def test_the_fleet_reads_back_what_each_exporter_served(lab: Lab) -> None:
    with PrometheusFleet(PrometheusClient(lab.url), interval=0.5) as fleet:
        for machine in lab.machines:
            want = {k: v for k, v in machine.served.items() if k[0] in READ_BACK}
            got: dict[Key, float] = {}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                snap = _read_back(fleet, machine)
                got = by_key(snapshot_metrics(snap)) if snap is not None else {}
                if all(got.get(k) == pytest.approx(v, rel=1e-9) for k, v in want.items()):
                    break
                time.sleep(0.2)  # polling the fleet's next pass, bounded by the deadline
            missing = sorted(k for k in want if k not in got)
            assert missing == [], f"{machine.card}: not read back"
            wrong = {k: (want[k], got[k]) for k in want if got[k] != pytest.approx(want[k])}
            assert wrong == {}, f"{machine.card}: read back at another value"
            # the series that once came back n/a are among those checked
            names = {name for name, _ in want}
            if machine.card == "h200":
                assert {
                    "DCGM_FI_DEV_ENC_UTIL",
                    "DCGM_FI_PROF_SM_ACTIVE",
                    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                    "DCGM_FI_PROF_DRAM_ACTIVE",
                    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                    "DCGM_FI_DEV_ROW_REMAP_PENDING",
                    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                } <= names
                assert want[("DCGM_FI_DEV_XID_ERRORS", (("gpu", "0"),))] == 79.0
            else:
                assert "gpustation_fan_speed_percent" in names
