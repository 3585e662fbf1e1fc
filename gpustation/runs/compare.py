"""Runs side by side: the table of ``runs compare`` and of the runs screen's compare view.

One table for both. Each row has one number format (thousands separators,
the same decimals in every cell, the unit once in the row's label); a cell
equal to the first run's shows ``=``; a change from the first run is given
only between like and like: runs of one workload for the figures whose
meaning depends on it (a ResNet step is not a LoRA step, img/s is not
tokens/s), any runs for the physical ones (watts, joules, seconds). The
settings (the preset's arguments with ``--set`` applied) that differ are
rows; those equal in every run are said once, after the table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpustation.runs import rundir
from gpustation.runs.cost import load_price
from gpustation.runs.fold import finite_number
from gpustation.runs.summary import RunSummary
from gpustation.telemetry.format import NA
from gpustation.telemetry.format import duration as fmt_duration
from gpustation.textsafe import safe


def fmt_num(value: float | None, digits: int = 1, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return NA
    if abs(value) >= 10000:
        text = f"{value:,.0f}"
    elif abs(value) < 0.01 and value != 0:
        text = f"{value:.3g}"
    else:
        text = f"{value:.{digits}f}"
    return f"{text} {unit}".rstrip()


def fmt_energy(joules: float | None) -> str:
    if joules is None:
        return NA
    if joules >= 3.6e6:
        return f"{joules / 3.6e6:.2f} kWh"
    if joules >= 3600:
        return f"{joules / 3600:.1f} Wh"
    return f"{joules:.0f} J"


def status_text(record: RunSummary) -> str:
    return record.status_text()


#: what marks a run on simulated GPUs wherever a run is shown
SIMULATED = "SIMULATED"


def gpus_text(record: RunSummary, none: str = NA) -> str:
    """The run's GPUs, ``0,1 SIMULATED`` when they were simulated ones."""
    text = ",".join(map(str, record.gpus)) or none
    return f"{text} {SIMULATED}" if record.simulated else text


def sim_marked(record: RunSummary, text: str) -> str:
    """``text``, a figure read from the run's GPUs, marked SIMULATED when they were."""
    if text in ("-", NA) or not record.simulated:
        return text
    return f"{text} {SIMULATED}"


def energy_text(record: RunSummary) -> str:
    """The run's GPU energy, ``(shared)`` beside it when another run used its GPUs too
    and its part is not known, ``(estimated)`` when it is its estimated part, SIMULATED
    when its GPUs were simulated."""
    text = fmt_energy(record.energy_j)
    if record.energy_j is None:
        return text
    if record.energy_shared:
        text = f"{text} (shared)"
    elif record.energy_estimated:
        text = f"{text} (estimated)"
    return sim_marked(record, text)


# ---- one number format per row ------------------------------------------------------------


#: a cell never shows fewer significant figures than this (0.341 beside 19,489 stays 0.341)
SIGNIFICANT = 3


def row_decimals(values: Sequence[Any], digits: int) -> int:
    """The decimals every cell of a row gets: ``digits``, none for big numbers, more where
    the smallest fraction would show fewer than :data:`SIGNIFICANT` figures; the same in
    each cell (a small value beside a big one gets its own, see :func:`fmt_fixed`)."""
    nums = [abs(n) for n in map(finite_number, values) if n is not None]
    if not nums:
        return digits
    if max(nums) >= 10000:
        return 0
    return max(digits, max(_decimals_kept(n) for n in nums))


def _decimals_kept(number: float) -> int:
    """The decimals ``number`` needs to keep :data:`SIGNIFICANT` figures, or all its own
    where it has fewer (0.25 keeps 2; 0.34129 keeps 3; an integer none)."""
    if not number or number.is_integer():
        return 0
    own = len(f"{abs(number):.10f}".rstrip("0").partition(".")[2])
    return min(own, max(0, SIGNIFICANT - 1 - math.floor(math.log10(abs(number)))))


def fmt_fixed(value: Any, decimals: int) -> str:
    """``value`` with thousands separators and ``decimals`` decimals (n/a: none), or more
    where ``decimals`` would cut it below :data:`SIGNIFICANT` figures."""
    number = finite_number(value)
    if number is None:
        return NA if value is None else safe(value)
    return f"{number:,.{max(decimals, _decimals_kept(number))}f}"


def with_unit(label: str, unit: str | None) -> str:
    return f"{label} ({unit})" if unit else label


@dataclass
class CompareRow:
    """One row of the comparison: a value per run, shown with its change from the first.

    ``digits`` gives the row one number format (see :func:`row_decimals`);
    without it each value goes through ``fmt``. ``kinds`` says what each
    value measures: a change is given only where a run's kind is the first
    run's (``None``: every value is of one kind). ``units``, when the runs
    differ in unit, is each cell's own (the label carries the unit otherwise).
    """

    name: str
    values: list[Any]
    fmt: Callable[[Any], str] = str
    numeric: bool = True
    digits: int | None = None
    kinds: list[Hashable] | None = None
    units: list[str | None] | None = None
    #: a setting (a preset argument, ``--set``) rather than a result
    setting: bool = False
    #: a word after each run's value (SIMULATED for a figure read from simulated GPUs)
    marks: list[str | None] | None = None

    def comparable(self, i: int) -> bool:
        """Whether run ``i``'s value may be set against the first run's."""
        return self.kinds is None or self.kinds[i] == self.kinds[0]

    def changes(self) -> list[float | None]:
        """Percent change of each value from the first run's (None when not comparable)."""
        if not self.numeric:
            return [None for _ in self.values]
        base = finite_number(self.values[0]) if self.values else None
        out: list[float | None] = []
        for i, value in enumerate(self.values):
            number = finite_number(value)
            if base is None or number is None or base == 0 or not self.comparable(i):
                out.append(None)
            else:
                out.append(100.0 * (number - base) / abs(base))
        return out

    def texts(self) -> list[str]:
        """Each value in the row's format, without changes."""
        if self.digits is not None:
            decimals = row_decimals(self.values, self.digits)
            texts = [fmt_fixed(v, decimals) for v in self.values]
        else:
            texts = [NA if v is None else safe(self.fmt(v)) for v in self.values]
        for extra in (self.units, self.marks):
            if extra is not None:
                texts = [
                    f"{t} {u}" if u and t != NA else t for t, u in zip(texts, extra, strict=True)
                ]
        return texts

    def cells(self) -> list[str]:
        """Each run's cell: ``=`` when it equals the first run's, its change in brackets."""
        texts = self.texts()
        cells = texts[:1]
        for i, (text, change) in enumerate(zip(texts, self.changes(), strict=True)):
            if i == 0:
                continue
            value = self.values[i]
            same_mark = self.marks is None or self.marks[i] == self.marks[0]
            if value is not None and value == self.values[0] and self.comparable(i) and same_mark:
                cells.append("=")
                continue
            if change is not None and round(change, 1) != 0:
                text += f" ({change:+.1f} %)"
            cells.append(text)
        return cells


# ---- what a run is and was set to --------------------------------------------------------------


def workload(record: RunSummary) -> str:
    """What a step of the run is: its runner's (or, for a command, its preset's)."""
    return record.runner or record.preset or record.id


def run_settings(record: RunSummary) -> dict[str, Any]:
    """The run's settings: its preset's arguments as launched (``--set`` applied).

    Read from ``run.json``; only the overrides when the run directory is gone.
    """
    run = rundir.read_run(Path(record.run_dir)) if record.run_dir else None
    args = ((run or {}).get("preset") or {}).get("args")
    settings = dict(args) if isinstance(args, dict) else {}
    settings.update(record.overrides)
    return settings


def _setting_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(map(_setting_text, value))
    return str(value)


def setting_rows(
    records: Sequence[RunSummary], settings: Sequence[dict[str, Any]]
) -> tuple[list[CompareRow], dict[str, Any]]:
    """The settings that differ (rows) and those every run shares (``{key: value}``).

    The keys looked at: those a run set with ``--set`` and those all the runs'
    presets have (a key only one preset has is told by the preset row).
    """
    keys: list[str] = []
    for record in records:
        keys += [k for k in record.overrides if k not in keys]
    common = set.intersection(*(set(s) for s in settings)) if settings else set()
    for s in settings:
        keys += [k for k in s if k in common and k not in keys]
    rows: list[CompareRow] = []
    same: dict[str, Any] = {}
    for key in keys:
        values = [s.get(key) for s in settings]
        if all(v == values[0] for v in values) and values[0] is not None:
            same[key] = values[0]
            continue
        rows.append(CompareRow(f"set {key}", values, _setting_text, numeric=False, setting=True))
    return rows, same


# ---- the comparison ------------------------------------------------------------------------


@dataclass
class Comparison:
    """The rows of the comparison and the settings every run shares."""

    records: list[RunSummary]
    rows: list[CompareRow]
    same: dict[str, Any] = field(default_factory=dict)

    @property
    def mixed(self) -> bool:
        """Some runs are of another workload than the first (those changes are left out)."""
        return len({workload(r) for r in self.records}) > 1

    def caption(self) -> str:
        text = "(changes) from the first run, = the same"
        if self.mixed:
            text += ", none across workloads"
        return text

    def same_text(self) -> str:
        """``same: key=value, ...`` (empty when no setting is shared)."""
        if not self.same:
            return ""
        return "same: " + ", ".join(f"{k}={_setting_text(v)}" for k, v in self.same.items())

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": [r.to_dict() for r in self.records],
            "rows": [
                {
                    "name": row.name,
                    "values": row.values,
                    "change_pct": row.changes(),
                    "setting": row.setting,
                }
                for row in self.rows
            ],
            "same": self.same,
        }

    def renderable(
        self, title: str | None = None, labels: Sequence[str] | None = None
    ) -> RenderableType:
        """The table (a column per run, headed by its id or its ``labels``), then the
        shared settings and the caption."""
        table = Table(header_style="bold", box=None, pad_edge=False, title=title)
        table.add_column("")
        for n, r in enumerate(self.records):
            label = labels[n] if labels is not None else r.id
            table.add_column(Text(safe(label)), justify="right", overflow="fold")
        for row in self.rows:
            # Text, not str: a run's settings are the user's text, never markup.
            cells = [Text(safe(c)) for c in row.cells()]
            table.add_row(Text(safe(row.name)), *cells, style="cyan" if row.setting else None)
        parts: list[RenderableType] = [table]
        if self.same:
            parts.append(Text(safe(self.same_text()), style="dim"))
        return Group(*parts)


def _epoch_time(r: RunSummary) -> float | None:
    value = r.summary.get("epoch_time_s")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if r.epochs and r.duration_s:
        return r.duration_s / r.epochs
    return None


def _unit_row(
    label: str,
    values: list[Any],
    units: list[str | None],
    digits: int,
    kinds: list[Hashable],
) -> CompareRow:
    """A row whose unit may differ by run: in the label when one, in each cell otherwise."""
    known = {u for u, v in zip(units, values, strict=True) if v is not None}
    if len(known) <= 1:
        unit = next(iter(known), None)
        return CompareRow(with_unit(label, unit), values, digits=digits, kinds=kinds)
    return CompareRow(label, values, digits=digits, kinds=kinds, units=units)


def _energy_row(records: Sequence[RunSummary]) -> CompareRow:
    """GPU energy in one unit for the row: J, Wh or kWh, by the largest."""
    values = [r.energy_j for r in records]
    top = max((v for v in values if v is not None), default=0.0)
    unit, scale, digits = ("J", 1.0, 0)
    if top >= 3.6e6:
        unit, scale, digits = ("kWh", 3.6e6, 2)
    elif top >= 3600:
        unit, scale, digits = ("Wh", 3600.0, 1)
    scaled = [None if v is None else v / scale for v in values]
    return CompareRow(with_unit("energy", unit), scaled, digits=digits)


def _duration_row(label: str, values: list[float | None]) -> CompareRow:
    """Durations in one clock format for the row (h:mm:ss once any is an hour)."""
    hours = any(v is not None and v >= 3599.5 for v in values)

    def clock(seconds: float) -> str:
        if not hours:
            return fmt_duration(seconds)
        s = round(seconds)
        return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"

    return CompareRow(with_unit(label, "h:mm:ss" if hours else "m:ss"), values, clock)


def compare(
    records: Sequence[RunSummary], settings: Sequence[dict[str, Any]] | None = None
) -> Comparison:
    """The comparison of ``records`` (the first is the one the changes are from).

    ``settings`` are each run's (:func:`run_settings`, read from the run
    directories when not given).
    """
    records = list(records)
    if settings is None:
        settings = [run_settings(r) for r in records]
    kinds: list[Hashable] = [workload(r) for r in records]
    config_rows, same = setting_rows(records, settings)
    rows = [
        CompareRow("preset", [r.preset for r in records], numeric=False),
        *config_rows,
        CompareRow("status", [status_text(r) for r in records], numeric=False),
        CompareRow("gpus", [gpus_text(r) for r in records], numeric=False),
        *verdict_rows(records),
        _duration_row("duration", [r.duration_s for r in records]),
        CompareRow("epoch time (s)", [_epoch_time(r) for r in records], digits=1, kinds=kinds),
        CompareRow("steps", [r.steps for r in records], digits=0, kinds=kinds),
        CompareRow("final loss", [r.final_loss for r in records], digits=4, kinds=kinds),
        CompareRow("best loss", [r.best_loss for r in records], digits=4, kinds=kinds),
        CompareRow("eval loss", [r.final_eval_loss for r in records], digits=4, kinds=kinds),
        _unit_row(
            "throughput",
            [r.best_throughput for r in records],
            [r.throughput_unit for r in records],
            1,
            [(workload(r), r.throughput_unit) for r in records],
        ),
        CompareRow("peak VRAM (MiB)", [r.peak_vram_mib for r in records], digits=0),
        _energy_row(records),
        *_cost_rows(records),
        CompareRow(
            "energy shared",
            [
                "shared" if r.energy_shared else "estimated" if r.energy_estimated else None
                for r in records
            ],
            numeric=False,
        ),
        _energy_per_unit_row(records),
        CompareRow("avg power (W)", [r.avg_power_w for r in records], digits=0),
        CompareRow("peak power (W)", [r.peak_power_w for r in records], digits=0),
        CompareRow("peak temp (°C)", [r.peak_temp_c for r in records], digits=0),
        CompareRow("throttled (s)", [r.throttled_s for r in records], digits=0),
    ]
    # Figures read from the GPUs say SIMULATED in the cell of a run on simulated ones.
    marks: list[str | None] = [SIMULATED if r.simulated else None for r in records]
    if any(marks):
        for row in rows:
            if row.name.startswith(GPU_FIGURES):
                row.marks = marks
    # Final figures a run chose to report in its summary (accuracy, perplexity ...).
    keys: list[str] = []
    for r in records:
        for key, value in r.summary.items():
            if (
                finite_number(value) is not None
                and key not in ("final_loss", "best_loss", "epoch_time_s")
                and key not in keys
            ):
                keys.append(key)
    for key in keys:
        values = [r.summary.get(key) for r in records]
        integral = all(isinstance(v, int) for v in values if finite_number(v) is not None)
        rows.append(CompareRow(key, values, digits=0 if integral else 4, kinds=kinds))
    missing = (None, "-", NA)
    shown = [row for row in rows if row.setting or any(v not in missing for v in row.values)]
    return Comparison(records, shown, same)


def _checks(record: RunSummary) -> list[tuple[str, str]]:
    """A run's checks as (name, verdict), from a summary's ``checks`` (the burn-in's)."""
    found = record.summary.get("checks")
    if not isinstance(found, list):
        return []
    return [
        (c["name"], c["status"])
        for c in found
        if isinstance(c, dict)
        and isinstance(c.get("name"), str)
        and isinstance(c.get("status"), str)
    ]


def verdict_rows(records: Sequence[RunSummary]) -> list[CompareRow]:
    """For runs that checked something (a burn-in): the card, the result, each check's verdict.

    Text rows: a verdict is the same or it is not, there is no percentage between them.
    A run without the check reads ``-``.
    """
    checks = [dict(_checks(r)) for r in records]
    if not any(checks):
        return []

    def text(record: RunSummary, key: str) -> str | None:
        value = record.summary.get(key)
        return value if isinstance(value, str) and value else None

    names: list[str] = []
    for found in checks:
        names += [n for n in found if n not in names]
    checked = [r if c else None for r, c in zip(records, checks, strict=True)]
    return [
        CompareRow("card", [r and text(r, "gpu") for r in checked], numeric=False),
        CompareRow("result", [r and text(r, "result") for r in checked], numeric=False),
        *(
            CompareRow(f"check: {name}", [c.get(name) for c in checks], numeric=False)
            for name in names
        ),
    ]


#: the compare rows whose figures come from the run's GPUs (by the start of their label)
GPU_FIGURES = ("energy", "cost", "avg power", "peak power", "peak temp", "throttled")


def _energy_per_unit_row(records: Sequence[RunSummary]) -> CompareRow:
    """GPU energy per unit of work: ``energy per img (J)``, or J/img and J/token apart."""
    values = [r.energy_per_unit_j for r in records]
    kinds: list[Hashable] = [(workload(r), r.work_unit) for r in records]
    units = {r.work_unit for r, v in zip(records, values, strict=True) if v is not None}
    if len(units) <= 1:
        unit = next(iter(units), None)
        return CompareRow(f"energy per {unit or 'unit'} (J)", values, digits=3, kinds=kinds)
    cells: list[str | None] = [f"J/{r.work_unit}" if r.work_unit else "J" for r in records]
    return CompareRow("energy per unit", values, digits=3, kinds=kinds, units=cells)


def _cost_rows(records: list[RunSummary]) -> list[CompareRow]:
    """The cost of each run, when ``[energy]`` names a price."""

    try:
        price = load_price()
    except Exception:  # a bad [energy] table is reported by the commands that need it
        return []
    if price is None:
        return []
    return [
        CompareRow(
            with_unit("cost", price.currency or None),
            [price.cost(r.energy_j) for r in records],
            digits=2,
        )
    ]
