"""The energy account the runs on one GPU keep together: parts that add up to the counter."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from gpustation.runs import rundir
from gpustation.runs.gpushare import STALE_S, GpuAccount
from gpustation.runs.gputrace import summarize_telemetry
from gpustation.runs.launch.start import RunHandle, launch
from gpustation.runs.launch.stop import wait_for_end
from gpustation.runs.presets import load_presets
from gpustation.runs.store.index import RunStore
from gpustation.telemetry.model import GpuSample, ProcessInfo
from gpustation.telemetry.sim import SimBackend
from tests.conftest import known
from tests.runs.conftest import RunsEnv, command_preset, wait_until

UUID = "GPU-0000-test"
TIMEOUT = 60.0


def gpu(energy_j: float, procs: list[tuple[int, float]], power_w: float = 300.0) -> GpuSample:
    return GpuSample(
        index=0,
        uuid=UUID,
        power_w=power_w,
        energy_j=energy_j,
        processes=[ProcessInfo(pid=pid, sm_pct=sm) for pid, sm in procs],
    )


def parts_of(path: Path) -> list[dict[str, float]]:
    return [entry["parts"] for entry in json.loads(path.read_text())["entries"]]


def test_two_runs_reading_on_their_own_clocks_add_up_to_the_counter(tmp_path: Path) -> None:
    a = GpuAccount(UUID, "run-a", tmp_path)
    b = GpuAccount(UUID, "run-b", tmp_path)
    # Run a's process 11 and run b's 22 share the GPU with a process of no run (33).
    procs = [(11, 50.0), (22, 20.0), (33, 10.0)]
    taken: dict[str, list[list[float]]] = {"a": [], "b": []}
    start, watts = 1_000.0, 300.0
    first = last = None
    for n in range(60):
        for name, account, pid, phase in (("a", a, 11, 0), ("b", b, 22, 2)):
            # each run reads the counter every fifth second, on a phase of its own
            now = start + n + phase * 0.3
            counter = 5_000.0 + watts * (now - start)
            fresh = counter if n % 5 == phase else None
            if fresh is not None:
                first = fresh if first is None else first
                last = fresh
            taken[name] += account.add(gpu(counter, procs, watts), fresh, {pid}, now)
    assert first is not None and last is not None
    entries = json.loads(a.path.read_text())["entries"]
    for entry in entries:
        assert sum(entry["parts"].values()) == pytest.approx(entry["rise_j"], abs=1e-3)
    # the entries cover the counter from the first reading to the last, with no gap
    assert sum(e["rise_j"] for e in entries) == pytest.approx(last - first)
    mine = {name: sum(row[3] for row in rows) for name, rows in taken.items()}
    other = sum(p.get("pid:33", 0.0) for p in parts_of(a.path))
    # b joined after a's first entries: what a took before b came is a's and the other's
    b_joined = min(row[0] for row in taken["b"])
    before = sum(e["rise_j"] for e in entries if e["t1"] <= b_joined)
    assert mine["a"] + mine["b"] + other == pytest.approx(last - first, rel=1e-6)
    assert before < 0.2 * (last - first)
    # the SMs' idle time (20 %) is split evenly between the three processes
    assert mine["a"] / mine["b"] == pytest.approx((50 + 20 / 3) / (20 + 20 / 3), rel=0.05)
    assert all(row[4] == 1 for rows in taken.values() for row in rows)


def test_a_run_alone_keeps_the_whole_counter_its_idle_start_included(tmp_path: Path) -> None:
    a = GpuAccount(UUID, "alone", tmp_path)
    taken: list[list[float]] = []
    for n in range(12):
        procs = [] if n < 4 else [(7, 60.0)]  # no CUDA context yet for the first seconds
        counter = 100.0 + 80.0 * n
        taken += a.add(gpu(counter, procs), counter, {7}, 50.0 + n)
    assert sum(row[3] for row in taken) == pytest.approx(80.0 * 11)
    assert sum(row[2] for row in taken) == pytest.approx(80.0 * 11)


def test_idle_time_with_no_process_is_split_between_the_runs_on_the_gpu(tmp_path: Path) -> None:
    a = GpuAccount(UUID, "a", tmp_path)
    b = GpuAccount(UUID, "b", tmp_path)
    got = {"a": 0.0, "b": 0.0}
    for n in range(10):
        now = 10.0 + n
        got["a"] += sum(r[3] for r in a.add(gpu(100.0 * n, []), 100.0 * n, {1}, now))
        got["b"] += sum(r[3] for r in b.add(gpu(100.0 * n, []), None, {2}, now + 0.1))
    assert got["a"] == pytest.approx(got["b"], rel=0.15) and got["a"] > 0
    assert all("idle" not in parts for parts in parts_of(a.path))
    # no run on it any more: the time is idle, no one's
    lone = GpuAccount(UUID, "c", tmp_path)
    a.leave()
    b.leave()
    lone.add(gpu(5000.0, []), 5000.0, set(), 30.0)
    lone.leave()
    watcher = GpuAccount(UUID, "d", tmp_path)
    watcher.add(gpu(5100.0, []), None, set(), 31.0)
    assert json.loads(watcher.path.read_text())["runs"].keys() == {"d"}


def test_an_older_reading_neither_closes_an_entry_nor_restarts_the_account(
    tmp_path: Path,
) -> None:
    a = GpuAccount(UUID, "a", tmp_path)
    b = GpuAccount(UUID, "b", tmp_path)
    a.add(gpu(1000.0, [(1, 50.0)]), 1000.0, {1}, 100.0)
    a.add(gpu(1500.0, [(1, 50.0)]), 1500.0, {1}, 101.0)
    # b's reading was taken a moment before a's last one
    b.add(gpu(1490.0, [(1, 50.0), (2, 50.0)]), 1490.0, {2}, 100.99)
    account = json.loads(a.path.read_text())
    assert account["last_j"] == 1500.0 and account["seq"] == 1
    # a counter that started again (a driver reload) is a new start, not a rise
    a.add(gpu(20.0, [(1, 50.0)]), 20.0, {1}, 102.0)
    account = json.loads(a.path.read_text())
    assert account["last_j"] == 20.0 and account["seq"] == 1


def test_a_stale_or_damaged_account_starts_afresh(tmp_path: Path) -> None:
    a = GpuAccount(UUID, "a", tmp_path)
    a.add(gpu(1000.0, [(1, 50.0)]), 1000.0, {1}, 100.0)
    # nobody kept it for a long while: the next reading is a new start, not a rise
    later = 100.0 + STALE_S + 1
    assert a.add(gpu(9000.0, [(1, 50.0)]), 9000.0, {1}, later) == []
    assert json.loads(a.path.read_text())["last_j"] == 9000.0
    a.path.write_text('{"seq": "x", "entries": 5}')
    a.add(gpu(9100.0, [(1, 50.0)]), 9100.0, {1}, later + 1)
    a.add(gpu(9200.0, [(1, 50.0)]), 9200.0, {1}, later + 2)
    account = json.loads(a.path.read_text())
    assert account["seq"] == 1 and account["entries"][0]["rise_j"] == 100.0


def test_a_run_joining_takes_none_of_what_was_closed_before_it(tmp_path: Path) -> None:
    a = GpuAccount(UUID, "a", tmp_path)
    for n in range(5):
        a.add(gpu(100.0 * n, [(1, 90.0)]), 100.0 * n, {1}, 10.0 + n)
    b = GpuAccount(UUID, "b", tmp_path)
    assert b.add(gpu(500.0, [(1, 90.0)]), None, {2}, 15.0) == []
    rows = b.add(gpu(600.0, [(1, 90.0)]), 600.0, {2}, 16.0)
    # the one entry closed since it came: from a's last reading (400 J at 14 s)
    assert [row[:4] for row in rows] == [[14.0, 16.0, 200.0, 0.0]]
    assert rows[0][4] == 0  # its process was not on the GPU then


def test_the_run_s_energy_is_its_part_of_the_account(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    lines = [
        {"t": 0, "gpus": [{"index": 0, "power_w": 300, "energy_j": 0.0}]},
        {
            "t": 5,
            "gpus": [
                {
                    "index": 0,
                    "power_w": 300,
                    "energy_j": 1500.0,
                    "gpu_energy": [[0, 5, 1500, 600, 1]],
                }
            ],
        },
        {
            "t": 10,
            "gpus": [
                {
                    "index": 0,
                    "power_w": 300,
                    "energy_j": 3000.0,
                    # a damaged entry is skipped; a part over its rise is not believed
                    "gpu_energy": [[5, 10, 1500, 900, 1], [5, 10, 100, 900, 1], "x"],
                }
            ],
        },
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    path.write_text(text)
    summary = summarize_telemetry(path)
    assert summary.energy_j == pytest.approx(1500.0) and summary.estimated and summary.split
    # never seen on the GPU in any entry: the account says nothing of it
    path.write_text(text.replace(", 1]", ", 0]"))
    assert summarize_telemetry(path).energy_j == pytest.approx(3000.0)


def test_two_real_runs_on_one_simulated_gpu_add_up_to_its_counter(
    runs_env: RunsEnv, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    runs_env["write_preset"]("wait", command_preset("wait", "wait_file", str(release)))
    presets, _ = load_presets()
    handles = [launch(presets["wait"], gpus=[0]) for _ in range(2)]

    def child(handle: RunHandle) -> int | None:
        state = rundir.read_state(handle.run_dir)
        return None if state is None else state.child_pid

    pids = [wait_until(partial(child, h), TIMEOUT, "the run's child") for h in handles]
    # The simulated card lists the two runs' processes, with SM shares of their own.
    SimBackend.open(count=2).poke(
        0, load=0.1, guests=[[pids[0], 50.0, 1000.0], [pids[1], 20.0, 500.0]]
    )

    def entries_seen(handle: RunHandle) -> bool:
        text = (handle.run_dir / rundir.TELEMETRY_FILE).read_text()
        lines = [json.loads(line) for line in text.splitlines()]
        seen: int = sum(e[4] for line in lines for e in line["gpus"][0].get("gpu_energy", []))
        return seen >= 2

    for handle in handles:
        wait_until(partial(entries_seen, handle), TIMEOUT, "entries with the run's part")
    release.touch()
    records = []
    for handle in handles:
        wait_for_end(handle.run_dir, TIMEOUT)
        record = RunStore().get(handle.id)
        assert record is not None and record.energy_j is not None and record.energy_estimated
        records.append(record)
    (account,) = (runs_env["dirs"]["state"] / "gpu-energy").glob("*.json")
    entries = json.loads(account.read_text())["entries"]
    counted = sum(e["rise_j"] for e in entries)
    others = sum(v for e in entries for k, v in e["parts"].items() if not k.startswith("run:"))
    # the two runs' energies and the rest (the simulated job, idle) make up the counter
    assert sum(known(r.energy_j) for r in records) + others == pytest.approx(counted, rel=1e-3)
    assert known(records[0].energy_j) > known(records[1].energy_j) > 0
