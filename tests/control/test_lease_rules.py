"""Power-limit leases, in-process: who holds which GPU (by UUID, by index only where
neither side has one), what a lease file must hold, and what a gone owner left."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from gpustation import procstart
from gpustation.control import lease
from gpustation.errors import GpustationError


def _gone_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_process_start_tells_a_live_process_from_a_gone_or_reused_pid() -> None:
    me = procstart.process_start(os.getpid())
    assert me is not None
    ticks, _, boot = me.partition("@")
    assert ticks.isdigit() and len(boot) == 8, me  # clock ticks since boot, and the boot
    assert procstart.process_start(os.getpid()) == me
    assert procstart.process_start(0) is None and procstart.process_start(-1) is None
    gone = _gone_pid()
    assert procstart.process_start(gone) is None
    assert procstart.process_matches(os.getpid(), me)
    assert procstart.process_matches(os.getpid(), None)
    assert not procstart.process_matches(os.getpid(), f"{int(ticks) + 1}@{boot}")
    # the same ticks in another boot are another process
    assert not procstart.process_matches(os.getpid(), f"{ticks}@00000000")
    # a token kept before the boot was part of it: the ticks alone
    assert procstart.process_matches(os.getpid(), ticks)
    assert not procstart.process_matches(os.getpid(), str(int(ticks) + 1))
    assert not procstart.process_matches(gone, None)


def test_a_zombie_has_no_start() -> None:
    child = subprocess.Popen(["true"])
    # Not waited for: it stays a zombie until reaped.
    deadline = time.monotonic() + 30
    while procstart.process_start(child.pid) is not None:
        assert time.monotonic() < deadline, "the child never ended"
        time.sleep(0.01)
    assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
    child.wait()


def test_a_lease_covers_a_gpu_by_uuid_and_by_index_only_without_one() -> None:
    held = lease.Lease("a", "sweep a", [(0, "GPU-x"), (1, None)], simulated=True)
    assert held.covers(5, "GPU-x")  # the card moved to another index: still this one
    assert not held.covers(0, "GPU-y")  # another card at index 0
    assert held.covers(1, None) and held.covers(1, "GPU-z")  # the lease has no UUID for 1
    assert held.covers(0, None)  # the asker has none: by index
    assert not held.covers(2, None)
    assert held.describe() == f"sweep a (pid {os.getpid()}, on GPU 0, 1)"
    assert held.alive and held.start == procstart.process_start(os.getpid())


def test_a_lease_file_round_trips_and_a_damaged_one_is_refused() -> None:
    held = lease.Lease(
        "a",
        "sweep a",
        [(0, "GPU-x")],
        True,
        "gpustation sweeps restore a",
        pid=123,
        start="99",
        created_at=5.0,
    )
    doc = held.to_dict()
    assert doc == {
        "id": "a",
        "owner": "sweep a",
        "gpus": [{"index": 0, "uuid": "GPU-x"}],
        "simulated": True,
        "restore": "gpustation sweeps restore a",
        "pid": 123,
        "start": "99",
        "created_at": 5.0,
    }
    back = lease.Lease.from_dict(doc)
    assert back.to_dict() == doc
    nameless = lease.Lease.from_dict({**doc, "start": None, "restore": None, "created_at": None})
    assert nameless.start == "" and nameless.restore == "" and nameless.created_at == 0.0
    assert not nameless.alive  # no start time: nobody's
    for bad, says in (
        ([], "not a JSON object"),
        ({**doc, "gpus": [{"index": "0"}]}, "a GPU of the wrong type"),
        ({**doc, "gpus": [{"index": True}]}, "a GPU of the wrong type"),
        ({**doc, "gpus": [{"index": 0, "uuid": 3}]}, "a GPU of the wrong type"),
        ({k: v for k, v in doc.items() if k != "pid"}, "missing or wrong field ('pid')"),
        ({**doc, "gpus": [3]}, "missing or wrong field"),
    ):
        with pytest.raises(ValueError) as err:
            lease.Lease.from_dict(bad)
        assert str(err.value).startswith(says)


def test_taking_a_lease_is_refused_while_a_live_owner_holds_the_gpu(
    gpustation_dirs: dict[str, Path],
) -> None:
    mine = lease.Lease("sweep/1", "sweep 1", [(0, "GPU-x")], simulated=True)
    lease.take(mine)
    assert lease._path("sweep/1").name == "sweep_1.json"
    assert lease.get("sweep/1") is not None
    lease.take(mine)  # its own lease again: taken
    other = lease.Lease("2", "sweep 2", [(3, "GPU-x")], simulated=True)
    with pytest.raises(lease.LeaseHeld) as err:
        lease.take(other)
    assert str(err.value) == (
        f"sweep 2's lease is refused: sweep 1 (pid {os.getpid()}, on GPU 0) owns these GPUs' "
        "power limits now; wait for it to end or stop it (`sweep --force` and `power set "
        "--force` end it first, and it puts its limits back). Nothing was changed."
    )
    assert err.value.holders[0].id == "sweep/1"
    real = lease.Lease("3", "sweep 3", [(0, "GPU-x")], simulated=False)
    lease.take(real)  # the simulated cards are other cards
    with pytest.raises(lease.LeaseHeld, match=r"^the power limit is refused: sweep 1"):
        lease.check_free([(0, "GPU-x")], True, owner=None)
    lease.check_free([(0, "GPU-x")], True, owner="sweep/1")
    lease.release("sweep/1")
    lease.release("sweep/1")  # none: nothing to do
    assert lease.get("sweep/1") is None
    lease.take(other)


def test_what_a_gone_owner_left_is_a_leftover_oldest_first(
    gpustation_dirs: dict[str, Path],
) -> None:
    gone = _gone_pid()
    for lease_id, created, restore in (("b", 20.0, "gpustation sweeps restore b"), ("a", 10.0, "")):
        lease.take(
            lease.Lease(
                lease_id,
                f"sweep {lease_id}",
                [(0, f"GPU-{lease_id}")],
                True,
                restore,
                pid=gone,
                start="1",
                created_at=created,
            )
        )
    lease.take(lease.Lease("live", "sweep live", [(1, "GPU-live")], True))
    (lease.lease_dir() / "junk.json").write_text("{")
    (lease.lease_dir() / "notes.txt").write_text(json.dumps(lease.get("a").to_dict()))  # type: ignore[union-attr]
    assert [x.id for x in lease.leftovers(True)] == ["a", "b"]
    assert lease.leftovers(False) == []
    assert sorted(x.id for x in lease.read_leases()) == ["a", "b", "live"]
    assert [x.id for x in lease.holders([(0, "GPU-a"), (1, "GPU-live")], True)] == ["live"]
    assert lease.holders([(1, "GPU-live")], True, but="live") == []
    assert lease.left_notes([(0, "GPU-b"), (1, "GPU-a"), (2, None), (3, "GPU-live")], True) == {
        0: "limit left by sweep b; `gpustation sweeps restore b`",
        1: "limit left by sweep a",
    }
    assert lease.left_notes([(0, "GPU-b")], False) == {}


def test_ending_holders_waits_for_them_to_let_go(gpustation_dirs: dict[str, Path]) -> None:
    child = subprocess.Popen(["sleep", "30"])
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 30 & wait"])
    try:
        held = lease.Lease("h", "sweep h", [(0, "GPU-h")], True, pid=child.pid)
        lease.take(held)
        lease.end_holders([held], timeout_s=30.0)
        assert child.wait(timeout=30) == -signal.SIGTERM  # it was asked to end
        kept = lease.Lease("x", "sweep x", [(1, "GPU-x")], True, pid=stubborn.pid)
        lease.take(kept)
        began = time.monotonic()
        with pytest.raises(GpustationError) as err:
            lease.end_holders([kept], timeout_s=0.3)
        assert time.monotonic() - began >= 0.3
        assert str(err.value) == (
            f"sweep x (pid {stubborn.pid}) did not end within 0.3 s; nothing was changed."
        )
        lease.release("x")
        lease.end_holders([kept], timeout_s=0.3)  # its lease is gone: it let go
    finally:
        for proc in (child, stubborn):
            proc.kill()
            proc.wait()


def test_a_start_token_is_the_kernel_s_start_time_whatever_the_process_is_called(
    tmp_path: Path,
) -> None:
    sleep = shutil.which("sleep")
    assert sleep is not None
    # A name with spaces, a closing parenthesis and letters outside ASCII.
    named = tmp_path / "a) b ü"
    shutil.copy(sleep, named)
    child = subprocess.Popen([str(named), "30"])
    try:
        proc = psutil.Process(child.pid)
        deadline = time.monotonic() + 30
        while proc.name() != "a) b ü":  # until it has exec'd
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.01)
        token = procstart.process_start(child.pid)
        assert token is not None
        started = int(token.split("@")[0]) / os.sysconf("SC_CLK_TCK") + psutil.boot_time()
        assert abs(started - proc.create_time()) < 0.05
    finally:
        child.kill()
        child.wait()
    assert procstart.process_start(1) is not None  # init is a process like any other


def test_a_lease_made_now_is_dated_now_and_restores_nothing_unless_told() -> None:
    before = time.time()
    made = lease.Lease("a", "sweep a", [(0, "GPU-x")], simulated=True)
    assert before <= made.created_at <= time.time()
    assert made.restore == "" and made.to_dict()["restore"] == ""


def test_a_refusal_names_every_holder() -> None:
    held = [
        lease.Lease("a", "sweep a", [(0, "GPU-x")], True, pid=11, start="1"),
        lease.Lease("b", "sweep b", [(1, "GPU-y"), (2, None)], True, pid=12, start="1"),
    ]
    assert str(lease.LeaseHeld(held)) == (
        "the power limit is refused: sweep a (pid 11, on GPU 0); sweep b (pid 12, on GPU 1, 2) "
        "owns these GPUs' power limits now; wait for it to end or stop it (`sweep --force` and "
        "`power set --force` end it first, and it puts its limits back). Nothing was changed."
    )


def test_a_lease_without_uuids_is_held_by_index(gpustation_dirs: dict[str, Path]) -> None:
    lease.take(lease.Lease("n", "sweep n", [(1, None)], simulated=True))
    assert [x.id for x in lease.holders([(1, None)], True)] == ["n"]
    assert lease.holders([(0, None)], True) == []


def test_every_lease_file_is_read_past_other_files_and_none_past_64_kib(
    gpustation_dirs: dict[str, Path],
) -> None:
    lease.take(lease.Lease("b", "sweep b", [(0, "GPU-b")], simulated=True))
    (lease.lease_dir() / "a-readme.txt").write_text("not a lease")
    doc = lease.Lease("c", "sweep c", [(1, "GPU-c")], simulated=True).to_dict()
    short = len(json.dumps(doc))
    # A lease whose owner runs past the 64 KiB a lease may take: not read.
    doc["owner"] += "c" * (64 * 1024 + 10 - short)
    (lease.lease_dir() / "c.json").write_text(json.dumps(doc))
    assert (lease.lease_dir() / "c.json").stat().st_size == 64 * 1024 + 10
    assert [x.id for x in lease.read_leases()] == ["b"]
    assert lease.get("c") is None and lease.get("b") is not None


def test_a_lease_that_cannot_be_written_is_named_and_leaves_nothing_behind(
    gpustation_dirs: dict[str, Path],
) -> None:
    target = lease.lease_dir() / "x.json"
    target.mkdir(parents=True)
    (target / "keep").write_text("")  # a directory where the lease would go
    with pytest.raises(GpustationError) as raised:
        lease.take(lease.Lease("x", "sweep x", [(0, "GPU-x")], simulated=True))
    assert str(raised.value) == (
        f"cannot write the lease {target}: Is a directory; nothing was changed. "
        "Check that the state directory is writable (or set GPUSTATION_STATE_DIR)."
    )
    assert sorted(p.name for p in lease.lease_dir().iterdir()) == ["x.json"]
