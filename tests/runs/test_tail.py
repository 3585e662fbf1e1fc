"""Tailing by byte offset, and the metrics reader's tolerance of bad lines."""

from __future__ import annotations

import json
from pathlib import Path

from gpustation.runs.fold import MetricsFold
from gpustation.runs.tail import MetricsReader, Tailer


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def test_partial_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "log"
    tailer = Tailer(path)
    assert tailer.read_new() == []  # no file yet
    append(path, b"one\ntw")
    assert tailer.read_new() == [b"one"]
    assert tailer.read_new() == []
    append(path, b"o\nthree")
    assert tailer.read_new() == [b"two"]
    append(path, b"\n")
    assert tailer.read_new() == [b"three"]
    tailer.close()


def test_reads_only_new_bytes(tmp_path: Path) -> None:
    path = tmp_path / "log"
    append(path, b"a\nb\n")
    tailer = Tailer(path)
    assert tailer.read_new() == [b"a", b"b"]
    assert tailer.offset == 4
    # Rewrite the bytes already read: a tailer that re-read the file would see them.
    with open(path, "r+b") as fh:
        fh.write(b"X\nY\n")
    append(path, b"c\n")
    assert tailer.read_new() == [b"c"]
    tailer.close()


def test_bites_of_a_flood_and_truncation(tmp_path: Path) -> None:
    path = tmp_path / "log"
    append(path, b"".join(b"line %d\n" % i for i in range(1000)))
    tailer = Tailer(path)
    seen: list[bytes] = []
    calls = 0
    while True:
        lines = tailer.read_new(max_bytes=1000)
        if not lines and tailer.at_end():
            break
        seen.extend(lines)
        calls += 1
    assert seen == [b"line %d" % i for i in range(1000)]
    assert calls > 5
    path.write_bytes(b"new\n")  # truncated and rewritten
    assert tailer.read_new() == [b"new"]
    tailer.close()


def test_metrics_reader_counts_and_skips_malformed_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    reader = MetricsReader(path)
    append(path, b'{"t": 1, "step": 1, "loss": 2.0}\nnot json\n[1]\n\n{"t": 2, "st')
    events = reader.read_new()
    assert [e["step"] for e in events] == [1]
    assert reader.malformed_count == 2  # the empty line is not an error
    append(path, b'ep": 2, "loss": 1.0}\n{"t": 3, "step": 3')
    assert [e["step"] for e in reader.read_new()] == [2]
    # After the run, a last line without its newline is still taken when whole.
    assert reader.finish() == []
    assert reader.malformed_count == 3
    reader.close()


def test_finish_takes_a_complete_last_line_without_newline(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    append(path, b'{"step": 1}\n{"step": 2, "summary": {"acc": 0.9}}')
    reader = MetricsReader(path)
    assert [e["step"] for e in reader.read_new()] == [1]
    (last,) = reader.finish()
    assert last["summary"] == {"acc": 0.9}
    reader.close()


def test_accumulator_figures() -> None:
    acc = MetricsFold()
    events = [
        {
            "t": 1.0,
            "step": 10,
            "loss": 3.0,
            "throughput": 100.0,
            "unit": "img/s",
            "total_steps": 40,
        },
        {"t": 2.0, "step": 20, "loss": 1.0, "throughput": 300.0, "mem_peak_mib": 500},
        {"t": 3.0, "step": 30, "loss": 2.0, "throughput": 200.0, "eval_loss": 1.5},
        {"t": 3.5, "summary": {"accuracy": 0.8}},
    ]
    for event in events:
        acc.add(json.loads(json.dumps(event)))
    assert acc.step == 30 and acc.total_steps == 40
    assert acc.fraction_done == 0.75
    assert acc.final_loss == 2.0 and acc.best_loss == 1.0
    assert acc.best_throughput == 300.0 and acc.throughput == 200.0
    assert acc.best_eval_loss == 1.5 and acc.mem_peak_mib == 500
    # 100 img/s for the first second, 300 for the next, 200 for the third.
    assert acc.work_done() == (600.0, "img")
    assert acc.summary == {"accuracy": 0.8}
    assert acc.losses.points() == ([10.0, 20.0, 30.0], [3.0, 1.0, 2.0])
