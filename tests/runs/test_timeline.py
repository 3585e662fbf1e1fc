"""A run's timeline: telemetry read by byte offset, loss and GPUs on one axis, bounded."""

from __future__ import annotations

import json
from pathlib import Path

from gpustation.runs import rundir
from gpustation.runs.gputrace import write_sample
from gpustation.runs.timeline import TimelineReader

START = 1_700_000_000.0


def sample(t: float, gpus: int = 1) -> dict[str, object]:
    return {
        "t": t,
        "time": START + t,
        "gpus": [
            {"index": i, "power_w": 100.0 + i, "temperature_c": 50 + i,
             "utilization_gpu_pct": 40 + 20 * i, "throttle": ["hw_slowdown"] if i else []}
            for i in range(gpus)
        ],
    }  # fmt: skip


def test_telemetry_is_read_by_offset_and_a_half_written_line_waits(tmp_path: Path) -> None:
    path = tmp_path / rundir.TELEMETRY_FILE
    reader = TimelineReader(tmp_path)
    reader.start_at(START)
    write_sample(path, sample(0.0, gpus=2))
    with open(path, "a") as fh:
        fh.write(json.dumps(sample(1.0, gpus=2))[:20])  # the writer is mid-line
    reader.read_telemetry()
    (first,) = reader.data().gpu
    # two GPUs together: power summed, the hottest, the mean utilisation, every reason
    assert (first.power_w, first.temperature_c, first.utilization_pct) == (201.0, 51.0, 50.0)
    assert first.throttle == ("hw_slowdown",) and first.gpus == 2
    with open(path, "a") as fh:
        fh.write(json.dumps(sample(1.0, gpus=2))[20:] + "\n")
    reader.read_telemetry()
    assert [m.t_s for m in reader.data().gpu] == [0.0, 1.0]
    assert reader.drained() and reader.energy_j == 201.0  # 201 W for one second
    reader.close()


def test_loss_goes_on_the_run_s_clock_and_both_stay_bounded(tmp_path: Path) -> None:
    reader = TimelineReader(tmp_path, max_points=100)
    reader.start_at(START)
    path = tmp_path / rundir.TELEMETRY_FILE
    for t in range(1000):
        write_sample(path, sample(float(t)))
    # the writer's t starts later than the run: its time says where the event is
    reader.add_events(
        {"t": t - 5.0, "time": START + t, "step": t, "loss": 1.0 / (t + 1)} for t in range(5, 1000)
    )
    reader.read_telemetry()
    timeline = reader.data()
    assert 50 <= len(timeline.gpu) <= 101 and 50 <= len(timeline.loss) <= 101
    assert timeline.gpu[-1].t_s == 999.0 and timeline.loss[-1].step == 999  # the end is kept
    loss, gpu = timeline.at(500.0)
    assert loss is not None and gpu is not None
    assert loss.t_s <= 500.0 and loss.step == int(loss.t_s)
    assert gpu.t_s <= 500.0 and timeline.end_s() == 999.0
    reader.close()
