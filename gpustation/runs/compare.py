"""Runs side by side: the rows of ``runs compare`` and the runs screen's compare view."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpustation.runs.summary import RunSummary
from gpustation.telemetry.format import duration as fmt_duration


def fmt_num(value: float | None, digits: int = 1, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if abs(value) >= 10000:
        text = f"{value:,.0f}"
    elif abs(value) < 0.01 and value != 0:
        text = f"{value:.3g}"
    else:
        text = f"{value:.{digits}f}"
    return f"{text} {unit}".rstrip()


def fmt_energy(joules: float | None) -> str:
    if joules is None:
        return "-"
    if joules >= 3.6e6:
        return f"{joules / 3.6e6:.2f} kWh"
    if joules >= 3600:
        return f"{joules / 3600:.1f} Wh"
    return f"{joules:.0f} J"


def status_text(record: RunSummary) -> str:
    return record.status_text()


#: what marks a run on simulated GPUs wherever a run is shown
SIMULATED = "SIMULATED"


def gpus_text(record: RunSummary, none: str = "-") -> str:
    """The run's GPUs, ``0,1 SIMULATED`` when they were simulated ones."""
    text = ",".join(map(str, record.gpus)) or none
    return f"{text} {SIMULATED}" if record.simulated else text


def energy_text(record: RunSummary) -> str:
    """The run's GPU energy, ``(shared)`` beside it when another run used its GPUs too."""
    text = fmt_energy(record.energy_j)
    return f"{text} (shared)" if record.energy_shared and record.energy_j is not None else text


@dataclass
class CompareRow:
    """One row of ``runs compare``: a value per run, shown with its change."""

    name: str
    values: list[Any]
    fmt: Callable[[Any], str] = str
    numeric: bool = True

    def changes(self) -> list[float | None]:
        """Percent change of each value from the first run's (None when not comparable)."""
        if not self.numeric:
            return [None for _ in self.values]
        base = self.values[0] if self.values else None
        out: list[float | None] = []
        for value in self.values:
            if isinstance(base, (int, float)) and isinstance(value, (int, float)) and base != 0:
                out.append(100.0 * (value - base) / abs(base))
            else:
                out.append(None)
        return out

    def cells(self) -> list[str]:
        """Each run's value as text, the change from the first run in brackets."""
        cells = []
        for i, (value, change) in enumerate(zip(self.values, self.changes(), strict=True)):
            text = "-" if value is None else self.fmt(value)
            if i > 0 and change is not None:
                text += f" ({change:+.1f} %)"
            cells.append(text)
        return cells


def _epoch_time(r: RunSummary) -> float | None:
    value = r.summary.get("epoch_time_s")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if r.epochs and r.duration_s:
        return r.duration_s / r.epochs
    return None


def compare_rows(records: list[RunSummary]) -> list[CompareRow]:
    """The rows of the comparison, leaving out rows no run has a value for."""
    unit = next((r.throughput_unit for r in records if r.throughput_unit), None)
    work_unit = next((r.work_unit for r in records if r.work_unit), None)
    rows = [
        CompareRow("preset", [r.preset for r in records], numeric=False),
        CompareRow("status", [status_text(r) for r in records], numeric=False),
        CompareRow("gpus", [gpus_text(r) for r in records], numeric=False),
        CompareRow("duration", [r.duration_s for r in records], fmt_duration),
        CompareRow("epoch time", [_epoch_time(r) for r in records], lambda v: fmt_num(v, 1, "s")),
        CompareRow("steps", [r.steps for r in records], lambda v: "-" if v is None else str(v)),
        CompareRow("final loss", [r.final_loss for r in records], lambda v: fmt_num(v, 4)),
        CompareRow("best loss", [r.best_loss for r in records], lambda v: fmt_num(v, 4)),
        CompareRow("eval loss", [r.final_eval_loss for r in records], lambda v: fmt_num(v, 4)),
        CompareRow(
            f"throughput ({unit})" if unit else "throughput",
            [r.best_throughput for r in records],
            lambda v: fmt_num(v, 1),
        ),
        CompareRow("peak VRAM", [r.peak_vram_mib for r in records], lambda v: fmt_num(v, 0, "MiB")),
        CompareRow("energy", [r.energy_j for r in records], fmt_energy),
        *_cost_rows(records),
        CompareRow(
            "energy shared",
            ["shared" if r.energy_shared else None for r in records],
            numeric=False,
        ),
        CompareRow(
            f"energy per {work_unit}" if work_unit else "energy per unit",
            [r.energy_per_unit_j for r in records],
            lambda v: fmt_num(v, 3, "J"),
        ),
        CompareRow("avg power", [r.avg_power_w for r in records], lambda v: fmt_num(v, 0, "W")),
        CompareRow("peak power", [r.peak_power_w for r in records], lambda v: fmt_num(v, 0, "W")),
        CompareRow("peak temp", [r.peak_temp_c for r in records], lambda v: fmt_num(v, 0, "°C")),
        CompareRow("throttled", [r.throttled_s for r in records], lambda v: fmt_num(v, 0, "s")),
    ]
    # Final figures a run chose to report in its summary (accuracy, perplexity ...).
    keys: list[str] = []
    for r in records:
        for key, value in r.summary.items():
            if (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and key not in ("final_loss", "best_loss", "epoch_time_s")
                and key not in keys
            ):
                keys.append(key)
    for key in keys:
        rows.append(
            CompareRow(
                key,
                [r.summary.get(key) for r in records],
                lambda v: fmt_num(v, 4) if isinstance(v, float) else ("-" if v is None else str(v)),
            )
        )
    return [row for row in rows if any(v not in (None, "-") for v in row.values)]


def _cost_rows(records: list[RunSummary]) -> list[CompareRow]:
    """The cost of each run, when ``[energy]`` names a price."""
    from gpustation.runs.cost import load_price

    try:
        price = load_price()
    except Exception:  # a bad [energy] table is reported by the commands that need it
        return []
    if price is None:
        return []
    return [CompareRow("cost", [price.cost(r.energy_j) for r in records], price.money)]
