"""Runs against bad inputs and a damaged history: every metrics line that is not
an event is counted and skipped, whatever it holds; runs.db is an index that is
rebuilt from the run directories; every JSON output is strict JSON."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpustation.runs import rundir
from gpustation.runs.fold import MetricsFold
from gpustation.runs.launch.start import launch
from gpustation.runs.launch.stop import wait_for_end
from gpustation.runs.presets import RunPreset, load_presets
from gpustation.runs.store.index import RunStore, db_path, record_from_dir
from gpustation.runs.store.reconcile import check_run, record_lost_runs
from gpustation.runs.tail import MetricsReader, parse_metric_line
from tests.conftest import REPO, child_env, gpustation_cmd
from tests.runs.children import bad_metrics_lines
from tests.runs.conftest import RunsEnv, command_preset, runs_environment, wait_until

TIMEOUT = 60.0


@pytest.fixture
def runs_env(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunsEnv]:
    yield from runs_environment(gpustation_dirs, monkeypatch)


def gs(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpustation_cmd(*args), capture_output=True, text=True, env=child_env(), timeout=timeout
    )


def _refuse(name: str) -> object:
    raise AssertionError(f"not strict JSON: {name}")


def strict(text: str) -> Any:
    """Parse as any strict JSON parser would: NaN and Infinity refused."""
    return json.loads(text, parse_constant=_refuse)


def db_rows() -> dict[str, str]:
    """id -> status, read from runs.db itself (not through the store's fallbacks)."""
    conn = sqlite3.connect(db_path(), timeout=30)
    try:
        return dict(conn.execute("SELECT id, status FROM runs").fetchall())
    finally:
        conn.close()


def run_preset(name: str) -> RunPreset:
    presets, problems = load_presets()
    assert name in presets, problems
    return presets[name]


# ---- 1. metrics lines ---------------------------------------------------------------


def test_every_bad_metrics_line_is_counted_and_skipped(runs_env: RunsEnv) -> None:
    runs_env["write_preset"]("bad", command_preset("bad", "bad_metrics", "30"))
    result = gs("run", "bad", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "succeeded" in result.stderr

    (listed,) = strict(gs("runs", "list", "--json").stdout)
    assert listed["status"] == "succeeded"
    assert listed["malformed_metrics"] == bad_metrics_lines()
    assert (listed["steps"], listed["final_loss"], listed["best_loss"]) == (5, 0.5, 0.5)
    assert listed["summary"] == {"accuracy": 0.75}
    # The row in runs.db itself is final (no SQLite overflow left it running).
    assert db_rows() == {listed["id"]: "succeeded"}

    shown = gs("runs", "show", "last")
    assert shown.returncode == 0, shown.stderr
    assert f"malformed metric lines  {bad_metrics_lines()}" in shown.stdout
    assert strict(gs("runs", "show", "last", "--json").stdout)["steps"] == 5
    compared = gs("runs", "compare", "last", listed["id"], "--json")
    assert compared.returncode == 0, compared.stderr
    rows = {r["name"]: r for r in strict(compared.stdout)["rows"]}
    assert rows["final loss"]["values"] == [0.5, 0.5]
    assert gs("runs", "compare", "last", listed["id"]).returncode == 0
    assert gs("runs", "list").returncode == 0


@pytest.mark.parametrize(
    "line",
    [
        b"[" * 100_000,
        b'{"a":' * 5000 + b"1" + b"}" * 5000,
        b'{"step": 18446744073709551616}',
        b'{"step": -9223372036854775809}',
        b'{"step": 1, "x": ' + b"9" * 5000 + b"}",
        b'{"loss": NaN}',
        b'{"loss": -Infinity}',
        b'{"lr": 1e999}',
        b'{"step": 1.0}',
        b'{"step": null, "loss": {"a": 1}}',
        b'{"mem_peak_mib": "lots"}',
        b'{"throughput": true}',
        b"\x00\x01\x02",
        b"null",
    ],
)
def test_parse_refuses_what_downstream_cannot_hold(line: bytes) -> None:
    assert parse_metric_line(line) is None


def test_a_diverged_loss_written_as_null_is_still_an_event() -> None:
    assert parse_metric_line(b'{"t": 1, "step": 2, "loss": null}') == {
        "t": 1,
        "step": 2,
        "loss": None,
    }


def test_a_40_mb_line_is_read_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with open(path, "wb") as fh:
        fh.write(b'{"t": 1, "step": 1, "loss": 2.0}\n{"pad": "')
        for _ in range(40):
            fh.write(b"y" * (1 << 20))
        fh.write(b'"}\n{"t": 2, "step": 2, "loss": 1.0}\n{"unfinished": "')
        fh.write(b"z" * (3 << 20))  # and a long last line with no newline at all
    tracemalloc.start()
    try:
        fold = MetricsFold()
        malformed = fold.read(path)
        _, fold_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        reader = MetricsReader(path)
        events = reader.read_new() + reader.finish()
        _, reader_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (malformed, fold.step, fold.final_loss) == (2, 2, 1.0)
    assert [e["step"] for e in events] == [1, 2]
    assert reader.malformed_count == 2
    # Bounded by a chunk and a line's limit (1 MiB each), not by the 40 MB line.
    assert fold_peak < 8 << 20, fold_peak
    assert reader_peak < 8 << 20, reader_peak


def test_the_follower_takes_a_long_line_in_bites(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    reader = MetricsReader(path)
    path.write_bytes(b'{"step": 1}\n')
    assert [e["step"] for e in reader.read_new()] == [1]
    with open(path, "ab") as fh:
        for _ in range(5):  # a writer still writing a line of 5 MiB
            fh.write(b"w" * (1 << 20))
            fh.flush()
            assert reader.read_new() == []
        fh.write(b'\n{"step": 2}\n')
    assert [e["step"] for e in reader.read_new()] == [2]
    assert reader.malformed_count == 1
    assert reader.tailer.offset == path.stat().st_size


def test_bad_telemetry_lines_do_not_stop_the_summary(runs_env: RunsEnv) -> None:
    runs_env["write_preset"]("ok", command_preset("ok", "train_ok", args="steps = 2"))
    handle = launch(run_preset("ok"))
    end = wait_for_end(handle.run_dir, TIMEOUT)
    assert end is not None and end.status == "succeeded"
    with open(handle.run_dir / rundir.TELEMETRY_FILE, "ab") as fh:
        for bad in (
            b"[" * 3000,
            b'{"t": "x", "gpus": []}',
            b'{"t": 99, "gpus": [{"index": "a", "power_w": 5}]}',
            b'{"t": 99, "gpus": [{"index": 0, "power_w": NaN}]}',
            b'{"t": 1e999, "gpus": []}',
            b'{"t": 99, "gpus": [{"index": [0], "energy_j": true}]}',
        ):
            fh.write(bad + b"\n")
    record = record_from_dir(handle.run_dir)
    assert record.status == "succeeded" and record.energy_j is not None


# ---- 2. runs.db is an index -----------------------------------------------------------


def _two_runs(runs_env: RunsEnv) -> list[str]:
    runs_env["write_preset"]("ok", command_preset("ok", "train_ok", args="steps = 2"))
    ids = []
    for _ in range(2):
        handle = launch(run_preset("ok"))
        state = wait_for_end(handle.run_dir, TIMEOUT)
        assert state is not None and state.status == "succeeded"
        ids.append(handle.id)
    wait_until(lambda: set(db_rows().values()) == {"succeeded"}, TIMEOUT, "the rows")
    return ids


def _damage(how: str) -> None:
    path = db_path()
    for extra in ("-wal", "-shm"):
        Path(f"{path}{extra}").unlink(missing_ok=True)
    if how == "deleted":
        path.unlink()
    elif how == "garbage":
        path.write_bytes(os.urandom(64 * 1024))
    else:  # truncated
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("how", ["deleted", "garbage", "truncated"])
def test_a_lost_or_damaged_index_is_rebuilt_from_the_run_directories(
    runs_env: RunsEnv, how: str
) -> None:
    ids = _two_runs(runs_env)
    _damage(how)
    if how != "deleted":
        with pytest.raises(sqlite3.DatabaseError):
            db_rows()
    listed = gs("runs", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(r["id"] for r in strict(listed.stdout)) == sorted(ids)
    assert "rebuilt the run history from 2 run directories" in listed.stderr
    shown = gs("runs", "show", ids[0], "--json")
    assert shown.returncode == 0 and strict(shown.stdout)["status"] == "succeeded"
    assert gs("runs", "compare", *ids).returncode == 0
    # The next writer (a run) writes the index again, with every run in it.
    third = launch(run_preset("ok"))
    wait_for_end(third.run_dir, TIMEOUT)
    wait_until(lambda: len(db_rows()) == 3, TIMEOUT, "the rebuilt index")
    assert set(db_rows()) == {*ids, third.id}
    assert "rebuilt" not in gs("runs", "list").stderr
    if how != "deleted":
        assert list(db_path().parent.glob("runs.db.bad-*")), "the bad file is kept aside"


def test_a_run_starts_while_the_index_is_locked_and_is_recorded_after(runs_env: RunsEnv) -> None:
    (first, _second) = _two_runs(runs_env)
    locker = sqlite3.connect(db_path(), timeout=1, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        result = gs("run", "ok", timeout=120)
        assert result.returncode == 0, result.stderr
        assert "succeeded" in result.stderr
        assert time.monotonic() - started < 45
        run_id = next(
            p.name for p in rundir.run_dir(first).parent.iterdir() if p.name not in db_rows()
        )
        # Still locked: readers find the run from its directory.
        listed = {r["id"]: r["status"] for r in strict(gs("runs", "list", "--json").stdout)}
        assert listed[run_id] == "succeeded"
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    # Lock gone: the supervisor's retries write the row.
    wait_until(lambda: db_rows().get(run_id) == "succeeded", TIMEOUT, "the row after the lock")


def test_concurrent_runs_lose_no_row(runs_env: RunsEnv) -> None:
    runs_env["write_preset"]("ok", command_preset("ok", "train_ok", args="steps = 2"))
    procs = [
        subprocess.Popen(
            gpustation_cmd("run", "ok", "--detach"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for _ in range(5)
    ]
    ids = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        ids.append(out.strip())
    for run_id in ids:
        state = wait_for_end(rundir.run_dir(run_id), TIMEOUT)
        assert state is not None and state.status == "succeeded"
    wait_until(
        lambda: {i: db_rows().get(i) for i in ids} == dict.fromkeys(ids, "succeeded"),
        TIMEOUT,
        "every row",
    )


WRITER = """
import sys
from gpustation.runs.store.index import RunStore
from gpustation.runs.summary import RunSummary
store = RunStore()
for n in range(int(sys.argv[2])):
    store.upsert(RunSummary(id=f"{sys.argv[1]}-{n}", status="succeeded", started_at=n))
"""


def test_concurrent_writers_lose_no_row(runs_env: RunsEnv) -> None:
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, f"w{n}", "30"], env=child_env(), cwd=REPO)
        for n in range(6)
    ]
    for proc in writers:
        assert proc.wait(timeout=120) == 0
    assert len(db_rows()) == 6 * 30


# ---- 4. a stop asked for, the supervisor killed --------------------------------------


def test_a_stopped_run_whose_supervisor_was_killed_is_stopped_not_lost(
    runs_env: RunsEnv, tmp_path: Path
) -> None:
    runs_env["write_preset"]("wait", command_preset("wait", "wait_file", str(tmp_path / "never")))
    handle = launch(run_preset("wait"))
    state = rundir.read_state(handle.run_dir)
    assert state is not None and state.supervisor_pid and state.pgid
    rundir.request_stop(handle.run_dir, "user")
    rundir.note_stop_signal(handle.run_dir, "SIGINT")
    os.kill(state.supervisor_pid, signal.SIGKILL)
    os.killpg(state.pgid, signal.SIGKILL)
    wait_until(
        lambda: not rundir.process_matches(state.supervisor_pid, state.supervisor_create_time),
        TIMEOUT,
        "the supervisor to die",
    )
    wait_until(lambda: not rundir.group_members(state.pgid), TIMEOUT, "the child to die")
    checked = check_run(handle.run_dir)
    assert checked is not None and checked.status == "stopped"
    assert "stopped by user (SIGINT)" in (checked.reason or "")
    listed = strict(gs("runs", "list", "--json").stdout)
    assert [r["status"] for r in listed] == ["stopped"]
    assert "stopped" in gs("runs", "show", "last").stdout
    # The writer records it so.
    assert [s.status for s in record_lost_runs()] == ["stopped"]
    final = rundir.read_state(handle.run_dir)
    assert final is not None and final.status == "stopped"
    assert db_rows() == {handle.id: "stopped"}


# ---- 5. a library module as a runner -------------------------------------------------


@pytest.mark.parametrize("module", ["lib", "lib.common", "common"])
def test_a_library_module_is_refused_as_a_runner(runs_env: RunsEnv, module: str) -> None:
    path = runs_env["write_preset"](f"lib-{module}", f'runner = "{module}"\ngpus = 0\n')
    for argv in (("presets", "show", f"lib-{module}"), ("run", f"lib-{module}")):
        result = gs(*argv)
        assert result.returncode == 2, (argv, result.stdout, result.stderr)
        assert str(path) in result.stderr and "[runner]" in result.stderr
        assert "not a runner" in result.stderr or "no runner" in result.stderr, result.stderr
        assert "runners: batchsize" in result.stderr  # the runners there are, named
        assert "Traceback" not in result.stderr
    assert not (runs_env["dirs"]["data"] / "runs").exists()


# ---- 7. simulated runs say so --------------------------------------------------------


def test_simulated_runs_say_simulated_everywhere(runs_env: RunsEnv) -> None:
    from gpustation.tui.runs.model import RunView
    from gpustation.tui.runs.widgets import run_header

    runs_env["write_preset"]("ok", command_preset("ok", "train_ok", args="steps = 2"))
    handle = launch(run_preset("ok"))
    wait_for_end(handle.run_dir, TIMEOUT)
    for argv in (
        ("runs", "list"),
        ("runs", "show", "last"),
        ("runs", "compare", "last", handle.id),
    ):
        result = gs(*argv)
        assert result.returncode == 0, result.stderr
        assert "SIMULATED" in result.stdout, argv
    record = RunStore().get(handle.id)
    assert record is not None and record.simulated
    assert "SIMULATED" in run_header(RunView.of(record, time.time()), time.time()).plain


# ---- 8. two runs on one GPU ----------------------------------------------------------


def test_two_runs_on_one_gpu_warn_and_share_the_energy(runs_env: RunsEnv, tmp_path: Path) -> None:
    release = tmp_path / "release"
    runs_env["write_preset"]("wait", command_preset("wait", "wait_file", str(release)))
    first = gs("run", "wait", "--detach")
    assert first.returncode == 0 and "in use by run" not in first.stderr
    second = gs("run", "wait", "--detach")
    assert second.returncode == 0, second.stderr
    first_id, second_id = first.stdout.strip(), second.stdout.strip()
    assert f"GPU 0 is in use by run {first_id}" in second.stderr
    wait_until(
        lambda: (rundir.run_dir(second_id) / rundir.TELEMETRY_FILE).exists(), TIMEOUT, "samples"
    )
    release.touch()
    for run_id in (first_id, second_id):
        wait_for_end(rundir.run_dir(run_id), TIMEOUT)
    for run_id in (first_id, second_id):
        record = RunStore().get(run_id)
        assert record is not None and record.energy_j is not None and record.energy_shared
        assert "(shared)" in gs("runs", "show", run_id).stdout
    assert "(shared)" in gs("runs", "list").stdout
    # A run alone on its GPU is not marked.
    (tmp_path / "release").unlink()
    alone = gs("run", "wait", "--detach", "--gpus", "1").stdout.strip()
    release.touch()
    wait_for_end(rundir.run_dir(alone), TIMEOUT)
    record = RunStore().get(alone)
    assert record is not None and record.energy_shared is False


def test_a_log_line_too_long_keeps_its_end(tmp_path: Path) -> None:
    # A progress bar redraws with \r for hours without a newline: its last frame shows.
    from gpustation.runs.tail import Tailer

    path = tmp_path / "output.log"
    tailer = Tailer(path, keep_tail=True)
    with open(path, "wb") as fh:
        for n in range(40_000):
            fh.write(f"\r{n:>8} it/s {'#' * 40}".encode())
        fh.write(b"\rlast frame\ndone\n")
    lines = tailer.read_new()
    assert len(lines) == 2 and len(lines[0]) <= 1 << 20
    assert lines[0].endswith(b"\rlast frame") and lines[1] == b"done"
    assert tailer.offset == path.stat().st_size and tailer.skipped == 0


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "[1.0, nan]"])
def test_a_preset_with_a_non_finite_number_is_refused(runs_env: RunsEnv, value: str) -> None:
    from gpustation.runs.presets import load_preset_file

    path = runs_env["write_preset"]("nan", command_preset("nan", "train_ok", args=f"lr = {value}"))
    preset, problems = load_preset_file(path)
    assert preset is None
    assert [(p.key, "finite number" in p.message) for p in problems] == [("args.lr", True)]


def test_a_shared_gpu_s_energy_is_split_by_the_run_s_share(tmp_path: Path) -> None:
    from gpustation.runs.gputrace import run_share, summarize_telemetry
    from gpustation.telemetry.model import ProcessInfo

    procs = [ProcessInfo(pid=10, gpu_memory_mib=3000.0), ProcessInfo(pid=20, gpu_memory_mib=1000.0)]
    assert run_share(procs, {10}) == 0.75
    # the run's PIDs not listed beside others: 0 here, unknown where never seen
    assert run_share(procs, {99}) == 0.0 and run_share([], {10}) is None
    path = tmp_path / "telemetry.jsonl"
    rows = [
        {"t": 0, "gpus": [{"index": 0, "power_w": 100, "energy_j": 0.0, "run_share": 0.5}]},
        {"t": 10, "gpus": [{"index": 0, "power_w": 100, "energy_j": 1000.0, "run_share": 0.5}]},
        {"t": 20, "gpus": [{"index": 0, "power_w": 100, "energy_j": 2000.0, "run_share": 1.0}]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = summarize_telemetry(path)
    assert summary.split and summary.energy_j == pytest.approx(500.0 + 1000.0)
