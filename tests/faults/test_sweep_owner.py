"""A sweep owns the power limits it changes and gives them back: real `gpustation
sweep` processes on simulated GPUs, hung up on, killed outright, run two at once,
raced by `power set`; leftovers matched to their card by UUID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.core import Metric

from gpustation.control import journal, lease
from gpustation.runs import rundir
from gpustation.runs.sweep import model as sweep
from gpustation.runs.sweep import owner as sweep_owner
from gpustation.serve.exporter import Exporter
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend
from tests.conftest import child_env, gpustation_cmd, run_gpustation
from tests.runs.conftest import RunsEnv, sim_limits, sweep_preset, wait_until

TIMEOUT = 120.0


def _preset(runs_env: RunsEnv, sleep: float = 5.0) -> None:
    sweep_preset(runs_env, sleep)


_limits = sim_limits


def gs(*args: str) -> subprocess.CompletedProcess[str]:
    return run_gpustation(*args, timeout=TIMEOUT)


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        gpustation_cmd("sweep", "sweepy", "--simulate", "2", "--grace", "2", *args),
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _running_point(sweep_id: str | None = None) -> sweep.Sweep:
    """Wait until a sweep has its first point's run going; return that sweep."""

    def found() -> sweep.Sweep | None:
        for s in sweep.list_sweeps():
            if sweep_id not in (None, s.id):
                continue
            if any(p.status == "running" and p.run_id for p in s.points):
                return s
        return None

    got = wait_until(found, TIMEOUT, "a sweep's first point")
    assert isinstance(got, sweep.Sweep)
    return got


def _end_runs(runs_env: RunsEnv) -> None:
    """The point a killed sweep was running goes on under its supervisor: end it."""
    for d in (runs_env["dirs"]["data"] / "runs").glob("*"):
        state = rundir.read_state(d)
        if state is not None and state.child_pid and state.active:
            try:
                os.killpg(state.pgid or 0, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    wait_until(lambda: not sweep_owner.runs_on([0, 1], True), TIMEOUT, "the runs' end")


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.communicate()


def test_sighup_stops_the_point_and_restores_the_limits(
    runs_env: RunsEnv, procs: list[subprocess.Popen[str]]
) -> None:
    _preset(runs_env)
    before = _limits()
    proc = _start("--power-limit", "70%")
    procs.append(proc)
    running = _running_point()
    assert _limits() == [315.0, 315.0]
    proc.send_signal(signal.SIGHUP)  # the terminal or the ssh session closed
    assert proc.wait(timeout=TIMEOUT) == 130
    assert _limits() == before
    done = sweep.load_sweep(running.id)
    assert done.status == "stopped" and done.restored
    state = rundir.read_state(runs_env["dirs"]["data"] / "runs" / str(done.points[0].run_id))
    assert state is not None and state.status == "stopped"
    assert lease.read_leases() == []  # the lease went with the limits


def _families(exporter: Exporter) -> dict[str, Metric]:
    return {m.name: m for m in exporter.registry.collect()}


def test_a_sigkilled_sweep_is_dead_and_every_view_names_the_limit_it_left(
    runs_env: RunsEnv, procs: list[subprocess.Popen[str]]
) -> None:
    _preset(runs_env)
    proc = _start("--power-limit", "70%")
    procs.append(proc)
    killed = _running_point()
    proc.send_signal(signal.SIGKILL)  # no handler runs: the limits stay changed
    proc.wait(timeout=TIMEOUT)
    _end_runs(runs_env)
    assert _limits() == [315.0, 315.0]
    note = f"limit left by sweep {killed.id}; `gpustation sweeps restore {killed.id}`"

    listed = gs("sweeps", "list")
    assert listed.returncode == 0, listed.stderr
    (line,) = [x for x in listed.stdout.splitlines() if killed.id in x]
    assert f"dead: its process (pid {proc.pid}, started" in line
    assert f"`gpustation sweeps restore {killed.id}`" in line
    shown = gs("sweeps", "show", killed.id, "--json")
    assert json.loads(shown.stdout)["state"].startswith(f"dead: its process (pid {proc.pid}")

    power = gs("power", "show", "--simulate", "2")
    assert f"WARNING: GPU 0: {note}" in power.stdout and f"GPU 1: {note}" in power.stdout
    snap = gs("snapshot", "--simulate", "2", "--json")
    assert [g.get("limit_note") for g in json.loads(snap.stdout)["gpus"]] == [note, note]
    table = gs("snapshot", "--simulate", "2")
    assert f"WARNING: GPU 1: {note}" in table.stdout

    exporter = Exporter(Sampler(SimBackend.open(count=2)).sample, interval_s=60)
    exporter.sample_once()
    exporter._refresh_extras()
    metric = _families(exporter)["gpustation_power_limit_left"]
    assert {(s.labels["gpu"], s.labels["note"]) for s in metric.samples} == {
        ("0", note),
        ("1", note),
    }

    restored = gs("sweeps", "restore", killed.id, "--simulate", "2")
    assert restored.returncode == 0, restored.stderr
    assert _limits() == [450.0, 450.0]
    assert "limit left" not in gs("power", "show", "--simulate", "2").stdout
    assert "dead" in gs("sweeps", "list").stdout  # still dead; nothing left changed
    assert "sweeps restore" not in gs("sweeps", "list").stdout


def test_one_owner_at_a_time_and_force_ends_the_first(
    runs_env: RunsEnv, procs: list[subprocess.Popen[str]]
) -> None:
    _preset(runs_env)
    before = _limits()
    first = _start("--power-limit", "70%")
    procs.append(first)
    owner = _running_point()
    owner_says = f"sweep {owner.id} (pid {first.pid}, on GPU 0, 1)"

    second = gs("sweep", "sweepy", "--simulate", "2", "--power-limit", "80%", "--set", "steps=1")
    assert second.returncode == 1, second.stderr
    assert owner_says in second.stderr and "--force" in second.stderr
    assert _limits() == [315.0, 315.0]
    assert [s.id for s in sweep.list_sweeps()] == [owner.id]  # none started

    power = gs("power", "set", "300W", "--simulate", "2")
    assert power.returncode == 1 and owner_says in power.stderr, power.stderr
    assert "set GPU" not in power.stdout and _limits() == [315.0, 315.0]
    restore = gs("sweeps", "restore", owner.id, "--simulate", "2")
    assert restore.returncode == 1 and "is still running" in restore.stderr
    assert _limits() == [315.0, 315.0]  # its point is not changed under it

    forced = gs(
        "sweep", "sweepy", "--simulate", "2", "--power-limit", "80%", "--set", "steps=1",
        "--set", "sleep=0.05", "--force",
    )  # fmt: skip
    assert forced.returncode == 0, forced.stderr
    assert first.wait(timeout=TIMEOUT) == 130
    ended = sweep.load_sweep(owner.id)
    assert ended.status == "stopped" and ended.restored
    assert _limits() == before
    # the first put its limits back before the second set its own
    commands = [e.command for e in journal.read_entries()]
    restore_at = max(i for i, c in enumerate(commands) if f"{owner.id}: restore" in c)
    new = next(s for s in sweep.list_sweeps() if s.id != owner.id)
    assert min(i for i, c in enumerate(commands) if f"sweep {new.id}: " in c) > restore_at
    assert new.status == "finished" and new.points[0].limits_w == {0: 360.0, 1: 360.0}


def test_power_set_force_ends_the_sweep_which_restores_first(
    runs_env: RunsEnv, procs: list[subprocess.Popen[str]]
) -> None:
    _preset(runs_env)
    first = _start("--power-limit", "70%")
    procs.append(first)
    owner = _running_point()
    forced = gs("power", "set", "300W", "--simulate", "2", "--force")
    assert forced.returncode == 0, forced.stderr
    assert f"ending sweep {owner.id}" in forced.stdout
    assert first.wait(timeout=TIMEOUT) == 130 and sweep.load_sweep(owner.id).restored
    assert _limits() == [300.0, 300.0]  # set after the sweep's restore, not undone by it


def test_the_next_sweep_waits_for_the_killed_sweep_s_point_run(
    runs_env: RunsEnv, procs: list[subprocess.Popen[str]]
) -> None:
    _preset(runs_env, sleep=0.5)
    proc = _start("--power-limit", "70%", "--set", "steps=10")
    procs.append(proc)
    killed = _running_point()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=TIMEOUT)
    run_id = str(killed.points[0].run_id)
    refused = gs("sweep", "sweepy", "--simulate", "2", "--set", "steps=1")
    assert refused.returncode == 1 and f"run {run_id} on GPU 0, 1 is still going" in refused.stderr
    waited = gs("sweep", "sweepy", "--simulate", "2", "--set", "steps=1", "--wait")
    assert waited.returncode == 0, waited.stderr
    assert f"waiting for run {run_id} on GPU 0, 1" in waited.stderr
    state = rundir.read_state(runs_env["dirs"]["data"] / "runs" / run_id)
    assert state is not None and not state.active
    new = next(s for s in sweep.list_sweeps() if s.id != killed.id)
    (point,) = new.points
    run = rundir.read_run(runs_env["dirs"]["data"] / "runs" / str(point.run_id)) or {}
    assert run["created_at"] >= (state.ended_at or 0)  # measured alone
    assert _limits() == [450.0, 450.0] and sweep.load_sweep(killed.id).restored


def test_leftover_limits_go_back_to_the_card_that_had_them_after_a_reorder(
    runs_env: RunsEnv, procs: list[subprocess.Popen[str]]
) -> None:
    _preset(runs_env)
    assert gs("power", "set", "400W", "--simulate", "2", "--gpus", "1").returncode == 0
    proc = _start("--power-limit", "70%", "--gpus", "0")
    procs.append(proc)
    killed = _running_point()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=TIMEOUT)
    _end_runs(runs_env)
    assert _limits() == [315.0, 400.0]
    SimBackend.open(count=2).reorder([1, 0])  # the cards swap slots
    assert _limits() == [400.0, 315.0]
    note = gs("power", "show", "--simulate", "2").stdout
    assert f"GPU 1: limit left by sweep {killed.id}" in note and "GPU 0: limit" not in note
    restored = gs("sweeps", "restore", killed.id, "--simulate", "2")
    assert restored.returncode == 0, restored.stderr
    assert _limits() == [400.0, 450.0]  # the card the sweep changed, where it is now


def test_a_simulated_h200_sweep_s_leftover_is_not_a_4090_s(runs_env: RunsEnv) -> None:
    h200 = SimBackend.open(count=2, card="h200")
    left = sweep.Sweep(
        id="20240101-000000-sweep-sweepy",
        preset="sweepy",
        axes={},
        power_limits=["70%"],
        gpus=[0, 1],
        status="running",
        simulated=True,
        original_limits_w={0: 700.0, 1: 700.0},
        uuids={g.index: g.uuid for g in h200.read_gpus([0, 1], slow=False)},
        pid=0,
    )
    left.save()
    rtx = SimBackend.open(count=2, card="rtx4090")
    assert sweep_owner.unrestored(rtx) == []  # another machine's cards
    assert [s.id for s in sweep_owner.unrestored(h200)] == [left.id]
    _preset(runs_env, sleep=0.05)
    result = gs("sweep", "sweepy", "--simulate", "2", "--sim-card", "rtx4090", "--set", "steps=1")
    assert result.returncode == 0, result.stderr
    assert "restoring them first" not in result.stderr
    assert [g.power_limit_w for g in rtx.read_gpus([0, 1], slow=False)] == [450.0, 450.0]
    assert not sweep.load_sweep(left.id).restored


def _dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def test_a_damaged_leftover_is_named_and_blocks_nothing(runs_env: RunsEnv) -> None:
    _preset(runs_env, sleep=0.05)
    bad = sweep.sweeps_dir() / "20240101-000000-sweep-sweepy" / sweep.SWEEP_JSON
    bad.parent.mkdir(parents=True)
    bad.write_text(
        json.dumps(
            {
                "id": "20240101-000000-sweep-sweepy",
                "preset": "sweepy",
                "original_limits_w": {"0": "lots"},
                "points": [{"index": 0, "overrides": {}, "limits_w": [1]}],
                "pid": _dead_pid(),
            }
        )
    )
    listed = gs("sweeps", "list")
    assert listed.returncode == 0 and str(bad) in listed.stderr, listed.stderr
    shown = gs("sweeps", "show", "20240101")
    assert shown.returncode == 2 and str(bad) in shown.stderr and "damaged" in shown.stderr
    assert "Traceback" not in shown.stderr + listed.stderr
    result = gs("sweep", "sweepy", "--simulate", "2", "--set", "steps=1")
    assert result.returncode == 0, result.stderr
    assert f"skipped: {bad} is damaged" in result.stderr


#: 20,000 values: a grid of two such axes must be refused before it is built
_BIG = ",".join(map(str, range(20000)))


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--power-limit", "abc"), "--power-limit 'abc'"),
        (("--power-limit", "250%"), "--power-limit '250%'"),
        (("--power-limit", "nan"), "--power-limit 'nan'"),
        (("--power-limit", "60%,,80%"), "an empty value"),
        (("--power-limit", "60%,60%"), "a value given twice"),
        (("--set", "sleep=nan"), "expected a finite number"),
        (("--set", "sleep=1e400"), "expected a finite number"),
        (
            ("--set", f"batch_size={_BIG}", "--set", f"steps={_BIG}"),
            "the grid has 400000000 points",
        ),
    ],
)
def test_bad_sweep_input_is_a_usage_error(
    runs_env: RunsEnv, argv: tuple[str, ...], says: str
) -> None:
    _preset(runs_env)
    result = gs("sweep", "sweepy", "--simulate", "2", *argv, "--dry-run")
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr
    assert sweep.list_sweeps() == []


def test_a_lease_whose_owner_is_gone_or_reused_holds_nothing(
    gpustation_dirs: dict[str, Path],
) -> None:
    pid = _dead_pid()
    lease.take(lease.Lease("old", "sweep old", [(0, "GPU-a")], True, pid=pid, start="1"))
    # this process's pid with another start time: a reused pid is not the owner
    reused = lease.Lease("reused", "sweep reused", [(0, "GPU-a")], True, start="0")
    lease.take(reused)
    assert lease.holders([(0, "GPU-a")], True) == []
    assert {x.id for x in lease.leftovers(True)} == {"old", "reused"}
    mine = lease.Lease("mine", "sweep mine", [(3, "GPU-a")], True)
    lease.take(mine)
    assert [x.id for x in lease.holders([(0, "GPU-a")], True)] == ["mine"]  # by UUID
    assert lease.holders([(0, "GPU-b")], True) == [] and lease.holders([(0, "GPU-a")], False) == []
    with pytest.raises(lease.LeaseHeld, match=r"sweep mine \(pid \d+, on GPU 3\)"):
        lease.take(lease.Lease("other", "sweep other", [(0, "GPU-a")], True))
    (Path(lease.lease_dir()) / "junk.json").write_text("{not json")
    assert {x.id for x in lease.read_leases()} == {"old", "reused", "mine"}


def test_a_lease_a_sweep_took_before_writing_anything_is_let_go(runs_env: RunsEnv) -> None:
    sim = SimBackend.open(count=2)
    uuid = sim.read_gpus([0], slow=False)[0].uuid
    lease.take(
        lease.Lease(
            "20240101-000000-sweep-x", "sweep 20240101-000000-sweep-x", [(0, uuid)], True,
            pid=_dead_pid(), start="1",
        )
    )  # fmt: skip
    assert lease.left_notes([(0, uuid)], True)
    assert sweep_owner.unrestored(sim) == []
    assert lease.read_leases() == []  # it changed nothing: nothing is said to be left
