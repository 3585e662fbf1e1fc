"""The supervisor's slowdown watch in-process, ``[slowdown]``, and how readers fold and show
``slowdowns.jsonl``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gpustation.runs import rundir
from gpustation.runs.rundir import RunState
from gpustation.runs.slowdown import records, watch
from gpustation.runs.slowdown.detect import DetectSettings
from gpustation.runs.slowdown.evidence import HostReader
from gpustation.runs.slowdown.settings import load_settings
from gpustation.runs.slowdown.show import follow_line, slowdowns_table
from gpustation.runs.slowdown.watch import SlowdownWatch

RUN = {"id": "r1", "preset": {"name": "train"}, "gpus": [0], "backend": {"simulated": True}}


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)


def write_events(directory: Path, events: list[dict[str, Any]]) -> None:
    with open(directory / rundir.METRICS_FILE, "a", encoding="utf-8") as fh:
        fh.writelines(json.dumps(e) + "\n" for e in events)


def reports(t0: float, seconds: float, value: float | None, **more: Any) -> list[dict[str, Any]]:
    """A report every 0.25 s, with a throughput of ``value`` (None: its step alone)."""
    out = []
    for i in range(int(seconds * 4)):
        event: dict[str, Any] = {"time": t0 + i * 0.25, **more}
        if value is not None:
            event.update(throughput=value, unit="img/s")
        out.append(event)
    return out


def a_watch(directory: Path, log: Log, **settings: Any) -> SlowdownWatch:
    state = RunState(id="r1", started_at=time.time() - 60, child_pid=os.getpid())
    cold = DetectSettings(warmup_reports=0, warmup_s=0.0, **settings)
    return SlowdownWatch(directory, RUN, state, cold, log)


def test_a_slowdown_and_its_end_are_written_and_logged(tmp_path: Path) -> None:
    log = Log()
    w = a_watch(tmp_path, log)
    t0 = time.time() - 50
    write_events(tmp_path, reports(t0, 20, 100.0) + reports(t0 + 20, 8, 40.0))
    w.tick(None, {os.getpid()})
    (found,) = records.read_slowdowns(tmp_path)
    assert found["state"] == "ongoing" and found["unit"] == "img/s"
    assert found["start_time"] == pytest.approx(t0 + 20) and found["lost_pct"] == 60.0
    # No GPU and no time before it to compare with: nothing named, nothing guessed.
    assert found["cause"]["kind"] == "unknown"
    assert any(line.startswith("slowdown 1: 40 img/s against a steady 100") for line in log.lines)
    write_events(tmp_path, reports(t0 + 28, 3, 100.0))
    w.tick(None, {os.getpid()})
    (found,) = records.read_slowdowns(tmp_path)
    assert found["state"] == "ended" and found["length_s"] == pytest.approx(8.0)
    assert found["ended_with_run"] is False
    assert "slowdown 1 ended after 0:08: the throughput is back" in log.lines
    w.close()


def test_a_phase_the_runner_reported_names_the_slowdown(tmp_path: Path) -> None:
    w = a_watch(tmp_path, Log())
    t0 = time.time() - 50
    phase = [{"time": t0 + 19.9, "step": 10, "phase": "checkpoint"}]
    write_events(tmp_path, reports(t0, 20, 100.0) + phase + reports(t0 + 20, 8, 40.0))
    w.tick(None, set())
    (found,) = records.read_slowdowns(tmp_path)
    assert found["cause"]["kind"] == "phase"
    assert found["cause"]["words"].startswith(
        "checkpoint phase: the runner reported its checkpoint phase for 5 s of the 10 s"
    )


def test_a_run_that_reports_only_its_step_is_watched_in_steps_a_second(tmp_path: Path) -> None:
    w = a_watch(tmp_path, Log())
    t0 = time.time() - 100
    events = [{"time": t0 + 0.25 * i, "step": 5 * i} for i in range(160)]  # 20 steps/s
    events += [{"time": t0 + 40 + 0.25 * i, "step": 800 + 2 * i} for i in range(40)]  # 8
    write_events(tmp_path, events)
    w.tick(None, set())
    w.close()  # the run ended in it
    (found,) = records.read_slowdowns(tmp_path)
    assert found["unit"] == "steps/s" and found["steady"] == pytest.approx(20.0)
    assert found["state"] == "ended" and found["ended_with_run"] is True


def test_a_failure_turns_the_watch_off_never_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(watch, "name_cause", broken)
    log = Log()
    w = a_watch(tmp_path, log)
    t0 = time.time() - 50
    write_events(tmp_path, reports(t0, 20, 100.0) + reports(t0 + 20, 8, 40.0))
    w.tick(None, set())  # does not raise
    assert w.off and log.lines == ["slowdown watch stopped: RuntimeError: a bug"]
    write_events(tmp_path, reports(t0 + 28, 8, 40.0))
    w.tick(None, set())
    w.close()
    assert len(log.lines) == 1 and not (tmp_path / rundir.SLOWDOWNS_FILE).exists()


def test_slowdown_settings_name_each_bad_value_and_keep_the_defaults(
    gpustation_dirs: dict[str, Path],
) -> None:
    config = gpustation_dirs["config"] / "config.toml"
    config.write_text("[slowdown]\ndrop_pct = 10\nmin_s = 8\n")
    settings, problems = load_settings()
    assert (settings.drop_pct, settings.min_s, settings.window_s) == (10.0, 8.0, 120.0)
    assert problems == []
    config.write_text(
        '[slowdown]\ndrop_pct = 0\nmin_s = "5"\nwarmup_reports = 2.5\nenabled = "no"\nspeed = 1\n'
    )
    settings, problems = load_settings()
    assert settings == DetectSettings()
    text = "\n".join(problems)
    for named in ("drop_pct", "min_s", "warmup_reports", "enabled", "unknown key(s) speed"):
        assert named in text, text
    assert len(problems) == 5
    # Off: the supervisor watches nothing and says why.
    config.write_text("[slowdown]\nenabled = false\n")
    log = Log()
    assert SlowdownWatch.start(gpustation_dirs["data"], RUN, RunState(id="r1"), log) is None
    assert log.lines == ["slowdowns are not watched ([slowdown] enabled = false)"]


def test_readers_fold_the_lines_of_a_slowdown_and_leave_out_what_is_not_one(
    tmp_path: Path,
) -> None:
    lines = [
        {"id": 1, "state": "ongoing", "start_time": 100.0, "start_s": 4.0, "steady": 50.0,
         "throughput": 20.0, "unit": "\x1b]52;c;bad\x07img/s", "lost_pct": 60.0, "lost": 30.0,
         "cause": {"kind": "process", "label": "another process (pid 7)",
                   "detail": "pid 7 (eve, \x1b[2Jrm -rf) at 50 % of GPU 0's SMs",
                   "words": "w", "evidence": {"pid": 7}}},
        {"id": 1, "state": "ended", "end_time": 112.5, "length_s": 12.5, "lost_pct": 58.0},
        {"id": 2, "state": "ended", "length_s": 3.0},  # its first line never came
        {"id": "3", "state": "ongoing"}, {"id": 4, "state": "paused"}, [1, 2],
        {"id": 5, "state": "ongoing", "start_time": 200.0, "steady": "fast",
         "cause": {"kind": "unknown"}},
        {"id": 6, "state": "ongoing", "start_time": 300.0, "steady": float("nan"),
         "cause": {"kind": "unknown"}},  # JSON has no NaN: the whole line is refused
    ]  # fmt: skip
    text = "".join(json.dumps(line) + "\n" for line in lines) + "not json\n"
    (tmp_path / rundir.SLOWDOWNS_FILE).write_text(text)
    first, fifth = records.read_slowdowns(tmp_path)
    assert first["state"] == "ended" and first["length_s"] == 12.5 and first["lost_pct"] == 58.0
    assert first["unit"] == "img/s" and "\x1b" not in first["cause"]["detail"]
    assert fifth["id"] == 5 and "steady" not in fifth
    assert fifth["cause"] == {"kind": "unknown", "label": "unknown", "detail": "",
                              "words": "unknown", "evidence": {}}  # fmt: skip
    # A FIFO in its place is not waited on, by a reader or by the supervisor's watch.
    (tmp_path / rundir.SLOWDOWNS_FILE).unlink()
    os.mkfifo(tmp_path / rundir.SLOWDOWNS_FILE)
    assert records.read_slowdowns(tmp_path) == []
    with pytest.raises(OSError):  # refused at once (no reader: ENXIO), never waited on
        records.append(tmp_path, {"id": 1, "state": "ended"})


def test_the_table_and_the_lines_say_start_length_loss_cause_and_figures() -> None:
    row = {
        "id": 1, "state": "ended", "start_s": 42.0, "length_s": 75.0, "steady": 812.0,
        "lost": 392.0, "lost_pct": 48.3, "unit": "img/s", "ended_with_run": False,
        "cause": {"kind": "power_cap", "label": "power cap", "detail": "300 W limit, GPU at 299 W",
                  "words": "power cap: 300 W limit, GPU at 299 W", "evidence": {}},
    }  # fmt: skip
    going = {**row, "state": "ongoing"}
    table = slowdowns_table([row, going], simulated=True, active=True)
    console = Console(width=160, record=True)
    console.print(table)
    text = console.export_text()
    assert "slowdowns (SIMULATED GPUs)" in text
    assert "0:42" in text and "1:15" in text and "going on" in text
    assert "-48 % (-392 img/s of 812)" in text and "300 W limit, GPU at 299 W" in text
    assert slowdowns_table([]) is None
    assert follow_line(going, going) == (
        "gpustation: slowdown at 0:42 into the run, throughput -48 % (-392 img/s of 812); "
        "power cap: 300 W limit, GPU at 299 W"
    )
    assert follow_line(row, {"state": "ended"}) == (
        "gpustation: the slowdown at 0:42 ended after 1:15; throughput -48 % (-392 img/s of 812)"
    )


def test_the_run_s_time_on_a_cpu_is_read_from_schedstat(tmp_path: Path) -> None:
    reader = HostReader(proc_root=str(tmp_path))
    for pid in (10, 11):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "schedstat").write_text("1000000 5000000 3\n")
    assert reader.on_cpu({10, 11, 12}) is None  # the baseline
    # 300 ms on a CPU and 100 ms waiting, and 100 ms on and 500 ms waiting
    (tmp_path / "10" / "schedstat").write_text("301000000 105000000 9\n")
    (tmp_path / "11" / "schedstat").write_text("101000000 505000000 9\n")
    assert reader.on_cpu({10, 11, 12}) == pytest.approx(40.0)
    # A process new since the last reading counts from the next one; nothing moved: None.
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "schedstat").write_text("1 999000000 1\n")
    assert reader.on_cpu({10, 11, 12}) is None
