"""The one shape of a run: :class:`RunSummary`.

What was launched (``run.json``), where it stands (``state.json``), what it
reported (folded by :mod:`gpustation.runs.fold`) and what its GPUs did
(``telemetry.jsonl``). The run store keeps one per run as a row; the follower
builds one from the files as a run goes; ``gpustation run``, ``gpustation
runs`` and the runs screen show one.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpustation.privs import user_text
from gpustation.runs import rundir
from gpustation.runs.rundir import RunState


@dataclass
class RunSummary:
    """One run: what was launched, where it stands, what it reported, what its GPUs did.

    All units in the names; None = not known. The store's row, the
    follower's :meth:`~gpustation.runs.follow.RunFollower.summary`, the runs
    screen's view and ``gpustation run``'s progress are this one type.
    """

    id: str
    preset: str | None = None
    title: str | None = None
    runner: str | None = None
    launcher: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    gpus: list[int] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)
    run_dir: str | None = None
    simulated: bool = False
    started_at: float | None = None
    ended_at: float | None = None
    duration_s: float | None = None
    status: str = "starting"
    exit_code: int | None = None
    signal: str | None = None
    oom: bool = False
    reason: str | None = None
    steps: int | None = None
    total_steps: int | None = None
    epochs: float | None = None
    final_loss: float | None = None
    best_loss: float | None = None
    final_eval_loss: float | None = None
    #: the last throughput reported, and the best
    throughput: float | None = None
    best_throughput: float | None = None
    throughput_unit: str | None = None
    #: steps a second over the last reports (the ETA's rate)
    steps_per_s: float | None = None
    work: float | None = None
    work_unit: str | None = None
    peak_vram_mib: float | None = None
    energy_j: float | None = None
    #: another run used the same GPU meanwhile and the run's part of the
    #: energy could not be told (see gputrace.py): energy_j is the GPU's
    energy_shared: bool = False
    #: energy_j is the run's estimated part of a GPU it shared with other
    #: processes, split by their SM shares (see gputrace.py)
    energy_estimated: bool = False
    energy_per_unit_j: float | None = None
    avg_power_w: float | None = None
    peak_power_w: float | None = None
    peak_temp_c: float | None = None
    #: the hottest memory (HBM) of the run's GPUs; None on cards without the sensor
    peak_memory_temp_c: float | None = None
    #: mean tensor-pipe activity of the run's GPUs (GPM), beside its MFU
    tensor_active_pct: float | None = None
    throttled_s: float | None = None
    malformed_metrics: int = 0
    summary: dict[str, Any] = field(default_factory=dict)
    error_tail: list[str] = field(default_factory=list)
    #: the preset's tags and the user's (``runs tag``), and the user's note
    tags: list[str] = field(default_factory=list)
    note: str | None = None
    #: the run and checkpoint step a resumed run continues (``run``, ``step``, ``checkpoint``)
    resumed_from: dict[str, Any] = field(default_factory=dict)
    #: who the run's processes ran as: ``alice (uid 1000, through sudo)``
    ran_as: str | None = None
    #: the run's slowdowns with their causes, oldest first (``runs/slowdown/records.py``)
    slowdowns: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_run(cls, run: dict[str, Any], directory: Path | None = None) -> RunSummary:
        """What ``run.json`` says of a run (before it has a state or figures)."""
        preset = run.get("preset") or {}
        return cls(
            id=run.get("id") or (directory.name if directory is not None else ""),
            preset=preset.get("name"),
            title=preset.get("title") or preset.get("name"),
            runner=preset.get("runner"),
            launcher=preset.get("launcher"),
            overrides=run.get("overrides") or {},
            gpus=list(run.get("gpus") or []),
            argv=run.get("argv") or [],
            run_dir=str(directory) if directory is not None else None,
            simulated=bool((run.get("backend") or {}).get("simulated")),
            started_at=run.get("created_at"),
            tags=rundir.string_list(preset.get("tags")),
            resumed_from=dict(run.get("resumed_from") or {}),
            ran_as=user_text(run.get("user")),
        )

    def apply_state(self, state: RunState, now: float | None = None) -> RunSummary:
        """Take where the run stands from its state (``state.json``)."""
        self.status = state.status
        self.started_at = state.started_at or self.started_at
        self.ended_at = state.ended_at
        self.exit_code = state.exit_code
        self.signal = state.signal
        self.oom = state.oom
        self.reason = state.reason
        self.error_tail = list(state.error_tail)
        if self.started_at is not None:
            end = self.ended_at if self.ended_at is not None else (now or time.time())
            self.duration_s = max(0.0, end - self.started_at)
        return self

    @property
    def active(self) -> bool:
        return self.status in rundir.ACTIVE_STATUSES

    def status_text(self) -> str:
        """The status as people read it: ``failed (OOM)``, ``failed (exit 3)`` ..."""
        return rundir.status_label(self.status, self.oom, self.signal, self.exit_code)

    def eta_s(self) -> float | None:
        """Seconds left at the recent rate, from the last report (None when not known)."""
        if not self.active or self.steps is None or not self.total_steps or not self.steps_per_s:
            return None
        return max(0.0, (self.total_steps - self.steps) / self.steps_per_s)
