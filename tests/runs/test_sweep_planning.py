"""A sweep's plan and its run, in-process: the --set and --power-limit parsers, the
grid, the sweep file's checks, and the runner setting, reading back and restoring
the limits on simulated cards around a stand-in for the run launcher."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpustation import privs, procstart
from gpustation.control import lease
from gpustation.errors import GpustationError, NeedsRootError, UsageError
from gpustation.runs import rundir
from gpustation.runs.presets import RunPreset
from gpustation.runs.rundir import RunState
from gpustation.runs.sweep import model as sweep
from gpustation.runs.sweep import runner as sweep_runner
from gpustation.telemetry.sim import SimBackend


def test_a_set_value_may_hold_an_equals_sign_and_spaces_around_are_dropped() -> None:
    assert sweep.parse_axes([" opt = a=1 , b=2", "bs=64"]) == {"opt": ["a=1", "b=2"], "bs": ["64"]}
    assert sweep.parse_axes([]) == {}


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("batch_size", "--set 'batch_size': expected key=value[,value...], e.g. batch_size=64,128"),
        (" =64", "--set ' =64': expected key=value[,value...], e.g. batch_size=64,128"),
        ("bs=64,,128", "--set 'bs=64,,128': an empty value in the list"),
        ("bs=", "--set 'bs=': an empty value in the list"),
    ],
)
def test_a_set_that_is_not_key_equals_values_is_refused(item: str, says: str) -> None:
    with pytest.raises(UsageError) as err:
        sweep.parse_axes([item])
    assert str(err.value) == says


def test_a_set_key_given_twice_is_refused() -> None:
    with pytest.raises(UsageError) as err:
        sweep.parse_axes(["bs=1", " bs =2"])
    assert str(err.value) == "--set bs: given twice; list every value in one --set"


def test_the_power_axis_takes_watts_percentages_and_the_default() -> None:
    assert sweep.parse_power_axis(None) == []
    assert sweep.parse_power_axis(" 60% , 300W,default") == ["60%", "300W", "default"]
    for text, says in (
        ("60%,,70%", "--power-limit '60%,,70%': an empty value in the list"),
        ("60%,60%", "--power-limit '60%,60%': a value given twice"),
        ("infW", "--power-limit 'infW': expected watts (350, 350W) or a percentage"),
    ):
        with pytest.raises(UsageError) as err:
            sweep.parse_power_axis(text)
        assert str(err.value).startswith(says)
    with pytest.raises(UsageError, match=r"^--power-limit 'lots': "):
        sweep.parse_power_axis("60%,lots")


def test_the_grid_is_every_combination_in_order_with_its_repeats() -> None:
    points = sweep.grid({"bs": ["1", "2"], "p": ["a"]}, ["60%", "80%"], 2)
    assert [(p.index, p.overrides, p.power, p.repeat) for p in points] == [
        (0, {"bs": "1", "p": "a"}, "60%", 0),
        (1, {"bs": "1", "p": "a"}, "60%", 1),
        (2, {"bs": "1", "p": "a"}, "80%", 0),
        (3, {"bs": "1", "p": "a"}, "80%", 1),
        (4, {"bs": "2", "p": "a"}, "60%", 0),
        (5, {"bs": "2", "p": "a"}, "60%", 1),
        (6, {"bs": "2", "p": "a"}, "80%", 0),
        (7, {"bs": "2", "p": "a"}, "80%", 1),
    ]
    alone = sweep.grid({}, [], 1)
    assert [(p.index, p.overrides, p.power, p.label) for p in alone] == [
        (0, {}, None, "(defaults)")
    ]
    assert points[7].label == "bs=2 p=a power=80%"


def test_the_grid_has_at_most_its_cap_of_points() -> None:
    assert len(sweep.grid({"x": [str(i) for i in range(sweep.MAX_POINTS)]}, [], 1)) == 256
    with pytest.raises(UsageError) as err:
        sweep.grid({"x": [str(i) for i in range(129)]}, ["60%", "70%"], 1)
    assert str(err.value) == "the grid has 258 points; at most 256 in one sweep"
    with pytest.raises(UsageError, match="the grid has 257 points"):
        sweep.grid({"x": [str(i) for i in range(257)]}, [], 1)


def _doc(**more: Any) -> dict[str, Any]:
    return {"id": "s1", "preset": "p", "axes": {}, "power_limits": [], "gpus": [0], **more}


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ([], "not a JSON object"),
        (_doc(repeat=True), "'repeat' is not a whole number"),
        (_doc(within_pct="5"), "'within_pct' is not a whole number or a number"),
        (_doc(warmup_s=[]), "'warmup_s' is not a whole number or a number or null"),
        (_doc(pid_start=3), "'pid_start' is not text or null"),
        (_doc(simulated=1), "'simulated' is not true or false"),
        (_doc(axes=[]), "'axes' is not an object"),
        (_doc(points={}), "'points' is not a list"),
        (_doc(id=""), "'id' is missing"),
        ({"id": "s1"}, "'preset' is missing"),
        (_doc(points=[3]), "point 1 is not an object"),
        (
            _doc(points=[{"index": 0, "overrides": {}}, {"index": "1"}]),
            "point 2: 'index' is not a whole number",
        ),
        (_doc(points=[{"index": 0}]), "point 1 lacks its index or overrides"),
        (
            _doc(points=[{"index": 0, "overrides": {}, "limits_w": {"0": "x"}}]),
            "a power limit of 'x', not watts",
        ),
        (_doc(original_limits_w={"0": True}), "a power limit of True, not watts"),
        (_doc(original_limits_w={"0": 0}), "a power limit of 0 W"),
        (_doc(original_limits_w={"0": 5001}), "a power limit of 5001 W"),
        (_doc(original_limits_w={"0": float("nan")}), "a power limit of nan W"),
    ],
)
def test_a_damaged_sweep_file_is_refused_naming_the_field(doc: Any, says: str) -> None:
    with pytest.raises(ValueError) as err:
        sweep.Sweep.from_dict(doc)
    assert str(err.value) == says


def test_a_sweep_file_reads_back_its_limits_and_uuids() -> None:
    got = sweep.Sweep.from_dict(
        _doc(
            original_limits_w={"0": 450, "1": 5000},
            uuids={"0": "GPU-a", "1": None},
            points=[{"index": 0, "overrides": {"bs": "1"}, "limits_w": {"1": 300}, "extra": 1}],
            unknown=True,
        )
    )
    assert got.original_limits_w == {0: 450.0, 1: 5000.0}
    assert got.uuids == {0: "GPU-a", 1: None}
    assert got.points[0].limits_w == {1: 300.0} and got.points[0].overrides == {"bs": "1"}
    assert sweep.Sweep.from_dict(_doc()).points == []


def _save(doc: dict[str, Any]) -> Path:
    directory = sweep.sweeps_dir() / str(doc["id"])
    directory.mkdir(parents=True)
    path = directory / sweep.SWEEP_JSON
    path.write_text(json.dumps(doc))
    return path


def test_sweeps_are_found_by_id_prefix_or_last_and_a_damaged_one_is_named(
    gpustation_dirs: dict[str, Path],
) -> None:
    with pytest.raises(UsageError) as err:
        sweep.load_sweep("last")
    assert str(err.value) == "no sweep matches 'last'; `gpustation sweeps list` shows them"
    _save(_doc(id="20260101-sweep-p"))
    _save(_doc(id="20260102-sweep-p"))
    _save(_doc(id="20260102-sweep-p-2"))
    bad = _save(_doc(id="20260103-sweep-q", repeat="x"))
    (sweep.sweeps_dir() / "no-file").mkdir()
    assert sweep.load_sweep("20260102-sweep-p").id == "20260102-sweep-p"  # exact beats prefix
    assert sweep.load_sweep("20260101").id == "20260101-sweep-p"
    with pytest.raises(UsageError) as err:
        sweep.load_sweep("20260102")
    assert str(err.value) == "2 sweeps matches '20260102'; `gpustation sweeps list` shows them"
    # the newest that can be read: a damaged file is named when asked for, never "last"
    assert sweep.load_sweep("last").id == "20260102-sweep-p-2"
    with pytest.raises(UsageError) as err:
        sweep.load_sweep("20260103")
    assert str(err.value) == (
        f"{bad} is damaged ('repeat' is not a whole number); move it away or delete it"
    )
    found, damaged = sweep.scan_sweeps()
    assert [s.id for s in found] == ["20260101-sweep-p", "20260102-sweep-p", "20260102-sweep-p-2"]
    assert damaged == [
        f"{bad} is damaged ('repeat' is not a whole number); move it away or delete it"
    ]
    assert [s.id for s in sweep.list_sweeps()] == [s.id for s in found]
    bad.write_text("{")
    with pytest.raises(UsageError) as err:
        sweep.read_sweep_file(bad)
    assert str(err.value) == f"{bad} cannot be read (not JSON); move it away or delete it"


def test_a_new_sweep_id_never_names_a_directory_that_exists(
    gpustation_dirs: dict[str, Path],
) -> None:
    now = 1_700_000_000.0
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))  # ids are stamped in UTC
    assert sweep.new_sweep_id("p", now) == f"{stamp}-sweep-p"
    (sweep.sweeps_dir() / f"{stamp}-sweep-p").mkdir(parents=True)
    assert sweep.new_sweep_id("p", now) == f"{stamp}-sweep-p-2"
    (sweep.sweeps_dir() / f"{stamp}-sweep-p-2").mkdir()
    assert sweep.new_sweep_id("p", now) == f"{stamp}-sweep-p-3"
    assert sweep.new_sweep_id("p").endswith("-sweep-p")


def test_a_sweep_whose_process_is_gone_is_dead_and_names_the_limits_it_left() -> None:
    me = SimpleNamespace(pid=os.getpid(), start=procstart.process_start(os.getpid()))
    s = sweep.Sweep(id="s", preset="p", axes={}, power_limits=[], gpus=[0], status="running")
    assert s.dead and not s.alive and not s.left_limits
    assert s.state_text().startswith("dead: its process (pid 0, started ")
    assert s.state_text().endswith(") is gone")
    s.original_limits_w = {0: 450.0}
    assert s.left_limits
    assert s.state_text().endswith("is gone; limits left changed: `gpustation sweeps restore s`")
    s.restored = True
    assert not s.left_limits and "limits left" not in s.state_text()
    s.restored, s.pid, s.pid_start = False, me.pid, me.start
    assert s.alive and not s.dead and not s.left_limits and s.state_text() == "running"
    s.pid_start = "another start"
    assert not s.alive
    s.status = "finished"
    assert not s.dead and s.state_text() == "finished"
    s.status = "planned"
    assert s.dead


def test_texts_of_limits_and_figures() -> None:
    assert sweep_runner._limits_text({1: 300.0, 0: 450.5}) == "GPU 0 450.5 W, GPU 1 300 W"
    assert sweep_runner._limits_text({}) == "none"
    figures = {"throughput": 1234.56, "unit": "img/s", "energy_per_unit_j": 0.123456}
    assert sweep_runner._figures_text(figures) == " - 1,234.6 img/s, 0.1235 J/unit"
    assert sweep_runner._figures_text({**figures, "work_unit": "img"}).endswith("J/img")
    assert sweep_runner._figures_text({"throughput": 5}) == " - 5.0 /s"
    assert sweep_runner._figures_text({"throughput": "x"}) == ""
    s = sweep.Sweep(id="s", preset="p", axes={}, power_limits=[], gpus=[0])
    assert json.loads(sweep.dumps(s))["id"] == "s"


def test_only_a_sweep_with_a_power_axis_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(privs, "can_be_root", lambda: False)
    plain = sweep.Sweep(id="s", preset="p", axes={}, power_limits=[], gpus=[0])
    sweep_runner.require_root_for(plain, simulated=False)
    plain.power_limits = ["70%"]
    sweep_runner.require_root_for(plain, simulated=True)
    with pytest.raises(NeedsRootError, match="needs root: run it as sudo gpustation sweep"):
        sweep_runner.require_root_for(plain, simulated=False)
    monkeypatch.setattr(privs, "can_be_root", lambda: True)
    sweep_runner.require_root_for(plain, simulated=False)


# ---- the runner ---------------------------------------------------------------------


class Launcher:
    """Stands in for the run launcher: each point's run ends at once with figures."""

    def __init__(self, backend: SimBackend, statuses: list[str]) -> None:
        self.backend = backend
        self.statuses = statuses
        self.calls: list[tuple[Any, ...]] = []
        self.limits_seen: list[float | None] = []

    def __call__(self, preset: RunPreset, overrides: dict[str, str], gpus: Any, **kw: Any) -> Any:
        n = len(self.calls)
        self.calls.append((preset.tags, overrides, gpus, kw))
        self.limits_seen.append(self.backend.read_gpus([0], slow=False)[0].power_limit_w)
        run_id = f"run-{n}"
        directory = rundir.run_dir(run_id)
        directory.mkdir(parents=True)
        status = self.statuses[n]
        rundir.write_state(
            directory,
            RunState(
                id=run_id,
                status=status.removesuffix("+oom"),
                oom=status.endswith("+oom"),
                started_at=100.0,
                ended_at=110.0,
            ),
        )
        with open(directory / rundir.METRICS_FILE, "w") as fh:
            for t in range(3):
                fh.write(
                    json.dumps({"time": 100.0 + t, "throughput": 10.0 * (n + 1), "unit": "img/s"})
                    + "\n"
                )
        with open(directory / rundir.TELEMETRY_FILE, "w") as fh:
            for t in range(3):
                gpu = {"index": 0, "power_w": 200.0, "energy_j": 200.0 * t}
                fh.write(json.dumps({"t": t, "time": 100.0 + t, "gpus": [gpu]}) + "\n")
        return SimpleNamespace(id=run_id, run_dir=directory)


def _runner(
    backend: SimBackend, s: sweep.Sweep, statuses: list[str]
) -> tuple[Any, Launcher, list[str]]:
    said: list[str] = []
    launcher = Launcher(backend, statuses)
    runner = sweep_runner.SweepRunner(
        sweep=s,
        preset=RunPreset(name="p", title="P", tags=["base"]),
        backend=backend,
        launch=launcher,
        wait=lambda _d: None,
        say=said.append,
        stop_grace_s=3.0,
        simulate=1,
    )
    return runner, launcher, said


def test_the_runner_sets_each_point_s_limit_reads_it_back_and_restores_the_original(
    gpustation_dirs: dict[str, Path],
) -> None:
    sim = SimBackend.open(count=1)
    sim.control.set_power_limit(0, 400.0)
    s = sweep.Sweep(
        id="20260101-000000-sweep-p",
        preset="p",
        axes={"bs": ["1", "2"]},
        power_limits=["300W", "50%"],
        gpus=[0],
        simulated=True,
        created_at=1.0,
        points=sweep.grid({"bs": ["1", "2"]}, ["300W", "50%"], 1),
    )
    s.points[3].status = "succeeded"  # done before: not run again
    runner, launcher, said = _runner(sim, s, ["succeeded", "failed+oom", "failed"])
    done = runner.run()
    assert launcher.limits_seen == [300.0, 225.0, 300.0]
    assert [p.status for p in done.points] == ["succeeded", "oom", "failed", "succeeded"]
    assert [p.limits_w for p in done.points[:3]] == [{0: 300.0}, {0: 225.0}, {0: 300.0}]
    tags, overrides, gpus, kw = launcher.calls[0]
    assert tags == ["base", "sweep:20260101-000000-sweep-p"] and overrides == {"bs": "1"}
    assert gpus == [0] and kw == {"simulate": 1, "sim_card": None, "stop_grace_s": 3.0}
    assert [p.run_id for p in done.points] == ["run-0", "run-1", "run-2", None]
    assert done.points[1].figures["throughput"] == 20.0
    assert sim.read_gpus([0], slow=False)[0].power_limit_w == 400.0
    assert done.status == "finished" and done.restored and done.original_limits_w == {0: 400.0}
    assert done.uuids == {0: sim.read_gpus([0], slow=False)[0].uuid}
    assert done.pid == os.getpid() and done.ended_at is not None
    assert sweep.load_sweep(done.id).status == "finished"
    assert lease.get(done.id) is None  # the lease went with the restore
    assert said[0] == "point 1/4: bs=1 power=300W"
    assert said[1] == "  power limit GPU 0 300 W (read back)"
    assert said[2] == "  run run-0: succeeded - 10.0 img/s, 20 J/img"
    assert said[-1] == "power limits restored: GPU 0 400 W"


def test_a_runner_without_a_power_axis_touches_no_limit(gpustation_dirs: dict[str, Path]) -> None:
    sim = SimBackend.open(count=1)
    s = sweep.Sweep(
        id="s2", preset="p", axes={}, power_limits=[], gpus=[], points=sweep.grid({}, [], 2)
    )
    runner, launcher, said = _runner(sim, s, ["succeeded", "stopped"])
    done = runner.run()
    assert [p.status for p in done.points] == ["succeeded", "stopped"]
    assert launcher.calls[0][2] is None  # no GPUs named: the launcher picks
    assert done.original_limits_w == {} and not any("power" in line for line in said)
    assert said[0] == "point 1/2: (defaults)"


def test_a_card_that_reads_back_another_limit_fails_the_sweep_and_the_original_goes_back(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = SimBackend.open(count=1)
    s = sweep.Sweep(
        id="s3",
        preset="p",
        axes={},
        power_limits=["300W"],
        gpus=[0],
        simulated=True,
        points=sweep.grid({}, ["300W"], 1),
    )
    real = sim.control.set_power_limit

    def off_by_one(index: int, watts: float) -> None:
        real(index, watts + (1.0 if watts == 300.0 else 0.0))

    monkeypatch.setattr(sim.control, "set_power_limit", off_by_one)
    runner, _launcher, _said = _runner(sim, s, ["succeeded"])
    with pytest.raises(GpustationError):
        runner.run()
    assert s.status == "failed" and s.restored
    assert sim.read_gpus([0], slow=False)[0].power_limit_w == 450.0
    assert sweep.load_sweep("s3").status == "failed"


def test_a_card_that_does_not_report_its_limit_is_refused_before_anything(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = SimBackend.open(count=1)
    real = sim.read_gpus

    def no_limit(indices: list[int], slow: bool = False) -> list[Any]:
        out = real(indices, slow=slow)
        for sample in out:
            sample.power_limit_w = None
        return out

    monkeypatch.setattr(sim, "read_gpus", no_limit)
    s = sweep.Sweep(
        id="s4",
        preset="p",
        axes={},
        power_limits=["300W"],
        gpus=[0],
        simulated=True,
        points=sweep.grid({}, ["300W"], 1),
    )
    runner, launcher, _said = _runner(sim, s, ["succeeded"])
    with pytest.raises(GpustationError, match="GPU 0 does not report its power limit"):
        runner.run()
    assert launcher.calls == [] and lease.get("s4") is None


def test_ctrl_c_stops_the_running_point_then_restores(gpustation_dirs: dict[str, Path]) -> None:
    sim = SimBackend.open(count=1)
    s = sweep.Sweep(
        id="s5",
        preset="p",
        axes={},
        power_limits=["300W"],
        gpus=[0],
        simulated=True,
        points=sweep.grid({}, ["300W"], 2),
    )
    stopped: list[Path] = []
    runner, _launcher, said = _runner(sim, s, ["succeeded", "succeeded"])

    def interrupted(_d: Path) -> None:
        raise KeyboardInterrupt

    runner.wait = interrupted
    runner.stop = stopped.append
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    assert s.status == "stopped" and [p.status for p in s.points] == ["stopped", "pending"]
    assert [p.name for p in stopped] == ["run-0"] and "stopping run run-0" in said
    assert sim.read_gpus([0], slow=False)[0].power_limit_w == 450.0


def test_a_restore_that_fails_is_said_with_the_command_that_finishes_it(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = SimBackend.open(count=1)
    s = sweep.Sweep(
        id="s6",
        preset="p",
        axes={},
        power_limits=["300W"],
        gpus=[0],
        simulated=True,
        points=sweep.grid({}, ["300W"], 1),
    )
    runner, _launcher, said = _runner(sim, s, ["succeeded"])

    def broken(*_a: Any) -> list[str]:
        raise GpustationError("the card went away")

    monkeypatch.setattr(sweep_runner, "restore_limits", broken)
    assert runner.run().status == "finished"
    assert said[-1] == (
        "could not restore the power limits (the card went away); run `gpustation sweeps "
        "restore s6`"
    )


def test_while_its_points_run_the_sweep_holds_a_lease_naming_it_and_says_it_runs(
    gpustation_dirs: dict[str, Path],
) -> None:
    sim = SimBackend.open(count=1)
    s = sweep.Sweep(
        id="s-lease",
        preset="p",
        axes={"bs": ["1", "2", "3"]},
        power_limits=["300W"],
        gpus=[0],
        simulated=True,
        points=sweep.grid({"bs": ["1", "2", "3"]}, ["300W"], 1),
    )
    s.points[1].status = "succeeded"  # done before: skipped, the next one still runs
    runner, launcher, _said = _runner(sim, s, ["succeeded", "succeeded"])
    seen: list[tuple[dict[str, object] | None, str]] = []
    real_call = launcher.__call__

    def watching(*args: Any, **kw: Any) -> Any:
        held = lease.get("s-lease")
        seen.append((None if held is None else held.to_dict(), sweep.load_sweep("s-lease").status))
        return real_call(*args, **kw)

    runner.launch = watching
    done = runner.run()
    assert [p.status for p in done.points] == ["succeeded", "succeeded", "succeeded"]
    assert [p.run_id for p in done.points] == ["run-0", None, "run-1"]
    held, status = seen[0]
    assert status == "running" and held is not None
    uuid = sim.read_gpus([0], slow=False)[0].uuid
    assert (
        held["owner"] == "sweep s-lease" and held["restore"] == "gpustation sweeps restore s-lease"
    )
    assert held["gpus"] == [{"index": 0, "uuid": uuid}] and held["simulated"] is True
    assert held["pid"] == os.getpid() and held["start"] == procstart.process_start(os.getpid())
    assert done.pid_start == procstart.process_start(os.getpid())
    assert lease.get("s-lease") is None
