"""A sweep's plan and record: its grid of points, ``sweep.json`` and reading sweeps back.

``gpustation sweep PRESET --set batch_size=64,128 --set precision=bf16,fp16
--power-limit 60%,80%,100%`` is the grid of every combination, each point a
run in the history tagged ``sweep:<id>``. A sweep lives in
``<data dir>/sweeps/<id>/sweep.json``, written before the first change and
after every point, so a sweep stopped at any moment says what it did. Running
one is :mod:`gpustation.runs.sweep.runner`; the limits a killed sweep left are
put back by :mod:`gpustation.runs.sweep.owner`; what a sweep found is
:mod:`gpustation.runs.sweep.report`.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpustation import paths, procstart, timefmt
from gpustation.control.power import plan_power
from gpustation.control.profiles import parse_power_value
from gpustation.errors import UsageError
from gpustation.runs import rundir
from gpustation.runs.presets import RunPreset, apply_values
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
    #: GPU index (when the sweep started) -> its UUID: the limit goes back to that card
    uuids: dict[int, str | None] = field(default_factory=dict)
    restored: bool = False
    pid: int = 0
    #: the start of process ``pid`` (:func:`gpustation.control.procstart.process_start`)
    pid_start: str | None = None
    points: list[Point] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        """True while the process that ran this sweep still runs."""
        return bool(self.pid) and procstart.process_matches(self.pid, self.pid_start)

    @property
    def dead(self) -> bool:
        """Marked running, its process gone: killed outright (SIGKILL, power loss)."""
        return self.status in ("planned", "running") and not self.alive

    def state_text(self) -> str:
        """The status in words, with whether its process is gone and the limits it left."""
        if not self.dead:
            return self.status
        started = timefmt.full(self.created_at)
        text = f"dead: its process (pid {self.pid}, started {started}) is gone"
        if self.left_limits:
            text += f"; limits left changed: `gpustation sweeps restore {self.id}`"
        return text

    @property
    def left_limits(self) -> bool:
        """Its limits are still changed and nobody will put them back but a restore."""
        return bool(self.original_limits_w) and not self.restored and not self.alive

    @property
    def directory(self) -> Path:
        return sweeps_dir() / self.id

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Sweep:
        """A sweep from its ``sweep.json``; ValueError naming the field that is wrong."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        for name, types in _FIELD_TYPES.items():
            if name in data and not _of_type(data[name], types):
                raise ValueError(f"{name!r} is not {_describe(types)}")
        for name in ("id", "preset"):
            if not isinstance(data.get(name), str) or not data[name]:
                raise ValueError(f"{name!r} is missing")
        points = []
        for n, p in enumerate(data.get("points") or []):
            if not isinstance(p, dict):
                raise ValueError(f"point {n + 1} is not an object")
            for name, types in _POINT_TYPES.items():
                if name in p and not _of_type(p[name], types):
                    raise ValueError(f"point {n + 1}: {name!r} is not {_describe(types)}")
            known_p = {k: v for k, v in p.items() if k in Point.__dataclass_fields__}
            try:
                point = Point(**known_p)
            except TypeError:
                raise ValueError(f"point {n + 1} lacks its index or overrides") from None
            point.limits_w = {int(k): _watts(v) for k, v in point.limits_w.items()}
            points.append(point)
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["points"] = points
        known["original_limits_w"] = {
            int(k): _watts(v) for k, v in (data.get("original_limits_w") or {}).items()
        }
        known["uuids"] = {
            int(k): None if v is None else str(v) for k, v in (data.get("uuids") or {}).items()
        }
        return cls(**known)

    def save(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        rundir.write_json(self.directory / SWEEP_JSON, self.to_dict())


_NUMBER = (int, float)
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "axes": (dict,),
    "power_limits": (list,),
    "gpus": (list,),
    "repeat": (int,),
    "warmup_s": (int, float, type(None)),
    "within_pct": _NUMBER,
    "created_at": _NUMBER,
    "ended_at": (int, float, type(None)),
    "status": (str,),
    "simulated": (bool,),
    "original_limits_w": (dict,),
    "uuids": (dict,),
    "restored": (bool,),
    "pid": (int,),
    "pid_start": (str, type(None)),
    "points": (list,),
}
_POINT_TYPES: dict[str, tuple[type, ...]] = {
    "index": (int,),
    "overrides": (dict,),
    "power": (str, type(None)),
    "repeat": (int,),
    "run_id": (str, type(None)),
    "status": (str,),
    "limits_w": (dict,),
    "figures": (dict,),
}


def _of_type(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def _describe(types: tuple[type, ...]) -> str:
    names = {
        dict: "an object",
        list: "a list",
        str: "text",
        int: "a whole number",
        float: "a number",
        bool: "true or false",
        type(None): "null",
    }
    return " or ".join(dict.fromkeys(names[t] for t in types))


def _watts(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, _NUMBER):
        raise ValueError(f"a power limit of {value!r}, not watts")
    watts = float(value)
    if not (math.isfinite(watts) and 0 < watts <= 5000):
        raise ValueError(f"a power limit of {value!r} W")
    return watts


def sweeps_dir() -> Path:
    return paths.data_dir() / "sweeps"


def read_sweep_file(path: Path) -> Sweep:
    """One ``sweep.json``; UsageError naming the file and what is wrong with it."""
    data = rundir.read_json(path)
    if data is None:
        raise UsageError(f"{path} cannot be read (not JSON); move it away or delete it")
    try:
        return Sweep.from_dict(data)
    except (TypeError, ValueError) as err:
        raise UsageError(f"{path} is damaged ({err}); move it away or delete it") from None


def load_sweep(sweep_id: str) -> Sweep:
    """A sweep by id or unique prefix (``last`` for the newest)."""
    root = sweeps_dir()
    if sweep_id == "last" and (sweeps := list_sweeps()):
        # by when it started: older ids were stamped in local time, newer ones in UTC
        return sweeps[-1]
    ids = (
        sorted(p.name for p in root.glob("*") if (p / SWEEP_JSON).exists()) if root.exists() else []
    )
    match = [i for i in ids if i == sweep_id] or [i for i in ids if i.startswith(sweep_id)]
    if len(match) != 1:
        what = "no sweep" if not match else f"{len(match)} sweeps"
        raise UsageError(f"{what} matches {sweep_id!r}; `gpustation sweeps list` shows them")
    return read_sweep_file(root / match[0] / SWEEP_JSON)


def list_sweeps() -> list[Sweep]:
    """Every sweep that can be read (a damaged file is skipped, never the whole list)."""
    return scan_sweeps()[0]


def scan_sweeps() -> tuple[list[Sweep], list[str]]:
    """Every sweep, and one line per ``sweep.json`` that cannot be read: its path and why."""
    root = sweeps_dir()
    out: list[Sweep] = []
    damaged: list[str] = []
    for path in sorted(root.glob(f"*/{SWEEP_JSON}")) if root.exists() else []:
        try:
            out.append(read_sweep_file(path))
        except UsageError as err:
            damaged.append(str(err))
    out.sort(key=lambda sweep: (sweep.created_at, sweep.id))
    return out, damaged


# ---- planning -------------------------------------------------------------------


def parse_axes(sets: Sequence[str]) -> dict[str, list[str]]:
    """``--set key=a,b,c`` (repeatable) -> {key: [a, b, c]}."""
    axes: dict[str, list[str]] = {}
    for item in sets:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(
                "expected key=value[,value...], e.g. batch_size=64,128",
                field="set",
                subject=repr(item),
            )
        choices = [v.strip() for v in values.split(",")]
        if not all(choices):
            raise UsageError("an empty value in the list", field="set", subject=repr(item))
        if key in axes:
            raise UsageError("given twice; list every value in one --set", field="set", subject=key)
        axes[key] = choices
    return axes


def parse_power_axis(text: str | None) -> list[str]:
    """``--power-limit 60%,70%,300W`` -> each value checked as a power limit."""
    if text is None:
        return []
    values = [v.strip() for v in text.split(",")]
    for v in values:
        if not v:
            raise UsageError("an empty value in the list", field="power_limit", subject=repr(text))
        try:
            value = parse_power_value(v)
        except ValueError as err:
            raise UsageError(str(err), field="power_limit", subject=repr(v)) from None
        if value.kind != "default" and not math.isfinite(value.amount):
            raise UsageError(
                "expected watts (300W) or a percentage of the default (80%)",
                field="power_limit",
                subject=repr(v),
            )
    if len(set(values)) != len(values):
        raise UsageError("a value given twice", field="power_limit", subject=repr(text))
    return values


def grid(axes: dict[str, list[str]], powers: list[str], repeat: int) -> list[Point]:
    # counted before any is built: a typo of a grid must not fill the memory
    size = math.prod(len(v) for v in axes.values()) * max(1, len(powers)) * repeat
    if size > MAX_POINTS:
        raise UsageError(f"the grid has {size} points; at most {MAX_POINTS} in one sweep")
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
            _, _, warnings = apply_values(preset, {key: value})
            if warnings:
                raise UsageError("; ".join(warnings), field="set", subject=key)


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


def new_sweep_id(preset: str, now: float | None = None) -> str:
    """``YYYYmmdd-HHMMSS-sweep-PRESET``, with ``-2``, ``-3``... when a sweep
    started in the same second already has it (never one directory for two)."""
    stamp = timefmt.file_stamp(now)
    base = f"{stamp}-sweep-{preset}"
    root = sweeps_dir()
    n = 1
    while (root / (base if n == 1 else f"{base}-{n}")).exists():
        n += 1
    return base if n == 1 else f"{base}-{n}"


def dumps(sweep: Sweep) -> str:
    return json.dumps(sweep.to_dict(), indent=2, default=str)
