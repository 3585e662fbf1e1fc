"""What a sweep's owner does about the cards, in-process on simulated GPUs: which
card a limit goes back to, what a restore says, and the runs a sweep waits for."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import NoReturn

import psutil
import pytest

from gpustation.control import lease
from gpustation.errors import GpustationError
from gpustation.runs import rundir
from gpustation.runs.rundir import RunState
from gpustation.runs.sweep import model as sweep
from gpustation.runs.sweep import owner as sweep_owner
from gpustation.telemetry.sim import SimBackend


def _gone_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _left(sweep_id: str, limits: dict[int, float], uuids: dict[int, str | None]) -> sweep.Sweep:
    s = sweep.Sweep(
        id=sweep_id,
        preset="p",
        axes={},
        power_limits=["70%"],
        gpus=sorted(limits),
        status="running",
        simulated=True,
        created_at=1.0,
        original_limits_w=limits,
        uuids=uuids,
        pid=_gone_pid(),
    )
    s.save()
    return s


def test_a_limit_goes_back_to_its_card_by_uuid_or_by_index_without_one(
    gpustation_dirs: dict[str, Path],
) -> None:
    sim = SimBackend.open(count=2)
    a, b = sim.read_gpus([0, 1], slow=False)
    s = _left(
        "s1", {0: 400.0, 1: 350.0, 3: 300.0, 7: 250.0}, {0: b.uuid, 1: None, 3: "GPU-gone", 7: None}
    )
    found, missing = sweep_owner._targets(s, [a, b])
    assert [(g.index, w) for g, w in found] == [(1, 400.0), (1, 350.0)]
    assert missing == ["GPU 3 (GPU-gone)", "GPU 7"]
    assert sweep_owner.on_this_machine(s, sim)
    s.simulated = False
    assert not sweep_owner.on_this_machine(s, sim)
    gone = _left("s2", {0: 400.0}, {0: "GPU-gone"})
    assert not sweep_owner.on_this_machine(gone, sim)


def test_a_restore_puts_each_card_back_and_names_what_is_not_here(
    gpustation_dirs: dict[str, Path],
) -> None:
    sim = SimBackend.open(count=2)
    uuid0 = sim.read_gpus([0], slow=False)[0].uuid
    sim.control.set_power_limit(0, 300.0)
    s = _left("s1", {0: 420.0, 5: 300.0}, {0: uuid0, 5: "GPU-elsewhere"})
    lease.take(lease.Lease("s1", "sweep s1", [(0, uuid0)], True, pid=_gone_pid(), start="1"))
    assert sweep_owner.leftovers_text([s], sim) == "sweep s1: GPU 0 300 W -> 420 W"
    assert sweep_owner.leftovers_text([s]) == "sweep s1: GPU 0 back to 420 W, GPU 5 back to 300 W"
    lines = sweep_owner.restore_limits(s, sim)
    assert lines == ["GPU 5 (GPU-elsewhere) is not on this machine: its limit was not put back"]
    assert sim.read_gpus([0], slow=False)[0].power_limit_w == 420.0
    assert sweep.load_sweep("s1").restored and lease.get("s1") is None
    assert sweep_owner.restore_limits(s, sim) == []  # restored already: nothing to do
    with pytest.raises(GpustationError, match="no GPU backend to restore the limits with"):
        sweep_owner.restore_limits(_left("s3", {0: 400.0}, {0: uuid0}), None)
    nowhere = _left("s4", {2: 400.0, 3: 410.0}, {2: "GPU-x", 3: None})
    with pytest.raises(GpustationError) as err:
        sweep_owner.restore_limits(nowhere, sim)
    assert str(err.value) == (
        "sweep s4 changed the limits of GPU 2 (GPU-x), GPU 3, and none of those cards is on "
        "this machine now; nothing was changed"
    )
    plain = sweep.Sweep(id="s5", preset="p", axes={}, power_limits=[], gpus=[0])
    lease.take(lease.Lease("s5", "sweep s5", [(0, uuid0)], True))
    assert sweep_owner.restore_limits(plain, None) == []  # changed nothing: its lease goes
    assert lease.get("s5") is None


def test_a_backend_that_cannot_be_read_still_says_where_limits_go_back(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = SimBackend.open(count=1)
    s = _left("s1", {0: 420.0}, {0: None})

    def broken(*_a: object, **_k: object) -> NoReturn:
        raise GpustationError("the driver is gone")

    monkeypatch.setattr(sim, "read_gpus", broken)
    assert sweep_owner.leftovers_text([s, s], sim) == (
        "sweep s1: GPU 0 back to 420 W; sweep s1: GPU 0 back to 420 W"
    )


def test_leftovers_are_restored_first_and_said(gpustation_dirs: dict[str, Path]) -> None:
    sim = SimBackend.open(count=1)
    uuid0 = sim.read_gpus([0], slow=False)[0].uuid
    sim.control.set_power_limit(0, 300.0)
    s = _left("s1", {0: 450.0, 4: 200.0}, {0: uuid0, 4: "GPU-far"})
    said: list[str] = []
    sweep_owner.restore_leftovers([], sim, said.append)
    assert said == []
    sweep_owner.restore_leftovers([s], sim, said.append)
    assert said == [
        "a killed sweep left power limits changed; restoring them first: sweep s1: GPU 0 "
        "300 W -> 450 W",
        "sweep s1: GPU 4 (GPU-far) is not on this machine: its limit was not put back",
    ]
    assert sim.read_gpus([0], slow=False)[0].power_limit_w == 450.0


def test_the_limits_of_a_plan_are_checked_against_each_card(
    gpustation_dirs: dict[str, Path],
) -> None:
    sim = SimBackend.open(count=2)
    assert sweep.plan_limits(sim, [0, 1], ["50%", "300W"]) == {
        "50%": {0: 225.0, 1: 225.0},
        "300W": {0: 300.0, 1: 300.0},
    }
    assert sweep.plan_limits(sim, [1], []) == {}
    with pytest.raises(GpustationError):
        sweep.plan_limits(sim, [0], ["5000W"])


def test_a_live_lease_on_the_cards_is_another_sweep_holding_them(
    gpustation_dirs: dict[str, Path],
) -> None:
    sim = SimBackend.open(count=2)
    uuid1 = sim.read_gpus([1], slow=False)[0].uuid
    lease.take(lease.Lease("other", "sweep other", [(1, uuid1)], True))
    assert [x.id for x in sweep_owner.holding_sweeps([0, 1], sim)] == ["other"]
    assert sweep_owner.holding_sweeps([0], sim) == []


def _active_run(run_id: str, gpus: list[int], simulated: bool) -> Path:
    directory = rundir.run_dir(run_id)
    directory.mkdir(parents=True)
    rundir.write_json(
        directory / rundir.RUN_JSON,
        {"id": run_id, "gpus": gpus, "backend": {"simulated": simulated}, "preset": {}},
    )
    me = psutil.Process()
    rundir.write_state(
        directory,
        RunState(
            id=run_id,
            status="running",
            supervisor_pid=me.pid,
            supervisor_create_time=me.create_time(),
            started_at=1.0,
        ),
    )
    return directory


def test_a_sweep_waits_for_the_runs_on_its_cards(gpustation_dirs: dict[str, Path]) -> None:
    first = _active_run("r1", [0, 1], simulated=True)
    _active_run("r2", [1], simulated=False)
    assert sweep_owner.runs_on([1, 2], True) == [("r1", [1])]
    assert sweep_owner.runs_on([3], True) == []
    assert sweep_owner.runs_text([("r1", [0, 1]), ("r3", [2])]) == (
        "run r1 on GPU 0, 1; run r3 on GPU 2"
    )
    said: list[str] = []
    sweep_owner.wait_for_runs([3], True, said.append)
    assert said == []  # nothing to wait for: nothing said
    with pytest.raises(GpustationError) as err:
        sweep_owner.wait_for_runs([0], True, said.append, timeout_s=0.3)
    assert str(err.value) == "run r1 on GPU 0 still going"
    assert said == ["waiting for run r1 on GPU 0 to end before the first point"]

    def ends(line: str) -> None:
        said.append(line)
        rundir.write_state(
            first, RunState(id="r1", status="succeeded", started_at=1.0, ended_at=2.0)
        )

    sweep_owner.wait_for_runs([0, 1], True, ends, timeout_s=30)
    assert said[-1] == "waiting for run r1 on GPU 0, 1 to end before the first point"
