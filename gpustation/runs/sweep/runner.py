"""Running a sweep: one run per point, the power limit of each point set first.

The power-limit axis goes through :mod:`gpustation.control.power` on every GPU
of the run: validated against each card, journalled, read back and checked
before the point starts. Before any change the sweep takes a lease on its GPUs
(:mod:`gpustation.control.lease`: no other program changes their limits while
it lives), and the limit each card had, with the card's UUID, is in
``sweep.json``; they are put back when the sweep ends, is stopped (Ctrl-C,
SIGTERM, SIGHUP) or fails. A sweep killed outright (SIGKILL, power loss)
leaves them recorded, and the next sweep (with a power-limit axis or not), or
``gpustation sweeps restore``, puts them back first
(:mod:`gpustation.runs.sweep.owner`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpustation import paths, privs, procstart
from gpustation.control import lease
from gpustation.control.power import apply_power, plan_power
from gpustation.control.profiles import parse_power_value
from gpustation.errors import GpustationError, NeedsRootError
from gpustation.runs import rundir
from gpustation.runs.presets import RunPreset
from gpustation.runs.sweep.model import SWEEP_TAG, Point, Sweep
from gpustation.runs.sweep.owner import restore_limits
from gpustation.runs.sweep.report import point_figures
from gpustation.telemetry.backend import Backend

#: what a sweep says as it goes (a line at a time)
Event = Callable[[str], None]


@dataclass
class SweepRunner:
    """Runs a planned sweep's points one after another."""

    sweep: Sweep
    preset: RunPreset
    backend: Backend | None  # needed for the power axis
    launch: Callable[..., Any]
    wait: Callable[[Path], None]
    #: stops a point's run (Ctrl-C, SIGTERM) before the limits are put back
    stop: Callable[[Path], object] | None = None
    say: Event = print
    stop_grace_s: float = 10.0
    simulate: int | None = None
    sim_card: str | None = None

    def run(self) -> Sweep:
        sweep = self.sweep
        sweep.pid = os.getpid()
        sweep.pid_start = procstart.process_start(sweep.pid)
        if sweep.power_limits:
            self._take_originals()  # the lease first: refused, nothing is written
        sweep.status = "running"
        sweep.save()
        try:
            for point in sweep.points:
                if point.status != "pending":
                    continue
                self._run_point(point)
                sweep.save()
            sweep.status = "finished"
        except KeyboardInterrupt:
            sweep.status = "stopped"
            self._stop_current()
            raise
        except BaseException:
            sweep.status = "failed"
            raise
        finally:
            sweep.ended_at = time.time()
            if sweep.power_limits:
                self._restore()
            sweep.save()
        return sweep

    def _stop_current(self) -> None:
        for point in self.sweep.points:
            if point.status == "running" and point.run_id and self.stop is not None:
                self.say(f"stopping run {point.run_id}")
                try:
                    self.stop(paths.runs_dir() / point.run_id)
                finally:
                    point.status = "stopped"

    def _take_originals(self) -> None:
        """Take the lease on the sweep's GPUs, then write down each card's limit (by
        UUID) before any is changed: a killed sweep can still be undone."""
        assert self.backend is not None
        samples = self.backend.read_gpus(self.sweep.gpus, slow=False)
        for s in samples:
            if s.power_limit_w is None:
                raise GpustationError(f"GPU {s.index} does not report its power limit")
        lease.take(
            lease.Lease(
                id=self.sweep.id,
                owner=f"sweep {self.sweep.id}",
                gpus=[(s.index, s.uuid) for s in samples],
                simulated=self.backend.simulated,
                restore=f"gpustation sweeps restore {self.sweep.id}",
                pid=self.sweep.pid,
                start=self.sweep.pid_start,
            )
        )
        for s in samples:
            assert s.power_limit_w is not None
            self.sweep.original_limits_w[s.index] = s.power_limit_w
            self.sweep.uuids[s.index] = s.uuid
        try:
            self.sweep.save()
        except BaseException:
            lease.release(self.sweep.id)
            raise

    def _set_limit(self, point: Point) -> None:
        assert self.backend is not None and point.power is not None
        samples = self.backend.read_gpus(self.sweep.gpus, slow=False)
        changes = plan_power(samples, parse_power_value(point.power))
        apply_power(
            self.backend,
            changes,
            f"gpustation sweep {self.sweep.id}: {point.label}",
            owner=self.sweep.id,
        )
        after = self.backend.read_gpus(self.sweep.gpus, slow=False)
        for c, s in zip(changes, after, strict=True):
            if s.power_limit_w is None or abs(s.power_limit_w - c.new_w) >= 0.5:
                raise GpustationError(
                    f"GPU {s.index}: asked for {c.new_w:g} W, the card reads {s.power_limit_w} W"
                )
            point.limits_w[s.index] = s.power_limit_w

    def _restore(self) -> None:
        try:
            for line in restore_limits(self.sweep, self.backend):
                self.say(line)
            if self.sweep.original_limits_w:
                self.say(f"power limits restored: {_limits_text(self.sweep.original_limits_w)}")
        except Exception as err:  # said loudly: the cards are left changed
            self.say(
                f"could not restore the power limits ({err}); run `gpustation sweeps restore "
                f"{self.sweep.id}`"
            )

    def _run_point(self, point: Point) -> None:
        n = len(self.sweep.points)
        self.say(f"point {point.index + 1}/{n}: {point.label}")
        if point.power is not None:
            self._set_limit(point)
            self.say(f"  power limit {_limits_text(point.limits_w)} (read back)")
        preset = replace(self.preset, tags=[*self.preset.tags, f"{SWEEP_TAG}{self.sweep.id}"])
        point.status = "running"
        handle = self.launch(
            preset,
            dict(point.overrides),
            self.sweep.gpus or None,
            simulate=self.simulate,
            sim_card=self.sim_card,
            stop_grace_s=self.stop_grace_s,
        )
        point.run_id = handle.id
        self.sweep.save()
        self.wait(handle.run_dir)
        point.figures = point_figures(handle.run_dir, self.sweep.warmup_s)
        state = rundir.read_state(handle.run_dir)
        status = state.status if state is not None else "failed"
        point.status = "oom" if state is not None and state.oom else status
        self.say(f"  run {handle.id}: {point.status}" + _figures_text(point.figures))


def require_root_for(sweep: Sweep, simulated: bool) -> None:
    if sweep.power_limits and not simulated and not privs.can_be_root():
        raise NeedsRootError(
            "a sweep with a power-limit axis changes the cards' limits, which needs root: "
            "run it as sudo gpustation sweep ... (or leave out --power-limit; "
            "--dry-run shows the plan without root)"
        )


def _limits_text(limits: dict[int, float]) -> str:
    return ", ".join(f"GPU {i} {w:g} W" for i, w in sorted(limits.items())) or "none"


def _figures_text(figures: dict[str, Any]) -> str:
    tp = figures.get("throughput")
    jpu = figures.get("energy_per_unit_j")
    unit = figures.get("unit") or "/s"
    parts = []
    if isinstance(tp, (int, float)):
        parts.append(f"{tp:,.1f} {unit}")
    if isinstance(jpu, (int, float)):
        parts.append(f"{jpu:.4g} J/{figures.get('work_unit') or 'unit'}")
    return (" - " + ", ".join(parts)) if parts else ""
