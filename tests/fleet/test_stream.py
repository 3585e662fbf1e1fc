"""HostStream and Fleet rows, with local commands standing in for ssh."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpustation.fleet.fleet import (
    FLEET_SCHEMA,
    Fleet,
    fleet_document,
    row_cells,
    rows_from_states,
    sort_rows,
)
from gpustation.fleet.ssh import DOWN, GARBAGE, STOPPED, UP, HostState, HostStream
from gpustation.telemetry.model import GpuSample, ProcessInfo, Snapshot
from tests.conftest import child_env
from tests.fleet.conftest import SIM_STREAM

TIMEOUT = 60.0  # generous: a loaded 2-core machine starts Python slowly


def _sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def _snapshot_line(hostname: str = "remote", gpus: int = 2, t: float = 1000.0) -> str:
    snap = Snapshot(
        hostname=hostname,
        time=t,
        simulated=True,
        gpus=[GpuSample(index=i, name="Test GPU", temperature_c=40.0 + i) for i in range(gpus)],
    )
    return json.dumps(snap.to_dict())


@pytest.fixture
def streams() -> Iterator[list[HostStream]]:
    made: list[HostStream] = []
    yield made
    for s in made:
        s.close()


def _stream(streams: list[HostStream], argv: list[str], **kw: object) -> HostStream:
    s = HostStream("h", argv, **kw)  # type: ignore[arg-type]
    streams.append(s)
    return s.start()


def test_snapshots_stream_in(streams: list[HostStream], tmp_path: Path) -> None:
    env = child_env(GPUSTATION_SIMULATE="2", GPUSTATION_STATE_DIR=str(tmp_path))
    s = _stream(streams, SIM_STREAM, interval=0.3, env=env)
    first = s.wait(lambda st: st.state == UP, TIMEOUT)
    assert first.state == UP and first.snapshot is not None
    assert len(first.snapshot.gpus) == 2 and first.snapshot.simulated
    since = first.snapshot.time
    later = s.wait(lambda st: st.snapshot is not None and st.snapshot.time > since, TIMEOUT)
    assert later.snapshot is not None and later.snapshot.time > since


def test_garbage_is_reported_with_the_offending_text(streams: list[HostStream]) -> None:
    s = _stream(streams, _sh("while :; do echo 'Welcome to box1!'; sleep 0.2; done"))
    st = s.wait(lambda st: st.state == GARBAGE, TIMEOUT)
    assert st.state == GARBAGE
    assert st.error is not None
    assert "not JSON" in st.error and "Welcome to box1!" in st.error


def test_a_document_of_another_kind_is_garbage(streams: list[HostStream]) -> None:
    s = _stream(streams, _sh('echo \'{"schema": "other/1"}\'; sleep 30'))
    st = s.wait(lambda st: st.state == GARBAGE, TIMEOUT)
    assert st.error is not None and "gpustation.snapshot/1" in st.error


def test_good_line_after_garbage_recovers(streams: list[HostStream], tmp_path: Path) -> None:
    good = tmp_path / "snap.json"
    good.write_text(_snapshot_line() + "\n")
    s = _stream(streams, _sh(f"echo nonsense; sleep 0.5; cat {good}; sleep 30"))
    s.wait(lambda st: st.state == GARBAGE, TIMEOUT)
    st = s.wait(lambda st: st.state == UP, TIMEOUT)
    assert st.state == UP and st.error is None


def test_exit_is_down_with_stderr_then_retried_until_it_works(
    streams: list[HostStream], tmp_path: Path
) -> None:
    flag = tmp_path / "healthy"
    good = tmp_path / "snap.json"
    good.write_text(_snapshot_line() + "\n")
    script = (
        f"if [ -e {flag} ]; then cat {good}; sleep 30; fi; "
        "echo 'gpustation: command not found' >&2; exit 127"
    )
    s = _stream(streams, _sh(script), backoff_initial_s=0.1, backoff_max_s=0.2)
    st = s.wait(lambda st: st.state == DOWN, TIMEOUT)
    assert st.error == "gpustation: command not found"
    assert st.retry_at is not None
    row = rows_from_states([st], now=st.retry_at - 3)[0]
    assert row.gpu is None and row.status == "down"
    assert row.error == "gpustation: command not found (retry in 3s)"
    flag.touch()
    st = s.wait(lambda st: st.state == UP, TIMEOUT)
    assert st.state == UP and st.attempts >= 2


def test_backoff_doubles_up_to_the_maximum(streams: list[HostStream]) -> None:
    delays: list[float] = []

    def record(stream: HostStream, st: HostState) -> None:
        if st.state == DOWN and st.retry_at is not None and len(delays) < 5:
            delays.append(st.retry_at - time.time())

    s = _stream(streams, _sh("exit 1"), backoff_initial_s=0.2, backoff_max_s=0.8, on_update=record)
    deadline = time.monotonic() + TIMEOUT
    while len(delays) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    s.close()
    assert len(delays) == 5
    for got, want in zip(delays, [0.2, 0.4, 0.8, 0.8, 0.8], strict=True):
        assert want - 0.15 < got <= want + 0.01


def test_without_retry_one_failure_ends_the_stream(streams: list[HostStream]) -> None:
    s = _stream(
        streams, _sh("echo 'ssh: Could not resolve hostname nowhere' >&2; exit 255"), retry=False
    )
    st = s.wait(lambda st: st.state == DOWN, TIMEOUT)
    assert st.error == "ssh: Could not resolve hostname nowhere"
    assert st.retry_at is None


def test_close_ends_the_child(streams: list[HostStream], tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    good = tmp_path / "snap.json"
    good.write_text(_snapshot_line() + "\n")
    s = _stream(streams, _sh(f"echo $$ > {pid_file}; cat {good}; exec sleep 60"))
    s.wait(lambda st: st.state == UP, TIMEOUT)
    pid = int(pid_file.read_text())
    os.kill(pid, 0)  # alive while streaming
    s.close()
    assert s.state().state == STOPPED
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"child {pid} still running after close()")


def test_missing_program_is_reported() -> None:
    s = HostStream("h", ["/nonexistent/ssh"], retry=False).start()
    try:
        st = s.wait(lambda st: st.state == DOWN, TIMEOUT)
        assert st.error is not None and "cannot run /nonexistent/ssh" in st.error
    finally:
        s.close()


# ---- rows, sorting and the JSON document (pure) -----------------------------------


def _up(name: str, snap: Snapshot, received: float = 100.0, interval: float = 1.0) -> HostState:
    return HostState(name, UP, snap, None, received, received, None, 1, interval)


def test_rows_one_per_gpu_and_stale_after_three_intervals() -> None:
    snap = Snapshot.from_dict(json.loads(_snapshot_line(gpus=3)))
    st = _up("box1", snap, received=100.0)
    rows = rows_from_states([st], now=101.0)
    assert [r.key for r in rows] == ["box1#0", "box1#1", "box1#2"]
    assert {r.status for r in rows} == {"up"}
    assert {r.status for r in rows_from_states([st], now=112.0)} == {"stale 12s"}


def test_down_host_keeps_one_error_row_among_the_others() -> None:
    snap = Snapshot.from_dict(json.loads(_snapshot_line(gpus=1)))
    down = HostState("box2", DOWN, snap, "ssh: connect to host box2 port 22: Connection refused",
                     None, None, 104.0, 3, 1.0)  # fmt: skip
    rows = rows_from_states([_up("box1", snap), down], now=100.0)
    assert [r.key for r in rows] == ["box1#0", "box2#-"]
    cells = row_cells(rows[1])
    assert cells["status"] == "down"
    assert cells["run"] == "ssh: connect to host box2 port 22: Connection refused (retry in 4s)"


def test_sort_puts_missing_values_last_both_ways() -> None:
    gpus = [
        GpuSample(index=0, temperature_c=50.0),
        GpuSample(index=1, temperature_c=None),
        GpuSample(index=2, temperature_c=80.0),
    ]
    snap = Snapshot(hostname="x", time=1.0, gpus=gpus)
    down = HostState("b", DOWN, None, "gone", None, None, None, 1, 1.0)
    rows = rows_from_states([_up("a", snap), down], now=100.5)
    assert [r.key for r in sort_rows(rows, "temp")] == ["a#0", "a#2", "a#1", "b#-"]
    assert [r.key for r in sort_rows(rows, "temp", descending=True)] == ["a#2", "a#0", "a#1", "b#-"]
    assert sort_rows(rows, "host", descending=True)[0].key == "b#-"


def test_run_column_names_the_biggest_process() -> None:
    gpu = GpuSample(
        index=0,
        processes=[
            ProcessInfo(pid=1, gpu_memory_mib=100, name="python", command="python small.py"),
            ProcessInfo(pid=2, gpu_memory_mib=9000, name="python", command="python train.py"),
        ],
    )
    rows = rows_from_states([_up("a", Snapshot(hostname="a", time=1.0, gpus=[gpu]))], now=100.0)
    assert row_cells(rows[0])["run"] == "python train.py (+1)"


def test_fleet_document_shape() -> None:
    snap = Snapshot.from_dict(json.loads(_snapshot_line(gpus=1)))
    down = HostState("b", DOWN, None, "ssh: timed out", None, None, None, 1, 1.0)
    doc = fleet_document([_up("a", snap), down])
    assert doc["schema"] == FLEET_SCHEMA
    assert doc["hosts"][0]["host"] == "a" and doc["hosts"][0]["ok"] is True
    assert Snapshot.from_dict(doc["hosts"][0]["snapshot"]).gpus[0].temperature_c == 40.0
    assert doc["hosts"][1] == {"host": "b", "ok": False, "error": "ssh: timed out"}


def test_fleet_with_local_commands_reads_every_host(tmp_path: Path) -> None:
    def argv_for(host: str) -> list[str]:
        if host == "broken":
            return _sh("echo 'ssh: connect to host broken: No route to host' >&2; exit 255")
        return [
            sys.executable,
            "-c",
            f"print({_snapshot_line(hostname=host)!r}); import time; time.sleep(30)",
        ]

    fleet = Fleet(["a", "broken", "c", "a"], interval=0.5, argv_for=argv_for, retry=False)
    with fleet:
        states = fleet.wait_first(TIMEOUT)
    assert [s.name for s in states] == ["a", "broken", "c"]
    assert [s.state for s in fleet.states()] == [STOPPED] * 3
    rows = rows_from_states(states)
    assert [r.key for r in rows] == ["a#0", "a#1", "broken#-", "c#0", "c#1"]
    assert rows[2].error == "ssh: connect to host broken: No route to host"
