"""The run store and the GPU telemetry summary behind its energy columns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpustation.errors import UsageError
from gpustation.runs import rundir
from gpustation.runs.gputrace import summarize_telemetry
from gpustation.runs.rundir import RunState
from gpustation.runs.store.index import RunStore, record_from_dir, sync_run
from gpustation.runs.summary import RunSummary


def write_lines(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def gpu(index: int, power: float, energy: float | None = None, **more: object) -> dict[str, object]:
    return {"index": index, "power_w": power, "energy_j": energy, **more}


def test_energy_from_counters_when_they_move(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    write_lines(
        path,
        [
            {"t": 0, "gpus": [gpu(0, 100, 1000.0, temperature_c=50), gpu(1, 200, 5000.0)]},
            {"t": 10, "gpus": [gpu(0, 300, 3000.0, temperature_c=70), gpu(1, 200, 7000.0)]},
        ],
    )
    s = summarize_telemetry(path)
    assert s.energy_j == pytest.approx(2000.0 + 2000.0)
    assert s.duration_s == 10
    assert s.avg_power_w == pytest.approx(400.0)
    assert s.peak_power_w == 500.0  # both GPUs together at t=10
    assert s.peak_temp_c == 70


def test_energy_integrated_from_power_without_counters(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    rows = [
        {"t": 0, "gpus": [gpu(0, 100, throttle=[], memory_used_mib=10)]},
        {"t": 1, "gpus": [gpu(0, 300, throttle=["sw_power_cap"], memory_used_mib=30)]},
        {"t": 2, "gpus": [gpu(0, 300, throttle=["sw_power_cap"], memory_used_mib=20)]},
        {"t": 3, "gpus": [gpu(0, 100, throttle=[], memory_used_mib=20)]},
    ]
    write_lines(path, rows)
    with open(path, "a") as fh:
        fh.write("garbage line\n")
    s = summarize_telemetry(path)
    # Trapezoids: 200 + 300 + 200.
    assert s.energy_j == pytest.approx(700.0)
    assert s.throttled_s == pytest.approx(2.0)
    assert s.peak_vram_mib == 30


def make_run(directory: Path, status: str = "succeeded") -> None:
    directory.mkdir(parents=True)
    rundir.write_json(
        directory / rundir.RUN_JSON,
        {
            "id": directory.name,
            "created_at": 1000.0,
            "preset": {"name": "p", "title": "P", "launcher": "python"},
            "overrides": {"lr": 0.1},
            "argv": ["x"],
            "gpus": [0],
            "backend": {"simulated": True},
        },
    )
    rundir.write_state(
        directory,
        RunState(id=directory.name, status=status, started_at=1000.0, ended_at=1100.0, exit_code=0),
    )
    write_lines(
        directory / rundir.METRICS_FILE,
        [
            {"t": 50, "step": 1, "loss": 2.0, "throughput": 10.0, "unit": "tokens/s"},
            {"t": 100, "step": 2, "loss": 1.0, "throughput": 30.0, "mem_peak_mib": 900},
        ],
    )
    write_lines(
        directory / rundir.TELEMETRY_FILE,
        [
            {"t": 0, "gpus": [gpu(0, 100, 0.0, memory_used_mib=1200)]},
            {"t": 100, "gpus": [gpu(0, 100, 10000.0, memory_used_mib=1000)]},
        ],
    )


def test_record_from_run_directory(tmp_path: Path) -> None:
    d = tmp_path / "runs" / "20260101-000000-p-abcd"
    make_run(d)
    r = record_from_dir(d)
    assert (r.preset, r.title, r.status, r.gpus, r.overrides) == (
        "p",
        "P",
        "succeeded",
        [0],
        {"lr": 0.1},
    )
    assert r.duration_s == 100.0
    assert (r.final_loss, r.best_loss, r.steps) == (1.0, 1.0, 2)
    assert r.best_throughput == 30.0 and r.throughput_unit == "tokens/s"
    # a simulated GPU's memory is no figure of the run's: only its own peak counts
    assert r.peak_vram_mib == 900
    assert r.energy_j == 10000.0
    # 10 tokens/s for 50 s + 30 tokens/s for 50 s = 2000 tokens.
    assert (r.work, r.work_unit) == (2000.0, "token")
    assert r.energy_per_unit_j == pytest.approx(5.0)


def test_store_round_trip_and_id_resolution(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs.db")
    a = tmp_path / "runs" / "20260101-000000-resnet-aaaa"
    b = tmp_path / "runs" / "20260102-000000-resnet-bbbb"
    make_run(a)
    make_run(b, status="failed")
    sync_run(a, store)
    rec_b = sync_run(b, store)
    rec_b.started_at = 2000.0
    store.upsert(rec_b)
    got = store.get(b.name)
    assert isinstance(got, RunSummary)
    assert got.to_dict() == rec_b.to_dict()
    assert [r.id for r in store.list_runs()] == [b.name, a.name]
    assert [r.id for r in store.list_runs(status="failed")] == [b.name]
    assert store.resolve_id("last") == b.name
    assert store.resolve_id("bbbb") == b.name
    assert store.resolve_id("20260101") == a.name
    with pytest.raises(UsageError, match="matches 2 runs"):
        store.resolve_id("resnet")
    with pytest.raises(UsageError, match="no run"):
        store.resolve_id("zzz")
    # Syncing again updates the row rather than adding one.
    sync_run(a, store)
    assert len(store.list_runs()) == 2


def test_a_run_s_summary_has_its_mean_tensor_activity(tmp_path: Path) -> None:
    import json

    from gpustation.runs.gputrace import summarize_telemetry

    path = tmp_path / "telemetry.jsonl"
    lines = [
        {
            "t": t,
            "time": 100.0 + t,
            "gpus": [{"index": 0, "power_w": 500.0, "tensor_active_pct": pct}],
        }
        for t, pct in ((0, None), (1, 80.0), (2, 90.0))
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert summarize_telemetry(path).tensor_active_pct == 85.0  # the samples that have it


def test_a_run_directory_that_vanished_leaves_no_row_and_is_not_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from gpustation.runs.store import index as store_mod

    said: list[str] = []
    store = RunStore(tmp_path / "runs.db", warn=said.append)
    kept, gone = tmp_path / "runs" / "20260101-000000-p-aaaa", tmp_path / "runs" / "20260102-p-bbbb"
    make_run(kept)
    make_run(gone)
    sync_run(kept, store)
    sync_run(gone, store)
    assert {r.id for r in store.list_runs()} == {gone.name, kept.name}
    # Deleted by hand: its row lags, the listing does not.
    shutil.rmtree(gone)
    assert [r.id for r in store.list_runs()] == [kept.name]
    assert store.get(gone.name) is None
    with pytest.raises(FileNotFoundError):
        record_from_dir(gone)

    # A rebuild whose listing still named it (deleted between listing and reading).
    listed = [kept, gone]
    monkeypatch.setattr(store_mod, "run_dirs", lambda root=None: listed)
    store.db.unlink()
    rebuilt = RunStore(tmp_path / "runs.db", warn=said.append)
    make_run(tmp_path / "runs" / "20260103-p-cccc")
    sync_run(tmp_path / "runs" / "20260103-p-cccc", rebuilt)
    assert any("rebuilt the run history from 1 run directories" in s for s in said), said
    monkeypatch.undo()
    ids = sorted(r.id for r in RunStore(tmp_path / "runs.db").list_runs())
    assert ids == sorted([kept.name, "20260103-p-cccc"])
