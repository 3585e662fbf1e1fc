"""The one place a forecast is worded: a line for ``run --dry-run`` and the launch form,
and the rows that set it beside what happened for ``runs show``.

    about 12 min 30 s, 0.21 kWh (0.06 EUR), peak 31.0 GiB: fits, 31.0 GiB of 80.0 GiB
    free on GPU 0; from 3 past runs of resnet50-bf16, batch 256 -> 512 extrapolated

Numbers through :mod:`gpustation.telemetry.format` ("n/a" for what is not
known); figures from simulated GPUs say SIMULATED.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpustation.runs.compare import SIMULATED, fmt_energy
from gpustation.runs.cost import Price
from gpustation.runs.forecast.model import Forecast, MemoryFit, versus
from gpustation.runs.summary import RunSummary
from gpustation.telemetry.format import NA, duration, duration_words, mib_words
from gpustation.textsafe import safe

#: what to do when a preset has no history here
PROBE_HINT = "`run --dry-run --probe` runs a few steps to make one"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _money(fc: Forecast, value: float | None) -> str | None:
    if value is None:
        return None
    return Price(0.0, fc.currency or "").money(value)


def _fit_text(peak: str, gpu: MemoryFit) -> str:
    free = mib_words(gpu.free_mib)
    if gpu.fits is None:
        return f"{free} free on GPU {gpu.index}"
    if gpu.fits:
        return f"fits, {peak} of {free} free on GPU {gpu.index}"
    return f"will not fit: needs about {peak}, {free} free on GPU {gpu.index}"


def memory_text(fc: Forecast) -> str:
    """``peak 31.0 GiB: fits, 31.0 GiB of 80.0 GiB free on GPU 0`` (per GPU)."""
    peak = mib_words(fc.peak_vram_mib)
    if fc.peak_vram_mib is None or not fc.gpus:
        return f"peak {peak}"
    return f"peak {peak}: " + ", ".join(_fit_text(peak, g) for g in fc.gpus)


def basis_text(fc: Forecast) -> str:
    """``from 3 past runs of resnet50-bf16 (1 a probe), batch 256 -> 512 extrapolated``."""
    text = f"from {_plural(fc.runs, 'past run')} of {fc.preset}"
    if fc.probe_runs:
        text += " (1 a probe)" if fc.probe_runs == 1 else f" ({fc.probe_runs} probes)"
    if fc.extrapolated:
        text += ", " + ", ".join(fc.extrapolated) + " extrapolated"
    return text


def no_history_text(fc: Forecast, hint: str = PROBE_HINT) -> str:
    """What a forecast without history says: the preset never ran here, and the way out."""
    if fc.skipped:
        why = f"{fc.preset} has no usable run here ({_plural(fc.skipped, 'damaged run')} skipped)"
    else:
        why = f"{fc.preset} never ran here"
    return safe(f"{why}: no forecast; {hint}")


def launched_without_history(fc: Forecast) -> str:
    """What ``runs show`` says of a run launched with no history to forecast from."""
    return safe(f"none: no past run of {fc.preset} to forecast from when it was launched")


def forecast_line(fc: Forecast, hint: str = PROBE_HINT) -> str:
    """The forecast in one line (see the module); safe for any view."""
    if not fc.runs:
        return no_history_text(fc, hint)
    took = f"about {duration_words(fc.duration_s)}" if fc.duration_s is not None else f"time {NA}"
    energy = fmt_energy(fc.energy_j)
    if fc.energy_j is not None and fc.simulated:
        energy += f" {SIMULATED}"
    cost = _money(fc, fc.cost)
    if cost is not None:
        energy += f" ({cost})"
    parts = [", ".join((took, energy, memory_text(fc))), basis_text(fc), *fc.notes]
    if fc.simulated and fc.energy_j is None:
        parts.append(SIMULATED)  # said where no figure carries it
    return safe("; ".join(parts))


@dataclass(frozen=True)
class VersusRow:
    """A row of ``runs show``'s forecast table: figure, forecast, actual, error."""

    figure: str
    forecast: str
    actual: str
    error: str


_LABELS = {
    "duration_s": "duration",
    "energy_j": "energy",
    "cost": "cost",
    "peak_vram_mib": "peak memory",
}


def actual_of(fc: Forecast, record: RunSummary) -> dict[str, float | None]:
    """What happened, in the forecast's terms; the cost at the price the forecast used."""
    energy = None if record.energy_shared else record.energy_j
    cost = None
    if fc.cost is not None and fc.energy_j and energy is not None:
        cost = energy * fc.cost / fc.energy_j
    return {
        "duration_s": record.duration_s,
        "energy_j": energy,
        "cost": cost,
        "peak_vram_mib": record.peak_vram_mib,
    }


def _energy_in(joules: float | None, like: float) -> str:
    """``joules`` in the unit :func:`fmt_energy` gives ``like``: a row reads in one unit."""
    if joules is None:
        return NA
    for factor, unit, digits in ((3.6e6, "kWh", 2), (3600.0, "Wh", 1)):
        if like >= factor:
            return f"{joules / factor:,.{digits}f} {unit}"
    return f"{joules:,.0f} J"


def _figure_text(fc: Forecast, name: str, value: float | None, simulated: bool, like: float) -> str:
    if name == "duration_s":
        return duration(value)
    if name == "energy_j":
        text = _energy_in(value, like)
        return f"{text} {SIMULATED}" if simulated and value is not None else text
    if name == "cost":
        return _money(fc, value) or NA
    return mib_words(value)


def versus_rows(fc: Forecast, record: RunSummary) -> list[VersusRow]:
    """The forecast beside what the run did, with the forecast's error in %."""
    rows = []
    for v in versus(fc, actual_of(fc, record)):
        if v.figure == "cost" and v.forecast is None:
            continue  # no price when it was forecast
        error = NA if v.error_pct is None else f"{v.error_pct:+.1f} %"
        like = max(v.forecast or 0.0, v.actual or 0.0)
        rows.append(
            VersusRow(
                _LABELS[v.figure],
                _figure_text(fc, v.figure, v.forecast, fc.simulated, like),
                _figure_text(fc, v.figure, v.actual, record.simulated, like),
                error,
            )
        )
    return rows
