"""The control journal's rules, in-process: an intent line, then its outcome; a
change whose outcome never came is unknown; bad lines are named and skipped; the
profile in force and the values as people read them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpustation.control import journal
from gpustation.errors import GpustationError


def _record(path: Path, **more: object) -> journal.JournalEntry:
    args: dict[str, Any] = {
        "gpu": 0,
        "uuid": "GPU-a",
        "what": journal.POWER_LIMIT,
        "previous": 450.0,
        "new": 300.0,
        "command": "gpustation power set 300W",
        "path": path,
    }
    args.update(more)
    return journal.record(**args)


def test_a_change_is_an_intent_then_its_outcome(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    entry = _record(path, fan=None, simulated=True)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == 1 and "outcome" not in lines[0] and "read_back" not in lines[0]
    assert lines[0]["pid"] == os.getpid() and lines[0]["host"] == socket.gethostname()
    assert len(lines[0]["id"]) == 16 and lines[0]["simulated"] is True
    (read,) = journal.read_journal(path).entries
    assert read.outcome == journal.UNKNOWN  # killed before its read-back: unknown
    assert (read.previous, read.new, read.command) == (450.0, 300.0, "gpustation power set 300W")
    journal.settle(entry, journal.MADE, read_back=300.0, path=path)
    assert (entry.outcome, entry.read_back, entry.error) == (journal.MADE, 300.0, None)
    outcome = json.loads(path.read_text().splitlines()[1])
    assert set(outcome) == {"id", "outcome", "time", "read_back"} and outcome["id"] == entry.id
    (read,) = journal.read_journal(path).entries
    assert (read.outcome, read.read_back, read.error) == (journal.MADE, 300.0, None)
    refused = _record(path)
    journal.settle(refused, journal.REFUSED, error="Insufficient Permissions", path=path)
    assert "read_back" not in json.loads(path.read_text().splitlines()[-1])
    entries = journal.read_journal(path).entries
    assert [(e.outcome, e.error) for e in entries] == [
        (journal.MADE, None),
        (journal.REFUSED, "Insufficient Permissions"),
    ]
    assert list(journal.read_entries(path)) == entries


def test_an_outcome_that_cannot_be_written_leaves_the_change_unknown(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    entry = _record(path)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    journal.settle(entry, journal.MADE, read_back=300.0, path=blocked / "journal.jsonl")
    assert entry.outcome == journal.MADE  # said to the caller; never raised
    assert journal.read_journal(path).entries[0].outcome == journal.UNKNOWN
    with pytest.raises(GpustationError, match="cannot write the control journal"):
        journal._append(blocked / "journal.jsonl", {"x": 1})


def test_bad_lines_are_named_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    good = _record(path)
    with open(path, "ab") as f:
        f.write(b"\n[1, 2]\n{not json\n\xff\xfe\n")
        f.write(json.dumps({"id": "nope", "outcome": "made"}).encode() + b"\n")
        f.write(b"[" * 100_000 + b"\n")
        f.write(json.dumps({"id": good.id, "outcome": None, "error": 5}).encode() + b"\n")
    read = journal.read_journal(path)
    assert [e.id for e in read.entries] == [good.id]
    assert (read.entries[0].outcome, read.entries[0].error) == (journal.UNKNOWN, "5")
    assert read.problems[:3] == [
        "line 3: a JSON list, not an object",
        "line 4: not JSON (Expecting property name enclosed in double quotes)",
        "line 5: not text (binary data)",
    ]
    assert read.problems[3] == "line 6: an outcome for unknown change 'nope'"
    assert read.problems[4] in ("line 7: nested too deeply", "line 7: not JSON (Expecting value)")
    assert len(read.problems) == 5
    assert journal.read_journal(tmp_path / "none.jsonl").entries == []
    assert journal.read_journal(tmp_path).problems[0].startswith(f"cannot read {tmp_path}: ")


def test_a_torn_last_line_is_ended_before_the_next_entry(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b'{"torn')
    entry = _record(path)
    assert path.read_bytes().startswith(b'{"torn\n{')
    assert [e.id for e in journal.read_journal(path).entries] == [entry.id]


def test_the_lock_is_reentrant_and_another_holder_times_out(tmp_path: Path) -> None:
    lock = tmp_path / "control.lock"
    with journal.control_lock(lock), journal.control_lock(lock):
        pass
    held = threading.Event()
    done = threading.Event()
    errors: list[str] = []

    def other_process_like() -> None:
        # Another open file description: flock treats it as another holder.
        import fcntl

        fd = os.open(lock, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.set()
        done.wait(30)
        os.close(fd)

    t = threading.Thread(target=other_process_like)
    t.start()
    try:
        assert held.wait(30)
        with pytest.raises(GpustationError) as err, journal.control_lock(lock, timeout_s=0.2):
            errors.append("taken")
        assert str(err.value) == (
            f"another gpustation process has held {lock} for 0.2 s; nothing was changed."
        )
    finally:
        done.set()
        t.join()
    assert errors == []
    with journal.control_lock(lock, timeout_s=5):
        pass
    blocked = tmp_path / "file"
    blocked.write_text("")
    with (
        pytest.raises(GpustationError, match="cannot open the control lock"),
        journal.control_lock(blocked / "control.lock"),
    ):
        pass


def test_values_as_people_read_them() -> None:
    d = journal.describe_value
    assert d(journal.POWER_LIMIT, 300.0) == "300 W"
    assert d(journal.POWER_LIMIT, None) == "n/a"
    assert d(journal.FAN_AUTO, {"mode": "auto", "pct": 40.0}) == "auto (40 %)"
    assert d(journal.FAN_AUTO, {"mode": "auto", "pct": None}) == "auto"
    assert d(journal.FAN_AUTO, {"mode": "manual", "pct": 70}) == "70 %"
    assert d(journal.FAN_AUTO, {"mode": "manual"}) == "manual"
    assert d("fan_speed", 55) == "55 %"
    assert d("fan_speed", "odd") == "odd"


def test_the_profile_in_force_is_the_latest_change_s(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    assert journal.active_profile(path) is None
    first = _record(path, command="gpustation profile apply quiet --gpus 0")
    assert journal.active_profile(path) == "quiet"
    journal.settle(first, journal.MADE, read_back=300.0, path=path)
    with open(path, "a") as f:
        f.write("garbage\n[3]\n")
    assert journal.active_profile(path) == "quiet"  # outcome and junk lines are passed over
    _record(path, command="gpustation power set 250W")
    assert journal.active_profile(path) is None  # a manual change: no profile is
    with open(path, "a") as f:
        f.write(json.dumps({"what": "power_limit", "profile": "balanced", "command": "x"}) + "\n")
    assert journal.active_profile(path) == "balanced"


def test_a_line_of_the_wrong_shape_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    good = {"time": 1.0, "gpu": 0, "what": journal.POWER_LIMIT, "new": 300}
    lines = [
        {**good, "gpu": "0"},
        {**good, "time": True},
        {k: v for k, v in good.items() if k != "what"} | {"id": 5},
        {**good, "fan": "0"},
        {**good, "command": ["power", "set"]},
    ]
    path.write_text("".join(json.dumps(doc) + "\n" for doc in lines))
    assert journal.read_journal(path).problems == [
        "line 1: 'gpu' is missing or not a GPU index",
        "line 2: 'time' is missing or not a number",
        "line 3: 'what' is missing or not text",
        "line 4: 'fan' is not a fan index",
        "line 5: 'command' is not text",
    ]


def test_an_entry_without_an_id_was_made_and_one_with_an_id_waits_for_its_outcome(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.jsonl"
    base = {"time": 1.0, "gpu": 0, "what": journal.POWER_LIMIT, "new": 300}
    docs = [base, {**base, "id": "abc"}, {**base, "id": "def", "outcome": journal.REFUSED}]
    path.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    # An entry without an id is from before outcome lines: it was made.
    assert [e.outcome for e in journal.read_journal(path).entries] == [
        journal.MADE,
        journal.UNKNOWN,
        journal.REFUSED,
    ]


def test_a_value_json_cannot_hold_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    _record(path)
    before = path.read_bytes()
    with pytest.raises(ValueError):
        _record(path, new=float("nan"))
    assert path.read_bytes() == before


def test_the_journal_is_private_and_an_unwritable_one_is_named(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    entry = _record(path)
    assert entry.simulated is False  # a real card's change unless said otherwise
    assert path.stat().st_mode & 0o777 == 0o600
    blocked = tmp_path / "blocked.jsonl"
    blocked.mkdir()
    with pytest.raises(GpustationError) as raised:
        _record(blocked)
    assert str(raised.value) == (
        f"cannot write the control journal {blocked}: Is a directory; nothing was changed. "
        "Check that the state directory is writable and has free space "
        "(or set GPUSTATION_STATE_DIR)."
    )


def test_a_journal_elsewhere_has_its_lock_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere" / "journal.jsonl"
    entry = _record(path)
    assert (path.parent / journal.LOCK_NAME).exists()
    (path.parent / journal.LOCK_NAME).unlink()
    journal.settle(entry, journal.MADE, read_back=300.0, path=path)
    assert (path.parent / journal.LOCK_NAME).exists()
    assert not journal.journal_path().with_name(journal.LOCK_NAME).exists()


def test_a_journal_that_cannot_be_read_says_why(tmp_path: Path) -> None:
    assert journal.read_journal(tmp_path).problems == [f"cannot read {tmp_path}: Is a directory"]


def test_the_profile_in_force_is_found_past_lines_that_are_not_text(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    _record(path, command="gpustation profile apply quiet")
    with open(path, "ab") as f:
        f.write(b"\xff\xfe not text \xff\n")
    assert journal.active_profile(path) == "quiet"


def test_a_line_with_only_the_required_fields_is_an_entry(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text(json.dumps({"time": 1.0, "gpu": 2, "what": journal.FAN_AUTO}) + "\n")
    read = journal.read_journal(path)
    assert read.problems == []
    [entry] = read.entries
    assert (entry.gpu, entry.what, entry.host, entry.uuid, entry.command) == (
        2,
        journal.FAN_AUTO,
        "",
        None,
        "",
    )
    assert (entry.previous, entry.new, entry.outcome) == (None, None, journal.MADE)


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 KiB tmpfs (mounted for the test: everything here runs as root)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.parametrize("room", [0, 50])
def test_a_full_disk_refuses_the_change_and_leaves_the_journal_as_it_was(
    tiny_disk: Path, room: int
) -> None:
    path = tiny_disk / "journal.jsonl"
    _record(path)
    page = os.statvfs(tiny_disk).f_bsize
    with open(path, "ab") as f:  # blank lines, which readers skip, up to `room` short of a page
        f.write(b"\n" * (page - room - path.stat().st_size))
    filler = os.open(tiny_disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(filler, b"x" * page):
            pass
    except OSError:
        pass  # the disk is full
    finally:
        os.close(filler)
    before = path.read_bytes()
    with pytest.raises(GpustationError) as raised:
        _record(path)
    why = "No space left on device" if room == 0 else f"only {room} of "
    assert str(raised.value).startswith(f"cannot write the control journal {path}: {why}")
    assert str(raised.value).endswith(
        "; nothing was changed. Check that the state directory is writable and has free space "
        "(or set GPUSTATION_STATE_DIR)."
    )
    assert path.read_bytes() == before  # no fragment of the refused entry
    assert len(journal.read_journal(path).entries) == 1
