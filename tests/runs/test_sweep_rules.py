"""The rules a sweep's findings and its clean-up follow, stated exactly: which points
are on the Pareto front, which one is recommended within --within of the best, and
in which order the limits killed sweeps left go back."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpustation.runs.sweep import model as sweep
from gpustation.runs.sweep import owner as sweep_owner
from gpustation.runs.sweep.report import pareto_front, recommend
from gpustation.telemetry.sim import SimBackend


def _point(index: int, tp: float, jpu: float, status: str = "succeeded") -> sweep.Point:
    return sweep.Point(
        index,
        {"batch_size": str(index)},
        status=status,
        figures={"throughput": tp, "energy_per_unit_j": jpu},
    )


def _sweep(points: list[sweep.Point], within: float = 5.0) -> sweep.Sweep:
    return sweep.Sweep(
        id="s", preset="p", axes={}, power_limits=[], gpus=[0], within_pct=within, points=points
    )


def test_the_pareto_front_is_the_points_nothing_beats_on_both() -> None:
    points = [
        _point(0, 100.0, 1.0),  # fastest
        _point(1, 90.0, 0.8),  # less energy, slower: on the front too
        _point(2, 80.0, 0.9),  # beaten by 1 on both
        _point(3, 100.0, 1.1),  # as fast as 0, more energy: beaten
        _point(4, 50.0, 0.8),  # as frugal as 1, slower: beaten
        _point(5, 30.0, 0.5),  # the least energy of all: on the front
    ]
    assert [p.index for p in pareto_front(points)] == [5, 1, 0]  # by throughput
    twins = [_point(0, 100.0, 1.0), _point(1, 100.0, 1.0)]  # equal: neither beats the other
    assert [p.index for p in pareto_front(twins)] == [0, 1]


def test_the_recommendation_is_the_least_energy_within_the_margin_of_the_fastest() -> None:
    points = [
        _point(0, 100.0, 1.0),
        _point(1, 95.0, 0.95),  # exactly 5 % slower: still within
        _point(2, 94.9, 0.5),  # just outside
        _point(3, 99.0, 1.2),
        _point(4, 500.0, 0.1, status="failed"),  # not measured: never a candidate
    ]
    assert recommend(_sweep(points)) == {"fastest": 0, "frugal": 1, "within_pct": 5.0}
    assert recommend(_sweep(points, within=5.2))["frugal"] == 2
    assert recommend(_sweep(points, within=0.0))["frugal"] == 0
    assert recommend(_sweep([_point(0, 1.0, 1.0, status="oom")])) == {}


def _left(sweep_id: str, created_at: float, original_w: float, uuid: str | None) -> sweep.Sweep:
    gone = subprocess.Popen(["true"])
    gone.wait()
    left = sweep.Sweep(
        id=sweep_id,
        preset="p",
        axes={},
        power_limits=["70%"],
        gpus=[0],
        status="running",
        simulated=True,
        created_at=created_at,
        original_limits_w={0: original_w},
        uuids={0: uuid},
        pid=gone.pid,
    )
    left.save()
    return left


def test_leftovers_go_back_newest_first_so_the_card_ends_where_it_was_before_the_oldest(
    gpustation_dirs: dict[str, Path],
) -> None:
    sim = SimBackend.open(count=1)
    uuid = sim.read_gpus([0], slow=False)[0].uuid
    # the older sweep found 450 W and left 360 W; the newer found 360 W and left 315 W
    older = _left("20240101-000000-sweep-p", 1000.0, 450.0, uuid)
    newer = _left("20240101-000100-sweep-p", 1060.0, 360.0, uuid)
    sim.control.set_power_limit(0, 315.0)
    assert [s.id for s in sweep_owner.restore_order([older, newer])] == [newer.id, older.id]
    said: list[str] = []
    found = sweep_owner.unrestored(sim)
    assert {s.id for s in found} == {older.id, newer.id}
    sweep_owner.restore_leftovers(found, sim, said.append)
    assert sim.read_gpus([0], slow=False)[0].power_limit_w == 450.0
    assert sweep.load_sweep(older.id).restored and sweep.load_sweep(newer.id).restored
    assert sweep_owner.unrestored(sim) == []
