"""Each process's share of a shared GPU's power and energy, from its SM share."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpustation.runs.gputrace import compact_sample, summarize_telemetry
from gpustation.telemetry.model import ProcessInfo, Snapshot
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.shares import IDLE, UNATTRIBUTED, EnergySplit, gpu_shares
from gpustation.telemetry.sim import SimBackend
from tests.conftest import known


@pytest.fixture
def two_children() -> Iterator[tuple[int, int]]:
    """Two real processes of this host, to be listed on a simulated card."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
        )
        for _ in range(2)
    ]
    try:
        yield procs[0].pid, procs[1].pid
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_shares_follow_the_sm_shares_and_split_the_idle_time_evenly() -> None:
    shares = gpu_shares([ProcessInfo(pid=1, sm_pct=60.0), ProcessInfo(pid=2, sm_pct=20.0)])
    assert shares.processes == pytest.approx({1: 0.7, 2: 0.3})
    assert shares.idle == 0 and shares.unattributed == 0
    # the driver's sampling can over-count: scaled to a whole, nothing idle
    over = gpu_shares([ProcessInfo(pid=1, sm_pct=90.0), ProcessInfo(pid=2, sm_pct=30.0)])
    assert over.processes == pytest.approx({1: 0.75, 2: 0.25})
    # alone: the whole GPU, whatever its SM share or none
    assert gpu_shares([ProcessInfo(pid=5, sm_pct=10.0)]).processes == {5: 1.0}
    assert gpu_shares([ProcessInfo(pid=5)]).processes == {5: 1.0}
    assert gpu_shares([]).idle == 1.0
    # a process the driver gives no share for: its part and the idle time are no one's
    unknown = gpu_shares([ProcessInfo(pid=1, sm_pct=40.0), ProcessInfo(pid=2)])
    assert unknown.processes == pytest.approx({1: 0.4}) and unknown.unattributed == pytest.approx(
        0.6
    )


def _samples(backend: SimBackend, clock: list[float], count: int) -> Iterator[Snapshot]:
    sampler = Sampler(backend, with_host=False, with_topology=False)
    for _ in range(count):
        clock[0] += 1.0
        yield sampler.sample(slow=True)


def test_the_parts_add_up_to_the_counter_and_follow_the_sm_shares(
    two_children: tuple[int, int],
) -> None:
    first, second = two_children
    clock = [1_000_000.0]
    backend = SimBackend(count=1, card="h200", clock=lambda: clock[0])
    backend.poke(0, load=0.3, guests=[[first, 45.0, 1000.0], [second, 15.0, 500.0]])
    split = EnergySplit()
    snaps = list(_samples(backend, clock, 30))
    for snap in snaps:
        split.add(snap.gpus)
    gpu = snaps[-1].gpus[0]
    # the simulator's own job and the two real processes, named from /proc
    assert [p.pid for p in gpu.processes][1:] == [first, second]
    assert gpu.processes[1].command is not None and "sys.stdin.read" in gpu.processes[1].command
    counter = known(snaps[-1].gpus[0].energy_j) - known(snaps[0].gpus[0].energy_j)
    assert counter > 0 and split.counted == pytest.approx(counter)
    assert sum(split.parts.values()) == pytest.approx(counter, rel=0.01)
    # the SMs' idle time is split evenly between the three
    idle = (100 - 45 - 15 - known(gpu.processes[0].sm_pct)) / 3
    assert idle > 0
    assert split.parts[first] / split.parts[second] == pytest.approx((45 + idle) / (15 + idle))
    assert UNATTRIBUTED not in split.parts and IDLE not in split.parts
    # each process's power adds up to the GPU's
    assert sum(known(p.power_w) for p in gpu.processes) == pytest.approx(
        known(gpu.power_w), abs=0.2
    )
    assert known(gpu.processes[1].power_w) > known(gpu.processes[2].power_w) > 0


def test_two_runs_on_one_gpu_get_their_parts_estimated_and_add_up_to_the_counter(
    two_children: tuple[int, int], tmp_path: Path
) -> None:
    first, second = two_children
    clock = [2_000_000.0]
    backend = SimBackend(count=1, card="h200", clock=lambda: clock[0])
    backend.poke(0, load=0.7, guests=[[first, 50.0, 1000.0], [second, 20.0, 500.0]])
    split = EnergySplit()
    files = {first: tmp_path / "a.jsonl", second: tmp_path / "b.jsonl"}
    for n, snap in enumerate(_samples(backend, clock, 41)):
        split.add(snap.gpus)
        for pid, path in files.items():
            line = compact_sample(snap, float(n), {pid})
            if n % 5:
                # the counter is a slow field: read every fifth sample, as a run does
                line["gpus"][0].pop("energy_j")
            with path.open("a") as fh:
                fh.write(json.dumps(line) + "\n")
    runs = {pid: summarize_telemetry(path) for pid, path in files.items()}
    assert all(r.estimated and r.energy_j is not None for r in runs.values())
    # the parts of the runs and of the simulator's own job add up to the counter
    others = sum(v for k, v in split.parts.items() if k not in files)
    total = runs[first].energy_j + runs[second].energy_j + others  # type: ignore[operator]
    assert total == pytest.approx(split.counted, rel=0.01)
    assert runs[first].energy_j == pytest.approx(split.parts[first], rel=0.01)
    assert runs[first].energy_j > runs[second].energy_j  # type: ignore[operator]


def test_a_run_alone_on_its_gpu_keeps_the_whole_counter(tmp_path: Path) -> None:
    clock = [3_000_000.0]
    backend = SimBackend(count=1, card="h200", clock=lambda: clock[0])
    with subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    ) as child:
        backend.poke(0, load=0.0, guests=[[child.pid, 30.0, 800.0]])
        path = tmp_path / "telemetry.jsonl"
        snaps = list(_samples(backend, clock, 10))
        child.kill()
    for n, snap in enumerate(snaps):
        with path.open("a") as fh:
            fh.write(json.dumps(compact_sample(snap, float(n), {child.pid})) + "\n")
    summary = summarize_telemetry(path)
    counter = known(snaps[-1].gpus[0].energy_j) - known(snaps[0].gpus[0].energy_j)
    assert summary.energy_j == pytest.approx(counter) and not summary.estimated


def _trace(path: Path, shares: list[float | None], power: float = 100.0) -> Path:
    """A run's telemetry: a sample a second, the counter rising by ``power`` J each."""
    with path.open("w") as fh:
        for n, share in enumerate(shares):
            gpu = {"index": 0, "power_w": power, "energy_j": 1000.0 + power * n}
            if share is not None:
                gpu["run_share"] = share
            fh.write(json.dumps({"t": float(n), "gpus": [gpu]}) + "\n")
    return path


def test_a_run_not_yet_listed_beside_another_gets_none_of_that_time(tmp_path: Path) -> None:
    # starting up (its PIDs not on the GPU yet) while another run works: 0 of those seconds
    summary = summarize_telemetry(_trace(tmp_path / "a.jsonl", [0.0, 0.0, 0.0, 0.5, 0.5]))
    assert summary.energy_j == pytest.approx(100.0)
    assert summary.estimated
    # never seen on the GPU (another PID namespace): its part is not known, not 0
    never = summarize_telemetry(_trace(tmp_path / "b.jsonl", [0.0, 0.0, 0.0]))
    assert never.energy_j == pytest.approx(200.0) and not never.split and not never.estimated


def test_a_run_s_energy_shows_estimated_and_is_kept(
    tmp_path: Path, gpustation_dirs: dict[str, Path]
) -> None:
    from gpustation.runs.compare import energy_text
    from gpustation.runs.store.index import RunStore, apply_telemetry
    from gpustation.runs.summary import RunSummary

    record = RunSummary(id="r1", status="succeeded")
    apply_telemetry(record, summarize_telemetry(_trace(tmp_path / "t.jsonl", [0.5, 0.5])), tmp_path)
    assert record.energy_estimated and record.energy_j == pytest.approx(50.0)
    assert energy_text(record).endswith("(estimated)")
    store = RunStore()
    store.upsert(record)
    kept = store.get("r1")
    assert kept is not None and kept.energy_estimated is True
    alone = RunSummary(id="r2", status="succeeded")
    apply_telemetry(alone, summarize_telemetry(_trace(tmp_path / "u.jsonl", [1.0, 1.0])), tmp_path)
    assert not alone.energy_estimated and "(estimated)" not in energy_text(alone)


def test_idle_and_unattributed_time_make_up_the_rest_of_the_counter() -> None:
    from gpustation.telemetry.model import GpuSample

    def sample(energy: float, procs: list[ProcessInfo]) -> GpuSample:
        return GpuSample(index=0, power_w=200.0, energy_j=energy, processes=procs)

    split = EnergySplit()
    split.add([sample(0.0, [])])
    split.add([sample(1000.0, [])])  # no process: idle
    # a process the driver gives no share for, beside one it does
    split.add([sample(3000.0, [ProcessInfo(pid=1, sm_pct=30.0), ProcessInfo(pid=2)])])
    split.add([sample(3500.0, [ProcessInfo(pid=1, sm_pct=30.0), ProcessInfo(pid=2, sm_pct=50.0)])])
    assert split.parts[IDLE] == pytest.approx(1000.0)
    assert split.parts[UNATTRIBUTED] == pytest.approx(0.7 * 2000.0)
    assert split.parts[1] == pytest.approx(0.3 * 2000.0 + 0.4 * 500.0)
    assert split.parts[2] == pytest.approx(0.6 * 500.0)
    assert sum(split.parts.values()) == pytest.approx(split.counted, rel=0.01)
    assert split.counted == 3500.0
