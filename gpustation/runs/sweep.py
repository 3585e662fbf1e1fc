"""Sweeps: a preset run once per point of a grid, to find the cheapest setting.

``gpustation sweep PRESET --set batch_size=64,128 --set precision=bf16,fp16
--power-limit 60%,80%,100%`` is the grid of every combination, each point a
run in the history tagged ``sweep:<id>``. A sweep lives in
``<data dir>/sweeps/<id>/sweep.json``, written before the first change and
after every point, so a sweep stopped at any moment says what it did.

The power-limit axis goes through :mod:`gpustation.control.power` on every GPU
of the run: validated against each card, journalled, read back and checked
before the point starts. The limits each card had before the sweep are in
``sweep.json`` before any is changed, and are put back when the sweep ends, is
stopped with Ctrl-C or fails; a sweep killed outright (SIGKILL, power loss)
leaves them recorded, and the next sweep (with a power-limit axis or not), or
``gpustation sweeps restore``, puts them back first.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gpustation import paths, privs
from gpustation.control.power import apply_power, plan_power
from gpustation.control.profiles import PowerValue, parse_power_value
from gpustation.errors import GpustationError, NeedsRootError, UsageError
from gpustation.runs import rundir
from gpustation.runs.presets import RunPreset, apply_overrides
from gpustation.telemetry.backend import Backend

SWEEP_JSON = "sweep.json"
#: each point's run is tagged ``sweep:<sweep id>``
SWEEP_TAG = "sweep:"
#: the most points one sweep may have (a typo like 1,2,...,999 is not a plan)
MAX_POINTS = 256


@dataclass
class Point:
    """One point of the grid: its overrides, its power limit, which repeat."""

    index: int
    overrides: dict[str, str]
    power: str | None = None  # as given: "70%", "300W"
    repeat: int = 0
    run_id: str | None = None
    status: str = "pending"  # pending | running | succeeded | failed | oom | stopped
    limits_w: dict[int, float] = field(default_factory=dict)  # read back per GPU
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        parts = [f"{k}={v}" for k, v in self.overrides.items()]
        if self.power is not None:
            parts.append(f"power={self.power}")
        return " ".join(parts) or "(defaults)"


@dataclass
class Sweep:
    id: str
    preset: str
    axes: dict[str, list[str]]
    power_limits: list[str]
    gpus: list[int]
    repeat: int = 1
    warmup_s: float | None = None
    within_pct: float = 5.0
    created_at: float = 0.0
    ended_at: float | None = None
    status: str = "planned"  # planned | running | finished | stopped | failed
    simulated: bool = False
    #: GPU index -> limit in W before the sweep changed anything (power axis only)
    original_limits_w: dict[int, float] = field(default_factory=dict)
    restored: bool = False
    pid: int = 0
    points: list[Point] = field(default_factory=list)

    @property
    def directory(self) -> Path:
        return sweeps_dir() / self.id

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sweep:
        points = [Point(**p) for p in data.get("points", [])]
        for p in points:
            p.limits_w = {int(k): float(v) for k, v in p.limits_w.items()}
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["points"] = points
        known["original_limits_w"] = {
            int(k): float(v) for k, v in (data.get("original_limits_w") or {}).items()
        }
        return cls(**known)

    def save(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        rundir.write_json(self.directory / SWEEP_JSON, self.to_dict())


def sweeps_dir() -> Path:
    return paths.data_dir() / "sweeps"


def load_sweep(sweep_id: str) -> Sweep:
    """A sweep by id or unique prefix (``last`` for the newest)."""
    root = sweeps_dir()
    ids = (
        sorted(p.name for p in root.glob("*") if (p / SWEEP_JSON).exists()) if root.exists() else []
    )
    if sweep_id == "last" and ids:
        match = [ids[-1]]
    else:
        match = [i for i in ids if i == sweep_id] or [i for i in ids if i.startswith(sweep_id)]
    if len(match) != 1:
        what = "no sweep" if not match else f"{len(match)} sweeps"
        raise UsageError(f"{what} matches {sweep_id!r}; `gpustation sweeps list` shows them")
    data = rundir.read_json(root / match[0] / SWEEP_JSON)
    if not isinstance(data, dict):
        raise UsageError(f"sweep {match[0]}: {SWEEP_JSON} cannot be read")
    return Sweep.from_dict(data)


def list_sweeps() -> list[Sweep]:
    root = sweeps_dir()
    out = []
    for path in sorted(root.glob(f"*/{SWEEP_JSON}")) if root.exists() else []:
        data = rundir.read_json(path)
        if isinstance(data, dict):
            try:
                out.append(Sweep.from_dict(data))
            except (TypeError, ValueError):
                continue  # a damaged file is skipped, never the whole list
    return out


# ---- planning -------------------------------------------------------------------


def parse_axes(sets: Sequence[str]) -> dict[str, list[str]]:
    """``--set key=a,b,c`` (repeatable) -> {key: [a, b, c]}."""
    axes: dict[str, list[str]] = {}
    for item in sets:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(
                f"--set {item!r}: expected key=value[,value...], e.g. batch_size=64,128"
            )
        choices = [v.strip() for v in values.split(",")]
        if not all(choices):
            raise UsageError(f"--set {item!r}: an empty value in the list")
        if key in axes:
            raise UsageError(f"--set {key}: given twice; list every value in one --set")
        axes[key] = choices
    return axes


def parse_power_axis(text: str | None) -> list[str]:
    """``--power-limit 60%,70%,300W`` -> each value checked as a power limit."""
    if text is None:
        return []
    values = [v.strip() for v in text.split(",")]
    for v in values:
        try:
            parse_power_value(v)
        except UsageError as err:
            raise UsageError(f"--power-limit: {err}") from None
    return values


def grid(axes: dict[str, list[str]], powers: list[str], repeat: int) -> list[Point]:
    combos = list(itertools.product(*axes.values())) if axes else [()]
    points: list[Point] = []
    choices: list[str | None] = [*powers] if powers else [None]
    for combo in combos:
        overrides = dict(zip(axes, combo, strict=True))
        for power in choices:
            for r in range(repeat):
                points.append(Point(len(points), overrides, power, r))
    if len(points) > MAX_POINTS:
        raise UsageError(f"the grid has {len(points)} points; at most {MAX_POINTS} in one sweep")
    return points


def check_preset_takes(preset: RunPreset, axes: dict[str, list[str]]) -> None:
    """Every value of every axis is one the preset's own default can take."""
    for key, values in axes.items():
        for value in values:
            _, _, warnings = apply_overrides(preset, [f"{key}={value}"])
            if warnings:
                raise UsageError(f"--set {key}: " + "; ".join(warnings))


def plan_limits(
    backend: Backend, gpus: Sequence[int], powers: Sequence[str]
) -> dict[str, dict[int, float]]:
    """Each power value in W per GPU, checked against every card's range now."""
    samples = backend.read_gpus(list(gpus), slow=False)
    out: dict[str, dict[int, float]] = {}
    for value in powers:
        changes = plan_power(samples, parse_power_value(value))
        out[value] = {c.gpu: c.new_w for c in changes}
    return out


# ---- running ----------------------------------------------------------------------

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
        if sweep.power_limits:
            self._take_originals()
        sweep.status = "running"
        sweep.pid = os.getpid()
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
        assert self.backend is not None
        samples = self.backend.read_gpus(self.sweep.gpus, slow=False)
        for s in samples:
            if s.power_limit_w is None:
                raise GpustationError(f"GPU {s.index} does not report its power limit")
            self.sweep.original_limits_w[s.index] = s.power_limit_w
        self.sweep.save()  # before any change: a killed sweep can still be undone

    def _set_limit(self, point: Point) -> None:
        assert self.backend is not None and point.power is not None
        samples = self.backend.read_gpus(self.sweep.gpus, slow=False)
        changes = plan_power(samples, parse_power_value(point.power))
        apply_power(self.backend, changes, f"gpustation sweep {self.sweep.id}: {point.label}")
        after = self.backend.read_gpus(self.sweep.gpus, slow=False)
        for c, s in zip(changes, after, strict=True):
            if s.power_limit_w is None or abs(s.power_limit_w - c.new_w) >= 0.5:
                raise GpustationError(
                    f"GPU {s.index}: asked for {c.new_w:g} W, the card reads {s.power_limit_w} W"
                )
            point.limits_w[s.index] = s.power_limit_w

    def _restore(self) -> None:
        try:
            restore_limits(self.sweep, self.backend)
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
        overrides = [f"{k}={v}" for k, v in point.overrides.items()]
        point.status = "running"
        handle = self.launch(
            preset,
            overrides,
            self.sweep.gpus or None,
            simulate=self.simulate,
            sim_card=self.sim_card,
            stop_grace_s=self.stop_grace_s,
        )
        point.run_id = handle.id
        self.sweep.save()
        self.wait(handle.run_dir)
        from gpustation.runs.sweep_report import point_figures

        point.figures = point_figures(handle.run_dir, self.sweep.warmup_s)
        state = rundir.read_state(handle.run_dir)
        status = state.status if state is not None else "failed"
        point.status = "oom" if state is not None and state.oom else status
        self.say(f"  run {handle.id}: {point.status}" + _figures_text(point.figures))


def restore_limits(sweep: Sweep, backend: Backend | None) -> None:
    """Put every card back to the limit it had before the sweep (journalled)."""
    if not sweep.original_limits_w or sweep.restored:
        return
    if backend is None:
        raise GpustationError("no GPU backend to restore the limits with")
    samples = backend.read_gpus(sorted(sweep.original_limits_w), slow=False)
    for s in samples:
        watts = sweep.original_limits_w[s.index]
        changes = plan_power([s], PowerValue("watts", watts))
        apply_power(backend, changes, f"gpustation sweep {sweep.id}: restore")
    sweep.restored = True
    sweep.save()


def unrestored(simulated: bool) -> list[Sweep]:
    """Sweeps that changed power limits and never put them back, whose process is gone."""
    out = []
    for s in list_sweeps():
        if s.original_limits_w and not s.restored and s.simulated == simulated:
            if s.pid and s.pid != os.getpid() and _alive(s.pid):
                continue
            out.append(s)
    return out


def leftovers_text(leftovers: Sequence[Sweep], backend: Backend | None = None) -> str:
    """What restoring ``leftovers`` changes, per sweep and GPU: ``sweep ID: GPU 0
    315 W -> 450 W`` (the limit now from ``backend`` where it can be read)."""
    now: dict[int, float] = {}
    if backend is not None:
        indices = sorted({i for s in leftovers for i in s.original_limits_w})
        try:
            now = {
                g.index: g.power_limit_w
                for g in backend.read_gpus(indices, slow=False)
                if g.power_limit_w is not None
            }
        except Exception:
            now = {}  # the limits they go back to are still worth saying
    parts = []
    for s in leftovers:
        gpus = ", ".join(
            f"GPU {i} {now[i]:g} W -> {w:g} W" if i in now else f"GPU {i} back to {w:g} W"
            for i, w in sorted(s.original_limits_w.items())
        )
        parts.append(f"sweep {s.id}: {gpus}")
    return "; ".join(parts)


def _refusal(leftovers: Sequence[Sweep], what: str) -> NeedsRootError:
    ids = " ".join(s.id for s in leftovers)
    return NeedsRootError(
        f"a sweep that was killed left power limits changed ({what}); they are put back "
        "before another sweep runs, which needs root: run sudo gpustation sweeps restore "
        f"{ids} (or this sweep with sudo)"
    )


def restore_leftovers(leftovers: Sequence[Sweep], backend: Backend, say: Event) -> None:
    """Put back the limits killed sweeps left, newest first (so that each card
    ends at the limit it had before the oldest); NeedsRootError naming the GPUs,
    the limits and ``sudo gpustation sweeps restore`` when not root."""
    if not leftovers:
        return
    what = leftovers_text(leftovers, backend)
    if not backend.simulated and not privs.can_be_root():
        raise _refusal(leftovers, what)
    say(f"a killed sweep left power limits changed; restoring them first: {what}")
    for old in sorted(leftovers, key=lambda s: (s.created_at, s.id), reverse=True):
        try:
            restore_limits(old, backend)
        except NeedsRootError:
            raise _refusal(leftovers, what) from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def require_root_for(sweep: Sweep, simulated: bool) -> None:
    if sweep.power_limits and not simulated and not privs.can_be_root():
        raise NeedsRootError(
            "a sweep with a power-limit axis changes the cards' limits, which needs root: "
            "run it as sudo gpustation sweep ... (or leave out --power-limit; "
            "--dry-run shows the plan without root)"
        )


def new_sweep_id(preset: str, now: float | None = None) -> str:
    """``YYYYmmdd-HHMMSS-sweep-PRESET``, with ``-2``, ``-3``... when a sweep
    started in the same second already has it (never one directory for two)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    base = f"{stamp}-sweep-{preset}"
    root = sweeps_dir()
    n = 1
    while (root / (base if n == 1 else f"{base}-{n}")).exists():
        n += 1
    return base if n == 1 else f"{base}-{n}"


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


def dumps(sweep: Sweep) -> str:
    return json.dumps(sweep.to_dict(), indent=2, default=str)
