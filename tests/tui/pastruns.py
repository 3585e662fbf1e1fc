"""Past runs written as run directories with fixed files (and indexed), for the runs tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpustation.runs import rundir
from gpustation.runs.gputrace import write_sample
from gpustation.runs.presets import RunPreset
from gpustation.runs.rundir import RunState
from gpustation.runs.store.index import sync_run


def write_run(
    runs_root: Path,
    run_id: str,
    preset: RunPreset,
    *,
    overrides: dict[str, Any] | None = None,
    gpus: list[int] | None = None,
    status: str = "succeeded",
    started_at: float = 1_700_000_000.0,
    duration_s: float = 754.0,
    steps: int = 150,
    log: list[str] | None = None,
    exit_code: int | None = 0,
    telemetry: bool = False,
) -> Path:
    """A finished run of ``preset`` (with ``overrides`` applied) in ``runs_root/run_id``.

    ``telemetry``: with a GPU sample a second over the reported steps (and the
    metric events' ``time``), as the supervisor records them.
    """
    directory = runs_root / run_id
    directory.mkdir(parents=True)
    args = {**preset.args, **(overrides or {})}
    applied = RunPreset(**{**preset.to_dict(), "args": args})
    run = {
        "id": run_id,
        "created_at": started_at,
        "preset": applied.to_dict(),
        "overrides": overrides or {},
        "argv": ["python", "-m", f"gpustation.runners.{preset.runner}"],
        "gpus": gpus if gpus is not None else [0],
        "env": {},
        "cwd": "/home/user",
        "backend": {"kind": "sim", "simulated": True, "simulate": 2},
    }
    rundir.write_json(directory / rundir.RUN_JSON, run)
    events: list[dict[str, Any]] = []
    for step in range(10, steps + 1, 10):
        loss = 7.0 / (1 + step / 15) + 0.05 * ((step * 7) % 5)
        events.append(
            {
                "t": step * 0.5,
                "step": step,
                "loss": round(loss, 4),
                "throughput": 1480.0,
                "unit": "img/s",
                "total_steps": steps,
            }
        )
        if step % 50 == 0:
            events.append({"t": step * 0.5, "step": step, "eval_loss": round(loss * 1.08, 4)})
    if telemetry:
        for event in events:
            event["time"] = started_at + event["t"]
        for t in range(int(steps * 0.5) + 1):
            warm = min(1.0, t / 20)
            gpu = {
                "index": (gpus or [0])[0],
                "power_w": round(90 + 300 * warm + 12 * ((t * 7) % 5), 1),
                "temperature_c": round(38 + 30 * warm),
                "memory_used_mib": 7680,
                "utilization_gpu_pct": 0 if t < 3 else 96 + (t % 4),
                "energy_j": None,
                "throttle": ["sw_power_cap"] if 40 <= t < 46 else [],
            }
            write_sample(
                directory / rundir.TELEMETRY_FILE,
                {"t": float(t), "time": started_at + t, "gpus": [gpu]},
            )
    (directory / rundir.METRICS_FILE).write_text("".join(json.dumps(e) + "\n" for e in events))
    lines = (
        log
        if log is not None
        else [
            f"step {e['step']} loss {e['loss']:.4f} throughput 1480 img/s"
            for e in events
            if "loss" in e
        ]
    )
    (directory / rundir.OUTPUT_LOG).write_text("".join(line + "\n" for line in lines))
    state = RunState(
        id=run_id,
        status=status,
        started_at=started_at,
        ended_at=started_at + duration_s,
        exit_code=exit_code,
    )
    rundir.write_state(directory, state)
    sync_run(directory)
    return directory


#: a contention run's phases on a GPU, as its summary lists them
CONTENTION_PHASES: list[dict[str, Any]] = [
    {"phase": "train", "train_tokens_per_s": 9812.4, "power_w_mean": 411.3,
     "power_w_peak": 452.0, "util_pct_mean": 98.2, "sm_pct_train": 96.5, "sm_pct_infer": None},
    {"phase": "infer", "infer_tokens_per_s": 1663.0, "infer_latency_ms_p50": 38.48,
     "infer_latency_ms_p99": 41.02, "power_w_mean": 251.7, "power_w_peak": 280.4,
     "util_pct_mean": 61.0, "sm_pct_train": None, "sm_pct_infer": 41.8},
    {"phase": "both", "train_tokens_per_s": 7410.9, "infer_tokens_per_s": 702.3,
     "infer_latency_ms_p50": 92.31, "infer_latency_ms_p99": 160.84, "power_w_mean": 440.2,
     "power_w_peak": 471.9, "util_pct_mean": 99.1, "sm_pct_train": 68.4, "sm_pct_infer": 29.7,
     "train_slowdown": 1.324, "infer_p50_slowdown": 2.399, "infer_p99_slowdown": 3.921},
]  # fmt: skip


def write_phased_run(
    runs_root: Path,
    run_id: str,
    preset: RunPreset,
    phases: list[dict[str, Any]],
    started_at: float = 1_700_000_000.0,
    **summary: Any,
) -> Path:
    """A finished run of ``preset`` that reported phases (a line each, then a summary with
    the ``phases`` list and ``summary``), as the contention runner does; no loss."""
    directory = write_run(runs_root, run_id, preset, started_at=started_at, steps=0, log=[])
    events: list[dict[str, Any]] = [
        {"t": 30.0 * n, "time": started_at + 30.0 * n, "step": n, "total_steps": len(phases),
         **{k: v for k, v in phase.items() if "slowdown" not in k}}
        for n, phase in enumerate(phases, 1)
    ]  # fmt: skip
    events.append({"t": 30.0 * len(phases), "summary": {**summary, "phases": phases}})
    (directory / rundir.METRICS_FILE).write_text("".join(json.dumps(e) + "\n" for e in events))
    sync_run(directory)
    return directory
