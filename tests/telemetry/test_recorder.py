"""The flight recorder: format, index and seek, torn files, rotation, write errors."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
import zstandard

from gpustation.errors import UsageError
from gpustation.telemetry.model import Snapshot
from gpustation.telemetry.recording import file as recording_mod
from gpustation.telemetry.recording import recorder as recorder_mod
from gpustation.telemetry.recording.file import Recording, chain
from gpustation.telemetry.recording.recorder import (
    Recorder,
    RecordError,
    parse_size,
    record_settings,
)
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend
from tests.telemetry.recording_tools import START, make_recording


def test_seek_lands_on_the_last_snapshot_at_or_before_the_time(tmp_path: Path) -> None:
    path = tmp_path / "r.zst"
    times = make_recording(path, n=300, interval=1.0, frame_s=10.0)
    rec = Recording(path)
    assert (rec.start, rec.end) == (times[0], times[-1])
    # one frame per 10 s, indexed with the time of its first snapshot
    assert len(rec.frames) == 30
    assert [f.t0 for f in rec.frames] == [START + 10 * k for k in range(30)]
    assert rec.snapshot_at(START + 123.5).time == START + 123
    assert rec.snapshot_at(START + 123).time == START + 123
    assert rec.snapshot_at(START + 129.99).time == START + 129
    assert rec.snapshot_at(START + 130).time == START + 130
    assert rec.snapshot_at(START - 5).time == START  # before the start: the first
    snap = rec.snapshot_at(START + 200)
    assert isinstance(snap, Snapshot) and len(snap.gpus) == 2 and snap.simulated
    assert [float(d["time"]) for d in rec.iter_docs()] == times


def test_a_seek_decompresses_one_frame_not_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "r.zst"
    make_recording(path, n=600, frame_s=10.0)
    made = []
    real = zstandard.ZstdDecompressor

    def counting(*args: Any, **kwargs: Any) -> zstandard.ZstdDecompressor:
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(zstandard, "ZstdDecompressor", counting)
    rec = Recording(path)
    opened = len(made)
    assert opened <= 1  # the index comes from the frame headers; the end from the last frame
    assert rec.snapshot_at(START + 321.5).time == START + 321
    assert len(made) - opened == 1


def test_zstdcat_reads_a_recording_and_a_plain_zstd_file_replays(tmp_path: Path) -> None:
    path = tmp_path / "r.zst"
    times = make_recording(path, n=30, frame_s=10.0)
    text = (
        zstandard.ZstdDecompressor()
        .stream_reader(path.read_bytes(), read_across_frames=True)
        .read()
    )
    docs = [json.loads(line) for line in text.splitlines()]
    assert [d["time"] for d in docs] == times
    # JSON Lines compressed by any zstd tool (no times before the frames) read too
    other = tmp_path / "watch.jsonl.zst"
    other.write_bytes(zstandard.ZstdCompressor().compress(text))
    rec = Recording(other)
    assert (rec.start, rec.end) == (times[0], times[-1])
    assert rec.snapshot_at(START + 12.2).time == START + 12


def test_a_recording_whose_writer_was_killed_mid_frame_reads_to_its_last_whole_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "r.zst"
    times = make_recording(path, n=25, frame_s=1000.0)
    source = Recording(path)
    # The writer died mid-frame: no end of frame, and the last block cut short.
    rec_writer = Recorder(tmp_path / "live.zst", flush_s=0.0, frame_s=1000.0)
    for t in times:
        rec_writer.add(source.snapshot_at(t))
    live = (tmp_path / "live.zst").read_bytes()  # not closed: the frame is still open
    for cut in (0, 5, len(live) // 3):
        torn = tmp_path / f"torn{cut}.zst"
        torn.write_bytes(live[: len(live) - cut])
        rec = Recording(torn)
        assert rec.frames[-1].whole is False
        got = [float(d["time"]) for d in rec.iter_docs()]
        assert got == times[: len(got)] and len(got) >= (1 if cut else len(times))
        assert rec.end == got[-1]
    rec_writer.close()
    # A recorder opened on a torn file keeps it whole as FILE.1 and starts FILE afresh.
    torn = tmp_path / "torn5.zst"
    kept = [float(d["time"]) for d in Recording(torn).iter_docs()]
    with Recorder(torn) as again:
        again.add(Snapshot(hostname="h", time=START + 1e4))
    assert chain(torn) == [tmp_path / "torn5.zst.1", torn]
    assert [float(d["time"]) for d in Recording(torn).iter_docs()] == [*kept, START + 1e4]


def test_rotation_keeps_the_files_under_the_cap_and_the_newest_snapshots(tmp_path: Path) -> None:
    path = tmp_path / "r.zst"
    cap = 64 * 1024
    times = make_recording(path, n=4000, frame_s=10.0, max_size=cap)
    files = chain(path)
    assert files[-1] == path and 2 <= len(files) <= 4
    assert sum(p.stat().st_size for p in files) <= cap
    rec = Recording(path)
    assert rec.end == times[-1]
    assert rec.start > times[0]  # the oldest were deleted
    got = [float(d["time"]) for d in rec.iter_docs()]
    assert got == [t for t in times if t >= rec.start]  # the chain reads oldest first, no holes


def test_the_cap_counts_the_file_being_written_after_every_snapshot(tmp_path: Path) -> None:
    # One frame that never ends on its own (frame_s huge): only the size can end it,
    # and the chain, the open file included, stays under the cap at every moment.
    from tests.telemetry.recording_tools import Clock

    path = tmp_path / "r.zst"
    cap = 64 * 1024
    clk, mono = Clock(START), Clock(0.0)
    backend = SimBackend(count=2, seed=0, state_path=None, clock=clk)
    sampler = Sampler(backend, clock=clk, with_host=False)
    rotated = False
    with Recorder(path, max_size=cap, clock=mono, flush_s=0.0, frame_s=1e9) as rec:
        for _ in range(3000):
            rec.add(sampler.sample())
            clk.t += 1.0
            mono.t += 1.0
            files = chain(path)
            rotated = rotated or len(files) > 1
            total = sum(p.stat().st_size for p in files)
            assert total <= cap, f"{total} bytes on disk, the open {path.name} included"
            assert rec.size == total
    assert rotated, "the recording never reached its cap"


def test_a_write_error_says_what_was_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "r.zst"
    real = recorder_mod._write
    calls = {"n": 0}

    def full_disk(fd: int, data: bytes) -> None:
        calls["n"] += 1
        if calls["n"] > 12:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(recorder_mod, "_write", full_disk)
    with pytest.raises(RecordError) as err:
        make_recording(path, n=50)
    message = str(err.value)
    assert "No space left on device" in message and "kept" in message and str(path) in message
    kept = Recording(path)
    assert len(list(kept.iter_docs())) >= 5


@pytest.mark.parametrize("fail_after", [3, 7, 12, 20])
def test_a_write_error_claims_only_the_samples_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_after: int
) -> None:
    """Samples still in the compressor when the disk fills are lost: the
    message counts those a reader finds, not those that were added."""
    import re

    path = tmp_path / "r.zst"
    real = recorder_mod._write
    calls = {"n": 0}

    def full_disk(fd: int, data: bytes) -> None:
        calls["n"] += 1
        if calls["n"] > fail_after:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(recorder_mod, "_write", full_disk)
    with pytest.raises(RecordError) as err:
        make_recording(path, n=200, flush_s=5.0, frame_s=30.0)
    on_disk = [float(d["time"]) for d in Recording(path).iter_docs()]
    claimed = re.search(r"kept (\d+) samples", str(err.value))
    if not on_disk:
        assert "no samples were recorded" in str(err.value)
    else:
        assert claimed is not None, err.value
        assert int(claimed.group(1)) == len(on_disk)
        assert recording_mod.format_time(on_disk[-1]) in str(err.value)


def test_one_writer_per_recording(tmp_path: Path) -> None:
    path = tmp_path / "r.zst"
    with Recorder(path), pytest.raises(RecordError, match="another process"):
        Recorder(path)


def test_a_link_planted_at_the_lock_is_not_followed(tmp_path: Path) -> None:
    path = tmp_path / "live.zst"
    target = tmp_path / "precious"
    target.write_text("keep me")
    lock = path.with_name(path.name + ".lock")
    lock.symlink_to(target)
    absent = tmp_path / "absent"
    with pytest.raises(RecordError, match="symbolic link; remove it"):
        Recorder(path)
    assert target.read_text() == "keep me"
    lock.unlink()
    lock.symlink_to(absent)  # a dangling link: nothing may be created through it
    with pytest.raises(RecordError, match="symbolic link"):
        Recorder(path)
    assert not absent.exists() and not path.exists()
    lock.unlink()
    with Recorder(path):
        assert lock.stat().st_mode & 0o777 == 0o600


def test_sizes_times_and_settings_are_validated() -> None:
    assert parse_size("200MB") == 200_000_000
    assert parse_size("1.5GiB") == int(1.5 * 1024**3)
    assert parse_size("64k") == 64_000
    assert parse_size(100_000) == 100_000
    for bad in ("12XB", "", "-5MB", "1k", "MB", "nan"):
        with pytest.raises(UsageError, match="--max-size"):
            parse_size(bad)
    assert record_settings({}).enabled is False
    s = record_settings({"enabled": True, "path": "~/x.zst", "max_size": "1GB", "interval": 5})
    assert s.enabled and s.max_size == 10**9 and s.interval_s == 5.0 and "~" not in str(s.path)
    for table, key in (
        ({"enabled": "yes"}, "enabled"),
        ({"max_size": "lots"}, "max_size"),
        ({"interval": 0}, "interval"),
        ({"interval": float("nan")}, "interval"),
        ({"path": 3}, "path"),
        ({"size": 3}, "size"),
    ):
        with pytest.raises(UsageError, match=rf"\[record\] {key}"):
            record_settings(table)


def test_a_file_that_is_not_a_recording_is_refused_saying_why(tmp_path: Path) -> None:
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"schema": "gpustation.snapshot/1", "time": 1}\n')
    with pytest.raises(UsageError, match="not zstd data at byte 0"):
        Recording(plain)
    with pytest.raises(UsageError, match="no recording"):
        Recording(tmp_path / "missing.zst")


@pytest.mark.parametrize("name", ["notes.txt", "notes.txt.1"])
def test_a_file_that_is_not_a_recording_is_never_rotated_away(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    path = folder / "notes.txt"
    (folder / name).write_text("my notes, not a recording\n")
    with pytest.raises(RecordError, match="not a gpustation recording"):
        Recorder(path)
    assert (folder / name).read_text() == "my notes, not a recording\n"
    assert sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) == [name]
    # a recording of ours, even a torn one, is appended to as before
    ours = tmp_path / "ours.zst"
    make_recording(ours, n=5)
    with ours.open("ab") as f:
        f.write(b"\x28\xb5\x2f\xfd\x00")  # a frame cut short
    with Recorder(ours) as rec:
        assert rec.path == ours
