"""The control journal is the truth about the hardware, whatever the disk and
other processes do: torn lines, short writes, a full disk, refused changes,
garbage in the file, concurrent writers."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest

from gpustation.control import journal
from gpustation.errors import GpustationError
from tests.conftest import child_env, gpustation_cmd
from tests.control.conftest import RecordingSim, cli


def limits(sim: RecordingSim) -> list[float | None]:
    return [g.power_limit_w for g in sim.read_gpus([0, 1], slow=False)]


def test_a_torn_last_line_never_swallows_the_next_entry(
    sim: RecordingSim, capsys: pytest.CaptureFixture[str]
) -> None:
    path = journal.journal_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'{"tim')  # another writer died mid-line
    code, _, err = cli(capsys, "power", "set", "300", "--simulate", "--gpus", "0")
    assert code == 0, err
    read = journal.read_journal()
    assert [(e.what, e.new, e.outcome) for e in read.entries] == [
        ("power_limit", 300.0, journal.MADE)
    ]
    assert len(read.problems) == 1 and read.problems[0].startswith("line 1")


def test_a_short_write_refuses_the_change_and_leaves_no_fragment(
    sim: RecordingSim, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    before = limits(sim)
    real_write = os.write

    def short_write(fd: int, data: bytes) -> int:
        return real_write(fd, data[: len(data) // 2])

    with monkeypatch.context() as patch:
        patch.setattr(os, "write", short_write)
        code, _, err = cli(capsys, "power", "set", "300", "--simulate")
    assert code == 1 and "nothing was changed" in err
    assert limits(sim) == before
    assert sim.set_calls == []
    assert journal.journal_path().read_bytes() == b""


def test_a_full_disk_refuses_the_change(
    sim: RecordingSim, capsys: pytest.CaptureFixture[str]
) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    path = journal.journal_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to("/dev/full")  # every write: ENOSPC
    before = limits(sim)
    code, _, err = cli(capsys, "power", "set", "300", "--simulate")
    assert code == 1 and "No space left" in err and "nothing was changed" in err
    assert limits(sim) == before and sim.set_calls == []


def test_a_change_the_driver_refused_is_journalled_as_refused(
    sim: RecordingSim, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(index: int, watts: float) -> None:
        raise GpustationError("the driver said no")

    monkeypatch.setattr(sim.control, "set_power_limit", refuse)
    code, _, err = cli(capsys, "power", "set", "300", "--simulate", "--gpus", "1")
    assert code == 1 and "the driver said no" in err
    (entry,) = journal.read_entries()
    assert entry.outcome == journal.REFUSED and entry.error == "the driver said no"
    code, out, _ = cli(capsys, "power", "journal")
    assert "[REFUSED] the driver said no" in out


def test_a_change_is_read_back_and_the_journal_keeps_what_the_card_reads(
    sim: RecordingSim, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "power", "set", "320", "--simulate", "--gpus", "0")
    assert code == 0, err
    (entry,) = journal.read_entries()
    assert entry.outcome == journal.MADE and entry.read_back == 320.0


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\xff\xfe binary \x89PNG\r\n",
        b"[1, 2, 3]\n",
        b'"a string"\n',
        b'{"time": "yesterday", "gpu": 0, "what": "power_limit"}\n',
        b'{"time": 1, "gpu": true, "what": "power_limit"}\n',
        b'{"time": 1, "gpu": 0, "what": "power_limit", "fan": "one"}\n',
        b"[" * 5000 + b"\n",
        b'{"id": "nobody", "outcome": "made"}\n',
    ],
)
def test_power_journal_reads_any_file(
    garbage: bytes, sim: RecordingSim, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "power", "set", "300", "--simulate", "--gpus", "0")
    assert code == 0, err
    with journal.journal_path().open("ab") as f:
        f.write(garbage)
    code, _, err = cli(capsys, "power", "set", "310", "--simulate", "--gpus", "0")
    assert code == 0, err
    code, out, err = cli(capsys, "power", "journal")
    assert code == 0
    assert "300 W" in out and "310 W" in out  # both real entries, around the garbage
    assert "(skipped)" in err
    code, out, _ = cli(capsys, "power", "journal", "--json")
    assert code == 0 and [json.loads(line)["new"] for line in out.splitlines()] == [300, 310]


def test_concurrent_power_sets_leave_the_journal_agreeing_with_the_card(
    gpustation_dirs: dict[str, Path],
) -> None:
    env = child_env(GPUSTATION_SIMULATE="2")
    watts = [250, 275, 300, 325]
    for _ in range(3):
        procs = [
            subprocess.Popen(
                gpustation_cmd("power", "set", str(w), "--simulate", "2"),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for w in watts
        ]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
    shown = subprocess.run(
        gpustation_cmd("power", "show", "--json", "--simulate", "2"),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    card = {g["index"]: g["power_limit_w"] for g in json.loads(shown.stdout)["gpus"]}
    entries = list(journal.read_entries())
    assert len(entries) <= 2 * 4 * 3 and all(e.outcome == journal.MADE for e in entries)
    for gpu in (0, 1):
        mine = [e for e in entries if e.gpu == gpu]
        # each change starts from what the one before it left on the card...
        for before, after in itertools.pairwise(mine):
            assert after.previous == before.new
        # ...and the last one is what the card has now
        assert mine[-1].new == card[gpu] == mine[-1].read_back
