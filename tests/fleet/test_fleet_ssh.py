"""The fleet over a real sshd on loopback, running the checked-out gpustation remotely."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from typing import Any

import psutil
import pytest

from gpustation.errors import EXIT_UNREACHABLE
from gpustation.fleet.fleet import FLEET_SCHEMA, Fleet, rows_from_states
from gpustation.fleet.ssh import DOWN, GARBAGE, UP, HostStream, _parse_line, ssh_argv
from gpustation.telemetry.model import Snapshot
from tests.conftest import child_env, gpustation_cmd
from tests.fleet.sshd import LoopbackSshd, free_port

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(240)]
TIMEOUT = 90.0  # ssh + Python start-up on a loaded 2-core machine


def _fleet(hosts: list[str], **kw: object) -> Fleet:
    kw.setdefault("interval", 0.5)
    kw.setdefault("backoff_initial_s", 0.3)
    kw.setdefault("backoff_max_s", 1.0)
    return Fleet(hosts, **kw)  # type: ignore[arg-type]


def test_rows_arrive_from_two_hosts(ssh_env: LoopbackSshd) -> None:
    with _fleet(["box1", "box2"]) as fleet:
        for host in fleet.hosts:
            st = fleet.streams[host].wait(lambda s: s.state == UP, TIMEOUT)
            assert st.state == UP, st.error
        rows = fleet.rows()
    assert [r.key for r in rows] == ["box1#0", "box1#1", "box2#0", "box2#1"]
    assert all(r.simulated and r.status == "up" for r in rows)
    # each fake host ran in its own state directory, from its own ssh session
    assert (ssh_env.host_dir("box1") / "state" / "sim-last.json").exists()
    assert (ssh_env.host_dir("box2") / "state" / "sim-last.json").exists()


def test_host_that_dies_mid_stream_is_down_then_comes_back(ssh_env: LoopbackSshd) -> None:
    with _fleet(["box3", "box4"]) as fleet:
        box3, box4 = fleet.streams["box3"], fleet.streams["box4"]
        assert box3.wait(lambda s: s.state == UP, TIMEOUT).state == UP
        assert box4.wait(lambda s: s.state == UP, TIMEOUT).state == UP
        ssh_env.kill_remote("box3")
        down = box3.wait(lambda s: s.state == DOWN, TIMEOUT)
        assert down.state == DOWN
        row = next(r for r in fleet.rows() if r.host == "box3")
        assert row.gpu is None and row.status in ("down", "connecting")
        # the other host keeps updating meanwhile
        seen = box4.state().received_at
        assert box4.wait(lambda s: (s.received_at or 0) > (seen or 0), TIMEOUT).state == UP
        back = box3.wait(
            lambda s: s.state == UP and (s.received_at or 0) > time.time() - 5, TIMEOUT
        )
        assert back.state == UP and back.attempts >= 2
        assert [r.key for r in fleet.rows()] == ["box3#0", "box3#1", "box4#0", "box4#1"]


def test_garbage_stream_is_reported_in_its_row(ssh_env: LoopbackSshd) -> None:
    ssh_env.set_mode("box5", "garbage")
    with _fleet(["box5", "box6"]) as fleet:
        st = fleet.streams["box5"].wait(lambda s: s.state == GARBAGE, TIMEOUT)
        assert fleet.streams["box6"].wait(lambda s: s.state == UP, TIMEOUT).state == UP
        rows = {r.host: r for r in fleet.rows()}
    assert st.state == GARBAGE
    assert rows["box5"].status == "garbage"
    assert "not JSON" in (rows["box5"].error or "")
    assert "this is not a snapshot" in (rows["box5"].error or "")


def test_remote_error_text_reaches_the_row(ssh_env: LoopbackSshd) -> None:
    ssh_env.set_mode("box7", "fail")
    with _fleet(["box7"], retry=False) as fleet:
        st = fleet.streams["box7"].wait(lambda s: s.state == DOWN, TIMEOUT)
    assert st.error == "gpustation: cannot start on box7 (test failure)"


def _snapshot_cli(ssh_env: LoopbackSshd, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpustation_cmd("snapshot", *args),
        env=child_env(**ssh_env.env()),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def test_snapshot_host_json_document_and_exit_6_when_one_is_unreachable(
    ssh_env: LoopbackSshd,
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    direct = f"{ssh_env.user}@127.0.0.1:{ssh_env.port}"  # user@host:port, no alias
    proc = _snapshot_cli(ssh_env, "--json", "--host", "box1", "--host", dead, "--host", direct)
    assert proc.returncode == EXIT_UNREACHABLE, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == FLEET_SCHEMA
    assert [h["host"] for h in doc["hosts"]] == ["box1", dead, direct]
    assert [h["ok"] for h in doc["hosts"]] == [True, False, True]
    assert "Connection refused" in doc["hosts"][1]["error"]
    for entry in (doc["hosts"][0], doc["hosts"][2]):
        snap = Snapshot.from_dict(entry["snapshot"])
        assert snap.simulated and len(snap.gpus) == 2


def test_snapshot_host_table_and_exit_0_when_all_answer(ssh_env: LoopbackSshd) -> None:
    proc = _snapshot_cli(ssh_env, "--host", "box1", "--host", "box2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("fleet: 2/2 hosts up, 4 GPUs")
    assert lines[1].split()[:3] == ["Host", "Status", "GPU"]
    assert [line.split()[0] for line in lines[2:6]] == ["box1", "box1", "box2", "box2"]


def test_snapshot_host_watch_streams_fleet_documents(ssh_env: LoopbackSshd) -> None:
    proc = subprocess.Popen(
        gpustation_cmd("snapshot", "--json", "--watch", "0.5", "--host", "box8"),
        env=child_env(**ssh_env.env()),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        docs: list[dict[str, Any]] = []
        deadline = time.monotonic() + TIMEOUT
        while len(docs) < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            docs.append(json.loads(line))
        assert len(docs) == 3
        assert all(d["schema"] == FLEET_SCHEMA for d in docs)
        assert docs[-1]["hosts"][0]["ok"] is True
        children = psutil.Process(proc.pid).children(recursive=True)
        assert any(c.name() == "ssh" for c in children)
        proc.terminate()  # a stop asked for: exit 0, ssh children closed
        assert proc.wait(timeout=30) == 0
        _, alive = psutil.wait_procs(children, timeout=10)
        assert alive == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_a_host_that_trickles_is_restarted_with_a_message(ssh_env: LoopbackSshd) -> None:
    ssh_env.set_mode("box8", "trickle")  # a byte a second, never a whole line
    stream = HostStream("box8", ssh_argv("box8", 0.5), interval=0.5, retry=False, silence_s=4)
    began = time.monotonic()
    with contextlib.closing(stream.start()):
        st = stream.wait(lambda s: s.state == DOWN, TIMEOUT)
    assert st.state == DOWN, st
    assert st.error == "no complete snapshot for 4 s; reconnecting"
    assert 4 <= time.monotonic() - began < TIMEOUT
    row = rows_from_states([st])[0]
    assert row.host == "box8" and "no complete snapshot" in (row.error or "")


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"[" * 100_000, "garbage: nested deeper than 64 levels: '[[["),
        (b'{"schema": "gpustation.snapshot/1", "time": 1e400, "gpus": []}', "garbage: "),
        (b'{"schema": "gpustation.snapshot/1", "gpus": {"a": 1}}', "garbage: "),
        (b"\x1b]52;c;aGk=\x07 not json", "garbage: not JSON"),
    ],
)
def test_a_bad_line_is_a_message_not_an_exception(line: bytes, says: str) -> None:
    snap, problem = _parse_line(line)
    assert snap is None and problem.startswith(says), problem
    assert "\x1b" not in problem


def test_a_non_finite_value_reads_as_missing() -> None:
    doc = Snapshot(hostname="box", time=1.0, gpus=[]).to_dict()
    doc["gpus"] = [{"index": 0, "temperature_c": 1}]
    line = json.dumps(doc).replace('"temperature_c": 1', '"temperature_c": 1e999').encode()
    snap, problem = _parse_line(line)
    assert snap is not None, problem
    assert snap.gpus[0].temperature_c is None


def test_the_fleet_screen_quits_promptly_while_a_host_trickles(ssh_env: LoopbackSshd) -> None:
    ssh_env.set_mode("box8", "trickle")
    asyncio.run(_quit_while_trickling(ssh_env))


async def _quit_while_trickling(ssh_env: LoopbackSshd) -> None:
    from gpustation.tui.fleet.screen import FleetApp

    fleet = _fleet(["box8", "box1"])
    app = FleetApp([], fleet=fleet)
    async with app.run_test(size=(120, 30)) as pilot:
        deadline = time.monotonic() + TIMEOUT
        # box1 answering shows the screen is live; box8 has started its trickle by then
        while fleet.state("box1").state != UP and time.monotonic() < deadline:
            await pilot.pause(0.1)
        assert fleet.state("box1").state == UP and fleet.state("box8").snapshot is None
        began = time.monotonic()
        await pilot.press("q")
    took = time.monotonic() - began
    assert took < 5.0, f"quitting took {took:.1f} s while a host trickled"
    assert all(not s._thread or not s._thread.is_alive() for s in fleet.streams.values())
