"""``gpustation record`` and ``gpustation replay --at``: end to end, signals, bad inputs."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpustation.cli import main
from gpustation.commands.serve import _recording
from gpustation.errors import UsageError
from gpustation.telemetry.model import Snapshot
from gpustation.telemetry.recording import recorder as recorder_mod
from gpustation.telemetry.recording.file import Recording
from gpustation.telemetry.recording.recorder import (
    Recorder,
    RecordError,
    default_path,
    recorder_from_config,
)
from gpustation.telemetry.sim import SimBackend
from gpustation.tui.source import DataSource
from tests.conftest import child_env, gpustation_cmd
from tests.receiver import Receiver
from tests.telemetry.recording_tools import START, Clock

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[float]]:
    """One short recording of simulated GPUs made by the command itself."""
    path = tmp_path_factory.mktemp("rec") / "gpus.jsonl.zst"
    rc = main(["record", "--simulate", "2", "--interval", "0.1", "--duration", "1.5", str(path)])
    assert rc == 0
    times = [float(d["time"]) for d in Recording(path).iter_docs()]
    return path, times


def test_record_then_replay_at_unix_and_iso_times(
    recorded: tuple[Path, list[float]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, times = recorded
    assert len(times) >= 10 and times == sorted(times)
    asked = (times[4] + times[5]) / 2
    assert main(["replay", str(path), "--at", repr(asked), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["time"] == times[4]  # the last one at or before
    assert doc["schema"] == "gpustation.snapshot/1" and doc["simulated"] is True
    assert len(doc["gpus"]) == 2
    # the same moment in ISO 8601, with an offset and in local time
    # (a little after the sample: ISO 8601 keeps microseconds, the float has more)
    between = times[7] + (times[8] - times[7]) / 3
    at = datetime.fromtimestamp(between, timezone(timedelta(hours=5, minutes=30)))
    assert main(["replay", str(path), "--at", at.isoformat(), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["time"] == times[7]
    local = datetime.fromtimestamp(between).isoformat()
    assert main(["replay", str(path), "--at", local, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["time"] == times[7]
    # the table, and every snapshot as JSON Lines
    assert main(["replay", str(path), "--at", repr(times[2])]) == 0
    assert "SIMULATED" in capsys.readouterr().out
    assert main(["replay", str(path), "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["time"] for line in lines] == times


def test_replay_at_takes_clock_times_spans_and_times_back_from_the_end(
    recorded: tuple[Path, list[float]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, times = recorded

    def at(text: str) -> float:
        assert main(["replay", str(path), "--at", text, "--json"]) == 0, capsys.readouterr().err
        return float(json.loads(capsys.readouterr().out)["time"])

    def last_at_or_before(t: float) -> float:
        return max(x for x in times if x <= t)

    second = float(int(times[-1]))
    assert at(time.strftime("%H:%M:%S", time.localtime(second))) == last_at_or_before(second)
    assert at("-0.5s") == last_at_or_before(times[-1] - 0.5)
    assert at("1s") == last_at_or_before(times[0] + 1)
    # a value that is not a time names the option and shows the forms it takes
    assert main(["replay", str(path), "--at", "soon"]) == 2
    err = capsys.readouterr().err
    assert "--at" in err and "20:02:46" in err and "-3s" in err and "2026-12-01" in err
    assert "300W" not in err


def test_a_time_outside_the_recording_exits_2_with_its_span(
    recorded: tuple[Path, list[float]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, times = recorded
    for t in (times[0] - 60, times[-1] + 60):
        assert main(["replay", str(path), "--at", repr(t), "--json"]) == 2
        err = capsys.readouterr().err
        assert "outside the recording, which spans" in err
        assert datetime.fromtimestamp(int(times[0])).strftime("%H:%M:%S") in err
    assert main(["replay", str(path), "--at", "soon"]) == 2
    assert "--at" in capsys.readouterr().err
    assert main(["replay", str(path.with_name("missing.zst")), "--at", "0"]) == 2
    assert "no recording" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--interval", "0"], "--interval"),
        (["--interval", "nan"], "--interval"),
        (["--interval", "-1"], "--interval"),
        (["--max-size", "12XB"], "--max-size"),
        (["--max-size", "1k"], "--max-size"),
        (["--duration", "0"], "--duration"),
    ],
)
def test_bad_inputs_exit_2_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], named: str
) -> None:
    assert main(["record", "--simulate", "1", *args, str(tmp_path / "r.zst")]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "r.zst").exists()


def test_an_unwritable_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["record", "--simulate", "1", str(tmp_path / "no" / "dir" / "r.zst")]) == 2
    err = capsys.readouterr().err
    assert "FILE" in err and "does not exist" in err
    assert main(["record", "--simulate", "1", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "r.zst"), "--speed", "32"]) == 2
    assert "--speed" in capsys.readouterr().err


@pytest.mark.parametrize("writes", [2, 3])  # a write while recording; the last, on closing
def test_a_full_disk_exits_1_saying_what_was_kept(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    writes: int,
) -> None:
    real = recorder_mod._write
    calls = {"n": 0}

    def full_disk(fd: int, data: bytes) -> None:
        calls["n"] += 1
        if calls["n"] > writes:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(recorder_mod, "_write", full_disk)
    path = tmp_path / "r.zst"
    rc = main(["record", "--simulate", "1", "--interval", "0.05", "--duration", "2.5", str(path)])
    assert rc == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "kept" in err and "samples" in err
    assert len(list(Recording(path).iter_docs())) >= 1


def _start(path: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        gpustation_cmd("record", "--simulate", "1", "--interval", "0.1", str(path)),
        env=child_env(),
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not (path.exists() and path.stat().st_size > 0):  # the first snapshot is on disk
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
        assert time.monotonic() < deadline, "nothing recorded in time"
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize(("sig", "rc"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_sigterm_and_ctrl_c_end_with_a_whole_recording(tmp_path: Path, sig: int, rc: int) -> None:
    path = tmp_path / "r.zst"
    proc = _start(path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == rc, err
    rec = Recording(path)
    assert rec.frames and all(f.whole for f in rec.frames)
    assert b"recorded" in err


def test_a_killed_recorder_leaves_a_readable_recording(tmp_path: Path) -> None:
    path = tmp_path / "r.zst"
    proc = _start(path)
    proc.kill()
    proc.communicate(timeout=30)
    rec = Recording(path)
    assert len(list(rec.iter_docs())) >= 1 and not rec.frames[-1].whole


def test_the_dashboard_source_records_and_survives_a_failed_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clk = Clock(START)
    backend = SimBackend(count=1, seed=0, state_path=None, clock=clk)
    path = tmp_path / "dash.zst"
    source = DataSource(
        lambda: backend, clock=clk, recorder=Recorder(path, interval_s=2.0, flush_s=0.0)
    )
    for _ in range(6):
        source.sample()
        clk.t += 1.0
    assert source.recorder is not None
    source.recorder.flush()
    assert [d["time"] for d in Recording(path).iter_docs()] == [START, START + 2, START + 4]

    def full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(recorder_mod, "_write", full)
    frame = source.sample()  # still a frame
    assert frame.snapshot.time == START + 6
    assert source.recorder is None and "No space left" in (source.record_error or "")
    source.close()


def test_record_in_config_and_the_serve_hook(
    tmp_path: Path, gpustation_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert recorder_from_config() is None  # off by default
    path = tmp_path / "always.zst"
    (gpustation_dirs["config"] / "config.toml").write_text(
        f'[record]\nenabled = true\npath = "{path}"\nmax_size = "1MB"\ninterval = 1\n'
    )
    rec = recorder_from_config()
    assert rec is not None and rec.path == path and rec.max_size == 1_000_000
    t = iter([START, START + 0.5, START + 1.0])
    sample = _recording(lambda: Snapshot(hostname="h", time=next(t)), rec)
    for _ in range(3):
        sample()
    rec.close()
    assert [d["time"] for d in Recording(path).iter_docs()] == [START, START + 1.0]
    (gpustation_dirs["config"] / "config.toml").write_text('[record]\nenabled = "yes"\n')
    with pytest.raises(UsageError, match=r"\[record\] enabled"):
        recorder_from_config()


def test_a_configured_record_path_in_a_missing_folder_is_refused_not_made(
    tmp_path: Path, gpustation_dirs: dict[str, Path]
) -> None:
    """Only gpustation's own recordings folder is made when missing: a folder
    named in [record] path must exist, so root never makes one in a user's home."""
    missing = tmp_path / "no" / "such" / "folder"
    config = gpustation_dirs["config"] / "config.toml"
    config.write_text(f'[record]\nenabled = true\npath = "{missing / "r.zst"}"\n')
    with pytest.raises(RecordError, match="does not exist"):
        recorder_from_config()
    assert not (tmp_path / "no").exists()
    config.write_text("[record]\nenabled = true\n")
    rec = recorder_from_config()
    assert rec is not None and rec.path == default_path() and rec.path.parent.is_dir()
    rec.close()


def test_record_notifies_the_gpu_events_notify_chooses(
    receiver: Receiver, gpustation_dirs: dict[str, Path], tmp_path: Path
) -> None:
    (gpustation_dirs["config"] / "config.toml").write_text(
        f'[notify]\nurls = ["{receiver.url}"]\nbell = false\nevents = ["gpu_lost"]\n'
    )
    sim = SimBackend.open(count=2)
    sim.poke(0, load=1.0, ambient_c=85.0, temperature_c=95.0)  # hot: not chosen
    sim.poke(1, lost=True)
    path = tmp_path / "gpus.jsonl.zst"
    argv = ["record", "--simulate", "2", "--interval", "0.1", "--duration", "0.5", str(path)]
    assert main(argv) == 0
    # record sends what it has queued before it returns
    (message,) = receiver.messages
    assert message["title"].startswith("gpustation: GPU1 LOST on ")
    assert "GPU 1 is lost" in message["message"]
    assert len(list(Recording(path).iter_docs())) >= 3  # the recording is whole


def _zstd_recording(path: Path, lines: list[bytes]) -> None:
    """A recording as ``zstd`` would make it from JSON Lines (no time frames)."""
    import zstandard

    path.write_bytes(zstandard.ZstdCompressor().compress(b"\n".join(lines) + b"\n"))


def test_replay_skips_deep_and_non_finite_lines_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def doc(t: float) -> bytes:
        return json.dumps(Snapshot(hostname="box", time=t, gpus=[]).to_dict()).encode()

    path = tmp_path / "bad.jsonl.zst"
    deep = b"[" * 100_000
    schema = b'"schema": "gpustation.snapshot/1"'
    infinite = b"{" + schema + b', "time": 1e400, "hostname": "box", "gpus": []}'
    _zstd_recording(path, [doc(START), deep, infinite, doc(START + 1)])
    assert main(["replay", str(path), "--json"]) == 0
    out = capsys.readouterr()
    assert [json.loads(line)["time"] for line in out.out.splitlines()] == [START, START + 1]
    assert "Infinity" not in out.out and "Traceback" not in out.err
    assert "a line skipped (nested deeper than 64 levels) and 1 more" in out.err
    # nothing but such lines: no snapshots, exit 2 saying why
    _zstd_recording(path, [deep])
    assert main(["replay", str(path), "--json"]) == 2
    err = capsys.readouterr().err
    assert "no snapshots in the recording" in err and "nested deeper than 64 levels" in err
    _zstd_recording(path, [infinite])
    assert main(["replay", str(path), "--at", repr(START), "--json"]) == 2
    err = capsys.readouterr().err
    assert "no snapshots in the recording" in err and 'no finite "time"' in err
