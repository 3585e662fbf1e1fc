"""The forecast itself: from past runs' facts and a planned run, its time, energy and memory.

Pure: no file, no clock, no GPU. Each past run (:class:`RunFacts`) is split
into a fixed part and a per-step part (time and energy), and its peak memory
into a static part and a part that grows with the work of a step. The planned
run (:class:`Plan`) changes what changed from each past run:

- steps scale the per-step part only (compile, load and save stay as they were);
- work per step per GPU (batch x sequence) scales the step time by an exponent
  fitted on the history when it holds two work sizes or more, else throughput
  is taken as constant (step time grows with the work: said so); a compiled
  model (``compile``) meets a new work size with a cold compile, so the slowest
  start of the history is taken;
- the GPU count is taken as data-parallel: the per-GPU work is kept, so the
  step time too, and the energy grows with the GPUs;
- the power limit: the past runs at that limit where there are some, else a
  line fitted through the limits the history holds (two or more), else the
  history as it is, said as not fitted;
- memory: static part + the growing part x the work's ratio, or a line fitted
  on the peaks where the history holds two work sizes or more.

Each past run then gives its own prediction and the forecast is their median,
with how many runs each figure rests on. No usable history gives a forecast
that says so.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gpustation.runs.cost import J_PER_KWH
from gpustation.runs.forecast.fit import least_squares

#: two limits within this share of each other are one limit (450 W and 449.9 W)
SAME_LIMIT = 0.02
#: the work exponent is kept within these bounds (a noisy fit on two close sizes)
MIN_EXPONENT, MAX_EXPONENT = 0.0, 2.0


# ---- what goes in ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunFacts:
    """What one past run says about itself (see ``facts.py``); None = not known.

    ``overhead_s`` is the duration less ``steps x step_s`` (start, compile, load,
    save); ``overhead_energy_j`` the energy less the steady power over that
    stepping time. Power and energy are of all the run's GPUs together; memory is
    per GPU (the busiest).
    """

    run_id: str
    duration_s: float
    started_at: float | None = None
    steps: int | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    gpu_count: int = 1
    power_limit_w: float | None = None
    step_s: float | None = None
    overhead_s: float | None = None
    energy_j: float | None = None
    steady_power_w: float | None = None
    overhead_energy_j: float | None = None
    peak_mib: float | None = None
    static_mib: float | None = None
    #: the run's other settings (its preset's arguments less steps, batch, sequence ...)
    settings: Mapping[str, Any] = field(default_factory=dict)
    simulated: bool = False
    probe: bool = False

    @property
    def work(self) -> float | None:
        return work_of(self.batch_size, self.seq_len)


@dataclass(frozen=True)
class GpuRoom:
    """A GPU the run would use: its memory and power limit now (None: not read)."""

    index: int
    total_mib: float | None = None
    used_mib: float | None = None
    power_limit_w: float | None = None

    @property
    def free_mib(self) -> float | None:
        if self.total_mib is None or self.used_mib is None:
            return None
        return max(0.0, self.total_mib - self.used_mib)


@dataclass(frozen=True)
class Plan:
    """The run about to start: its features as a launch would resolve them."""

    preset: str
    steps: int | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    gpus: tuple[int, ...] = ()
    power_limit_w: float | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    simulated: bool = False
    rooms: tuple[GpuRoom, ...] = ()

    @property
    def work(self) -> float | None:
        return work_of(self.batch_size, self.seq_len)

    @property
    def gpu_count(self) -> int:
        return max(1, len(self.gpus))


def work_of(batch_size: int | None, seq_len: int | None) -> float | None:
    """Work per step per GPU: batch x sequence length for token runners, the batch else."""
    if batch_size is None:
        return None
    return float(batch_size) * (seq_len if seq_len else 1)


# ---- what comes out ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryFit:
    """The forecast peak against one GPU's free memory (``fits`` None: not known)."""

    index: int
    free_mib: float | None
    total_mib: float | None
    fits: bool | None


@dataclass
class Forecast:
    """A planned run's time, GPU energy, cost and peak memory, each with the runs it rests on."""

    preset: str
    #: the past runs used, newest first
    run_ids: list[str] = field(default_factory=list)
    #: of those, probe runs
    probe_runs: int = 0
    #: runs of the preset that could not be read (damaged files)
    skipped: int = 0
    duration_s: float | None = None
    duration_runs: int = 0
    energy_j: float | None = None
    energy_runs: int = 0
    cost: float | None = None
    currency: str | None = None
    peak_vram_mib: float | None = None
    memory_runs: int = 0
    gpus: list[MemoryFit] = field(default_factory=list)
    #: what was carried beyond the history ("batch 256 -> 512")
    extrapolated: list[str] = field(default_factory=list)
    #: how it was fitted, where that is worth saying
    notes: list[str] = field(default_factory=list)
    simulated: bool = False
    #: the planned run's features
    plan: dict[str, Any] = field(default_factory=dict)

    @property
    def runs(self) -> int:
        return len(self.run_ids)

    @property
    def fits(self) -> bool | None:
        """Whether the peak fits every GPU's free memory (None: not known for one)."""
        known = [g.fits for g in self.gpus]
        if not known or any(f is None for f in known):
            return None
        return all(known)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["runs"] = self.runs
        doc["fits"] = self.fits
        return doc

    @classmethod
    def from_dict(cls, doc: Any) -> Forecast | None:
        """A forecast as ``to_dict`` wrote it (run.json); None for anything else.

        What is of the wrong type is left out, as from any file a run can replace.
        """
        if not isinstance(doc, dict) or not isinstance(doc.get("preset"), str):
            return None
        out = cls(preset=doc["preset"])
        for name in ("duration_s", "energy_j", "cost", "peak_vram_mib"):
            setattr(out, name, _number(doc.get(name)))
        for name in ("probe_runs", "skipped", "duration_runs", "energy_runs", "memory_runs"):
            value = doc.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                setattr(out, name, value)
        for name in ("run_ids", "extrapolated", "notes"):
            value = doc.get(name)
            if isinstance(value, list):
                setattr(out, name, [v for v in value if isinstance(v, str)])
        if isinstance(doc.get("currency"), str):
            out.currency = doc["currency"]
        out.simulated = doc.get("simulated") is True
        if isinstance(doc.get("plan"), dict):
            out.plan = dict(doc["plan"])
        gpus = doc.get("gpus")
        for gpu in gpus if isinstance(gpus, list) else []:
            if isinstance(gpu, dict) and isinstance(gpu.get("index"), int):
                fits = gpu.get("fits")
                out.gpus.append(
                    MemoryFit(
                        gpu["index"],
                        _number(gpu.get("free_mib")),
                        _number(gpu.get("total_mib")),
                        fits if isinstance(fits, bool) else None,
                    )
                )
        return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


# ---- the forecast ------------------------------------------------------------------------------


@dataclass
class _Scales:
    """How each past run is carried to the plan: work exponent, limit factors."""

    exponent: float = 1.0
    #: (step time, power) factor per run id, from the power-limit fit
    limit: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: peak memory from a line over the work sizes (None: static + growing part)
    memory_line: tuple[float, float] | None = None
    #: the run whose start (overhead) every run's prediction takes: a compiled model
    #: meets a new work size with a cold compile (None: each run its own)
    start: RunFacts | None = None


def forecast(
    plan: Plan,
    history: Sequence[RunFacts],
    *,
    price_per_kwh: float | None = None,
    currency: str | None = None,
    skipped: int = 0,
) -> Forecast:
    """The forecast of ``plan`` from ``history`` (newest first), priced at ``price_per_kwh``."""
    out = Forecast(
        preset=plan.preset,
        skipped=skipped,
        simulated=plan.simulated,
        plan={
            "steps": plan.steps,
            "batch_size": plan.batch_size,
            "seq_len": plan.seq_len,
            "gpus": list(plan.gpus),
            "gpu_count": plan.gpu_count,
            "power_limit_w": plan.power_limit_w,
        },
    )
    # real GPUs' figures from real runs where there are some (a simulated card's
    # energy is no measure of a real one's), simulated ones' from simulated runs
    same_kind = [f for f in history if f.simulated == plan.simulated]
    runs = _same_settings(plan, same_kind or list(history), out.notes)
    runs = _at_limit(plan, runs, out.notes)
    if skipped:
        out.notes.append(f"{skipped} damaged run{'s' if skipped != 1 else ''} skipped")
    if not runs:
        out.gpus = _memory_fits(plan, None)
        return out
    out.run_ids = [f.run_id for f in runs]
    out.probe_runs = sum(f.probe for f in runs)
    out.simulated = plan.simulated or any(f.simulated for f in runs)
    scales = _Scales(exponent=_work_exponent(plan, runs, out.notes))
    scales.limit = _limit_factors(plan, runs, scales.exponent, out.notes)
    scales.memory_line = _memory_line(runs)
    scales.start = _cold_start(plan, runs, out.notes)
    out.extrapolated = _extrapolated(plan, runs)

    durations, energies, peaks = [], [], []
    static_unknown = False
    for f in runs:
        duration, energy = _time_and_energy(plan, f, scales)
        if duration is not None:
            durations.append(duration)
        if energy is not None:
            energies.append(energy)
        peak, guessed = _peak(plan, f, scales)
        if peak is not None:
            peaks.append(peak)
            static_unknown = static_unknown or guessed
    out.duration_s, out.duration_runs = _median(durations), len(durations)
    out.energy_j, out.energy_runs = _median(energies), len(energies)
    out.peak_vram_mib, out.memory_runs = _median(peaks), len(peaks)
    if static_unknown:
        out.notes.append("no static memory reported: the whole peak scaled with the work")
    if len(durations) < len(runs):
        out.notes.append(f"{len(runs) - len(durations)} of the runs reported no steps to scale by")
    if price_per_kwh is not None and out.energy_j is not None:
        out.cost = out.energy_j / J_PER_KWH * price_per_kwh
        out.currency = currency
    out.gpus = _memory_fits(plan, out.peak_vram_mib)
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _names(keys: set[str]) -> str:
    return ", ".join(sorted(keys))


def _same_settings(plan: Plan, runs: list[RunFacts], notes: list[str]) -> list[RunFacts]:
    """The runs with the plan's other settings; all of them (said so) where none has."""
    same = [f for f in runs if dict(f.settings) == dict(plan.settings)]
    if same or not runs:
        return same
    differ: set[str] = set()
    for f in runs:
        keys = set(f.settings) | set(plan.settings)
        differ |= {k for k in keys if f.settings.get(k) != plan.settings.get(k)}
    notes.append(f"no past run with these settings: {_names(differ)} differ")
    return runs


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= SAME_LIMIT * max(abs(a), abs(b))


def _limit_text(watts: float) -> str:
    return f"{watts:.0f} W"


def _at_limit(plan: Plan, runs: list[RunFacts], notes: list[str]) -> list[RunFacts]:
    """The runs at the plan's power limit, where there are some; else all of them."""
    target = plan.power_limit_w
    known = [f for f in runs if f.power_limit_w is not None]
    if target is None or not known:
        return runs
    at = [f for f in known if _close(f.power_limit_w or 0.0, target)]
    if at:
        return at
    limits = sorted({round(f.power_limit_w or 0.0) for f in known})
    if len(limits) < 2:
        notes.append(
            f"power limit {_limit_text(target)}: the history ran at "
            f"{_limit_text(limits[0])}; not fitted"
        )
    return runs


def _limit_factors(
    plan: Plan, runs: list[RunFacts], exponent: float, notes: list[str]
) -> dict[str, tuple[float, float]]:
    """Per run, the factors that carry its step time and power to the plan's limit,
    from lines fitted through the limits the history holds (two or more)."""
    target = plan.power_limit_w
    known = [f for f in runs if f.power_limit_w is not None and f.step_s is not None]
    if target is None or any(_close(f.power_limit_w or 0.0, target) for f in known):
        return {}
    limits = {round(f.power_limit_w or 0.0) for f in known}
    if len(limits) < 2:
        return {}
    # each run's step time and power carried to the plan's work first, so the line
    # sees the limit's effect alone
    steps = [(f.power_limit_w or 0.0, _step_s(plan, f, exponent) or 0.0) for f in known]
    powers = [
        (f.power_limit_w or 0.0, f.steady_power_w / f.gpu_count)
        for f in known
        if f.steady_power_w is not None
    ]
    step_line = least_squares(steps)
    power_line = least_squares(powers)
    lo, hi = min(limits), max(limits)
    notes.append(
        f"power limit {_limit_text(target)}: fitted on {len(limits)} limits "
        f"({lo:.0f}-{hi:.0f} W)" + ("" if lo <= target <= hi else ", beyond them")
    )
    factors: dict[str, tuple[float, float]] = {}
    for f in known:
        limit = f.power_limit_w or 0.0
        step_factor = _ratio(step_line, target, limit)
        power_factor = _ratio(power_line, target, limit)
        factors[f.run_id] = (step_factor, power_factor)
    return factors


def _ratio(line: tuple[float, float] | None, target: float, at: float) -> float:
    """line(target) / line(at); 1 where the line says nothing sound there."""
    if line is None:
        return 1.0
    there, here = line[0] * target + line[1], line[0] * at + line[1]
    if there <= 0 or here <= 0:
        return 1.0
    return there / here


def _work_exponent(plan: Plan, runs: list[RunFacts], notes: list[str]) -> float:
    """How step time grows with the work per step: fitted on two work sizes or more,
    else 1 (constant throughput), said so where the plan's work differs."""
    points = [
        (math.log(w), math.log(f.step_s))
        for f in runs
        if (w := f.work) is not None and w > 0 and f.step_s is not None and f.step_s > 0
    ]
    line = least_squares(points)
    if line is not None:
        return min(MAX_EXPONENT, max(MIN_EXPONENT, line[0]))
    target = plan.work
    if target is not None and any(f.work is not None and f.work != target for f in runs):
        notes.append("throughput taken as constant: the history holds one work size")
    return 1.0


def _work_ratio(plan: Plan, f: RunFacts) -> float:
    target, had = plan.work, f.work
    if target is None or had is None or had <= 0:
        return 1.0
    return target / had


def _step_s(plan: Plan, f: RunFacts, exponent: float) -> float | None:
    if f.step_s is None:
        return None
    return f.step_s * math.pow(_work_ratio(plan, f), exponent)


def _cold_start(plan: Plan, runs: list[RunFacts], notes: list[str]) -> RunFacts | None:
    """The run with the slowest start, when the plan compiles its model (``compile``)
    for a work size none of the runs had: torch.compile's cache holds compiled code by
    shape, so the run compiles as the first one of a preset did. None otherwise."""
    target = plan.work
    if plan.settings.get("compile") is not True or target is None:
        return None
    if any(f.work == target for f in runs):
        return None
    timed = [f for f in runs if f.overhead_s is not None]
    if len(timed) < 2:
        return None  # one start is the start the forecast takes anyway
    notes.append("a new work size compiles anew: the slowest start of the history taken")
    return max(timed, key=lambda f: f.overhead_s or 0.0)


def _time_and_energy(plan: Plan, f: RunFacts, scales: _Scales) -> tuple[float | None, float | None]:
    """One past run's prediction of the plan's duration and energy."""
    steps = plan.steps if plan.steps is not None else f.steps
    unchanged = (
        (steps is None or steps == f.steps)
        and _work_ratio(plan, f) == 1.0
        and plan.gpu_count == f.gpu_count
        and f.run_id not in scales.limit
    )
    if f.step_s is None or f.overhead_s is None or steps is None:
        # nothing to scale by: only a run like the plan answers
        return (f.duration_s, f.energy_j) if unchanged else (None, None)
    step_factor, power_factor = scales.limit.get(f.run_id, (1.0, 1.0))
    step_s = (_step_s(plan, f, scales.exponent) or 0.0) * step_factor
    stepping_s = steps * step_s
    start = scales.start or f
    duration = max(0.0, (start.overhead_s or 0.0) + stepping_s)
    energy = None
    if f.steady_power_w is not None and start.overhead_energy_j is not None:
        # per GPU, then times the plan's GPUs
        power_w = f.steady_power_w * power_factor / f.gpu_count
        if plan.power_limit_w is not None and f.run_id in scales.limit:
            power_w = min(power_w, plan.power_limit_w)
        overhead_j = start.overhead_energy_j / start.gpu_count
        energy = max(0.0, plan.gpu_count * (overhead_j + power_w * stepping_s))
    elif unchanged:
        energy = f.energy_j
    return duration, energy


def _memory_line(runs: list[RunFacts]) -> tuple[float, float] | None:
    """Peak memory against work: a line over two work sizes or more (None: fewer)."""
    points = [
        (w, peak) for f in runs if (w := f.work) is not None and (peak := f.peak_mib) is not None
    ]
    line = least_squares(points)
    if line is None or line[0] <= 0:
        return None
    return line


def _peak(plan: Plan, f: RunFacts, scales: _Scales) -> tuple[float | None, bool]:
    """One past run's prediction of the peak memory per GPU, and whether it scaled
    the whole peak for want of a static part."""
    if f.peak_mib is None:
        return None, False
    ratio = _work_ratio(plan, f)
    if ratio == 1.0:
        return f.peak_mib, False
    if scales.memory_line is not None and plan.work is not None:
        slope, intercept = scales.memory_line
        return max(0.0, intercept + slope * plan.work), False
    if f.static_mib is None:
        return f.peak_mib * ratio, True
    static = min(f.static_mib, f.peak_mib)
    return static + (f.peak_mib - static) * ratio, False


def _memory_fits(plan: Plan, peak_mib: float | None) -> list[MemoryFit]:
    out = []
    for room in plan.rooms:
        free = room.free_mib
        fits = None if peak_mib is None or free is None else peak_mib <= free
        out.append(MemoryFit(room.index, free, room.total_mib, fits))
    return out


def _values_text(values: set[Any]) -> str:
    ordered = sorted(values)
    if len(ordered) <= 2:
        return ",".join(f"{v:,}" for v in ordered)
    return f"{ordered[0]:,}-{ordered[-1]:,}"


def _extrapolated(plan: Plan, runs: list[RunFacts]) -> list[str]:
    """What the plan has that no past run had: ``batch 256 -> 512`` ..."""
    out = []
    checks: list[tuple[str, Any, Callable[[RunFacts], Any]]] = [
        ("steps", plan.steps, lambda f: f.steps),
        ("batch", plan.batch_size, lambda f: f.batch_size),
        ("sequence", plan.seq_len, lambda f: f.seq_len),
        ("GPUs", plan.gpu_count, lambda f: f.gpu_count),
    ]
    for label, wanted, of in checks:
        had = {v for f in runs if (v := of(f)) is not None}
        if wanted is None or not had or wanted in had:
            continue
        text = f"{label} {_values_text(had)} -> {wanted:,}"
        out.append(text + (" (data-parallel)" if label == "GPUs" else ""))
    limit = plan.power_limit_w
    had_limits = {round(f.power_limit_w) for f in runs if f.power_limit_w is not None}
    if limit is not None and had_limits and not any(_close(limit, h) for h in had_limits):
        out.append(f"power limit {_values_text(had_limits)} -> {limit:,.0f} W")
    return out


# ---- against what happened ---------------------------------------------------------------------


@dataclass(frozen=True)
class Versus:
    """One figure of a run: forecast, actual, and the forecast's error in % of the actual."""

    figure: str
    forecast: float | None
    actual: float | None

    @property
    def error_pct(self) -> float | None:
        if self.forecast is None or self.actual is None or self.actual == 0:
            return None
        return 100.0 * (self.forecast - self.actual) / abs(self.actual)


def versus(fc: Forecast, actual: Mapping[str, float | None]) -> list[Versus]:
    """The forecast's figures beside ``actual`` (duration_s, energy_j, cost, peak_vram_mib)."""
    return [
        Versus("duration_s", fc.duration_s, actual.get("duration_s")),
        Versus("energy_j", fc.energy_j, actual.get("energy_j")),
        Versus("cost", fc.cost, actual.get("cost")),
        Versus("peak_vram_mib", fc.peak_vram_mib, actual.get("peak_vram_mib")),
    ]
