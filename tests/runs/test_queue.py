"""The GPU queue: what counts as free (and the words for what is not), which GPUs a run
for any N gets, the queue's order, and queued runs started by a real scheduler on
simulated GPUs, one at a time per GPU, surviving a SIGKILLed scheduler."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gpustation.runs import rundir
from gpustation.runs.queue import entries as queue
from gpustation.runs.queue.choose import choose
from gpustation.runs.queue.folder import LOCK, queue_dir
from gpustation.runs.queue.free import GpuWatch, QueueSettings, load_settings
from gpustation.runs.store.index import RunStore
from gpustation.telemetry.model import GpuLink, GpuSample, ProcessInfo, Topology
from gpustation.telemetry.sim import SimBackend
from tests.conftest import child_env, gpustation_cmd
from tests.runs.conftest import RunsEnv, runs_environment, wait_until

TIMEOUT_S = 60.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sample(index: int, util: float = 0.0, procs: tuple[ProcessInfo, ...] = ()) -> GpuSample:
    s = GpuSample(index=index, uuid=f"GPU-{index}", name="card")
    s.utilization_gpu_pct = util
    s.memory_used_mib = sum(p.gpu_memory_mib or 0.0 for p in procs)
    s.processes = list(procs)
    return s


def test_free_means_no_run_no_big_process_and_a_quiet_settle_time() -> None:
    clock = Clock()
    watch = GpuWatch(QueueSettings(busy_mib=2048, busy_util_pct=10, settle_s=10), clock)
    serve = ProcessInfo(pid=4242, gpu_memory_mib=22 * 1024, user="alice", command="python serve.py")
    small = ProcessInfo(pid=7, gpu_memory_mib=300, user="bob", command="Xorg")
    mine = ProcessInfo(pid=99, gpu_memory_mib=30 * 1024, user="me", command="python train.py")
    watch.add([sample(0, 95, (mine,)), sample(1, 0, (serve, small)), sample(2, 0, (small,))],
              held={0: "run-a"}, run_pids={99})  # fmt: skip
    assert watch.busy(0) == "GPU 0: run run-a holds it"
    assert watch.busy(1) == "GPU 1: pid 4242 (alice, python serve.py) holds 22.0 GiB"
    assert watch.busy(2) is None  # a desktop's few hundred MiB is no job

    # The run ends: its GPU is free at once, its own load not held against the next run.
    clock.now += 1
    watch.add([sample(0, 0), sample(1, 0, (small,)), sample(2, 90, (small,))], {}, set())
    assert watch.busy(0) is None
    assert watch.busy(1) is None  # the big process left
    # Someone else's load on GPU 2 (a mean over the settle time) keeps it busy until the
    # time it was busy has left the window.
    assert watch.busy(2) == "GPU 2: 45 % busy over the last 10 s (pid 7 (bob, Xorg))"
    for _ in range(5):
        clock.now += 2
        watch.add([sample(0, 0), sample(1, 0), sample(2, 0, (small,))], {}, set())
    assert watch.busy(2) == "GPU 2: 15 % busy over the last 10 s (pid 7 (bob, Xorg))"
    clock.now += 2
    watch.add([sample(0, 0), sample(1, 0), sample(2, 0, (small,))], {}, set())
    assert watch.busy(2) is None
    assert watch.busy(3) == "GPU 3: not read yet"


def test_queue_settings_come_from_config_and_bad_ones_are_named(
    gpustation_dirs: dict[str, Path],
) -> None:
    config = gpustation_dirs["config"] / "config.toml"
    assert load_settings() == QueueSettings()
    config.write_text("[queue]\nbusy_mib = 512\nsettle_s = 3\n")
    assert load_settings() == QueueSettings(busy_mib=512, busy_util_pct=10, settle_s=3)
    for bad, word in (("busy_mib = -1", "busy_mib"), ('settle_s = "soon"', "settle_s"),
                      ("busy_gib = 2", "unknown key")):  # fmt: skip
        config.write_text(f"[queue]\n{bad}\n")
        with pytest.raises(Exception, match=word):
            load_settings()


def test_any_n_takes_the_least_used_or_the_best_connected_set() -> None:
    use = {0: (9000.0, 50.0), 1: (0.0, 0.0), 2: (100.0, 5.0), 3: (0.0, 1.0)}
    assert choose(1, [0, 1, 2, 3], use.__getitem__) == [1]
    assert choose(3, [0, 1], use.__getitem__) is None
    # 0-2 and 1-3 are NVLink pairs; across them the CPUs' interconnect.
    links = [GpuLink(a, b, level="SYS") for a in range(4) for b in range(a + 1, 4)]
    for link in links:
        if {link.gpu_a, link.gpu_b} in ({0, 2}, {1, 3}):
            link.level, link.nvlink_count = "NV4", 4
    topology = Topology(links=links)
    assert choose(2, [0, 1, 2, 3], use.__getitem__, topology) == [1, 3]
    assert choose(2, [0, 1, 2], use.__getitem__, topology) == [0, 2]  # a pair beats less use
    assert choose(2, [0, 1, 2, 3], use.__getitem__) == [1, 3]  # no topology: least used


# ---- a real scheduler on simulated GPUs -----------------------------------------------------


class QueueEnv(RunsEnv):
    """What :func:`queue_env` gives a test: a runs environment and its simulated cards."""

    sim: SimBackend


@pytest.fixture
def queue_env(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[QueueEnv]:
    gen = runs_environment(gpustation_dirs, monkeypatch)
    base = next(gen)
    # Idle simulated cards: no simulated job of their own comes and goes.
    backend = SimBackend.open(count=2, card=None)
    for index in range(2):
        backend.poke(index, load=0.0)
    yield QueueEnv(
        dirs=base["dirs"],
        preset_dir=base["preset_dir"],
        write_preset=base["write_preset"],
        sim=backend,
    )
    for entry in queue.entries():
        queue.cancel(entry.id)
    pid = _scheduler_pid()
    if pid is not None:
        wait_until(lambda: _scheduler_pid() is None, TIMEOUT_S, "the scheduler to leave")
    for _ in gen:
        pass


def _scheduler_pid() -> int | None:
    try:
        pid = int((queue_dir() / LOCK).read_text().strip() or 0)
    except (OSError, ValueError):
        return None
    if not pid:
        return None
    try:
        proc = psutil.Process(pid)
        return pid if "gpustation.runs.queue.scheduler" in " ".join(proc.cmdline()) else None
    except psutil.Error:
        return None


def gs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpustation_cmd(*args), capture_output=True, text=True, env=child_env(), timeout=TIMEOUT_S
    )


def _state(run_id: str) -> rundir.RunState | None:
    return rundir.read_state(rundir.run_dir(run_id))


def _status(run_id: str) -> str | None:
    state = _state(run_id)
    return state.status if state is not None else None


def _ended(run_id: str) -> bool:
    state = _state(run_id)
    return state is not None and state.status in rundir.FINAL_STATUSES


def _queued(*args: str) -> str:
    done = gs("run", "--queue", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def test_queued_runs_take_a_gpu_one_at_a_time_and_say_what_they_wait_for(
    queue_env: QueueEnv,
) -> None:
    first = _queued("--gpus", "0", "--", "python3", "-c", "import time; time.sleep(0.5)")
    second = _queued("--gpus", "0", "--", "python3", "-c", "pass")
    third = _queued("--gpus-count", "1", "--priority", "5", "--", "python3", "-c", "pass")
    listed = json.loads(gs("queue", "--json").stdout)
    assert listed["scheduler_running"] is True
    wait_until(lambda: all(_ended(r) for r in (first, second, third)), TIMEOUT_S, "three runs")
    states = {r: _state(r) for r in (first, second, third)}
    assert all(s is not None and s.status == "succeeded" for s in states.values())
    # The second started only once the first had ended on GPU 0.
    a, b = states[first], states[second]
    assert a is not None and b is not None and a.ended_at and b.started_at
    assert b.started_at >= a.ended_at
    runs = {r.id: r for r in RunStore().list_runs()}
    assert runs[first].gpus == [0] and runs[second].gpus == [0] and len(runs[third].gpus) == 1
    run_json = rundir.read_run(rundir.run_dir(second)) or {}
    assert run_json["queue"]["waited_s"] >= 0 and run_json["queue"]["priority"] == 0
    # its forecast is made as it starts, with its GPU's memory read then
    (room,) = run_json["forecast"]["gpus"]
    assert room["index"] == 0 and room["total_mib"] > 0 and room["free_mib"] is not None


def test_a_foreign_process_holds_a_run_back_named_until_it_lets_go(
    queue_env: QueueEnv,
) -> None:
    sim = queue_env["sim"]
    sim.poke(1, idle_holder_mib=22 * 1024)
    run_id = _queued("--gpus", "1", "--", "python3", "-c", "pass")

    def waiting() -> str | None:
        entry = queue.read_entry(run_id)
        return entry.waiting if entry is not None else None

    words = str(wait_until(waiting, TIMEOUT_S, "the scheduler's words"))
    assert words.startswith("GPU 1: pid ") and "holds 22.0 GiB" in words, words
    shown = gs("queue")
    assert run_id in shown.stdout and "holds 22.0 GiB" in shown.stdout
    assert _status(run_id) == "queued"
    sim.poke(1, idle_holder_mib=None)
    wait_until(lambda: _ended(run_id), TIMEOUT_S, "the run to start and end")


def test_a_killed_scheduler_loses_nothing_and_the_next_command_restarts_it(
    queue_env: QueueEnv,
) -> None:
    assert gs("queue", "pause").returncode == 0
    ids = [_queued("--gpus", "0", "--", "python3", "-c", "pass") for _ in range(3)]
    pid = wait_until(_scheduler_pid, TIMEOUT_S, "a scheduler")
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: _scheduler_pid() is None, TIMEOUT_S, "the scheduler to die")
    assert [e.id for e in queue.entries()] == ids  # all still queued, in order
    # Any command that writes brings one back; resume lets it start the runs.
    assert gs("runs", "list").returncode == 0
    wait_until(_scheduler_pid, TIMEOUT_S, "a new scheduler")
    assert all(_status(r) == "queued" for r in ids)
    assert gs("queue", "resume").returncode == 0
    wait_until(lambda: all(_ended(r) for r in ids), TIMEOUT_S, "the queued runs")
    assert not queue.entries()


def test_order_move_cancel_and_bad_input(queue_env: QueueEnv) -> None:
    assert gs("queue", "pause").returncode == 0
    a, b, c = (_queued("--gpus", "0", "--", "python3", "-c", "pass") for _ in range(3))
    high = _queued("--gpus", "0", "--priority", "3", "--", "python3", "-c", "pass")
    assert [e.id for e in queue.entries()] == [high, a, b, c]
    assert gs("queue", "move", c, "--first").returncode == 0
    assert [e.id for e in queue.entries()] == [c, high, a, b]
    assert gs("queue", "move", c, "--after", a).returncode == 0
    assert [e.id for e in queue.entries()] == [high, a, c, b]
    listed = gs("queue")
    assert "paused" in listed.stdout and listed.stdout.index(a) < listed.stdout.index(c)

    assert gs("queue", "cancel", b).returncode == 0
    state = _state(b)
    assert state is not None and state.status == "stopped"
    assert state.reason == "cancelled in the queue"
    stopped = gs("runs", "stop", c)  # stopping a queued run cancels it
    assert stopped.returncode == 0, stopped.stderr
    assert _status(c) == "stopped"
    assert [e.id for e in queue.entries()] == [high, a]

    for args, word in (
        (("run", "--queue", "--priority", "1000", "--", "true"), "--priority"),
        (("run", "--queue", "--gpus-count", "5", "--", "true"), "--gpus-count"),
        (("run", "--queue", "--gpus", "7", "--", "true"), "GPU 7 does not exist"),
        (("run", "--gpus-count", "1", "--", "true"), "go with --queue"),
        (("queue", "cancel", "nope"), "no queued run"),
        (("queue", "move", a, "--after", a), "behind itself"),
    ):
        bad = gs(*args)
        assert bad.returncode == 2 and word in bad.stderr, (args, bad.stderr)
