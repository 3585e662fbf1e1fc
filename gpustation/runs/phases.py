"""A run recorded in phases (the contention runner's train alone, infer alone, both), as a table.

The run's summary carries ``phases``, one object per phase::

    {"phase": "both", "train_tokens_per_s": 9120.4, "infer_latency_ms_p50": 41.2,
     "infer_latency_ms_p99": 60.3, "infer_tokens_per_s": 1500.0,
     "power_w_mean": 402.5, "power_w_peak": 455.0, "util_pct_mean": 97.0,
     "sm_pct_train": 71.0, "sm_pct_infer": 24.0, "train_slowdown": 1.31,
     "infer_p50_slowdown": 2.1, "infer_p99_slowdown": 2.6,
     "gpu_note": "...", "sm_note": "..."}

(a figure that could not be measured is ``null``, and a note says why).
:func:`phase_cells` lays the phases out as text (the runner prints them);
:func:`phases_table` as a Rich table, the one ``gpustation runs show`` prints
and the runs screen draws. The summary is read from a file: numbers are taken
only when they are numbers, and text goes through :func:`~gpustation.textsafe.safe`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpustation.runs.fold import finite_number
from gpustation.telemetry.format import NA
from gpustation.textsafe import safe

HEADERS = (
    "phase",
    "train tok/s",
    "infer ms p50/p99",
    "W avg/peak",
    "util %",
    "SM % train/infer",
    "slowdown train/p99",
)


def read_phases(summary: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """The summary's ``phases`` (None: the run has none)."""
    found = (summary or {}).get("phases")
    if not isinstance(found, list):
        return None
    rows = [p for p in found if isinstance(p, dict)]
    return rows or None


def _fmt(value: Any, digits: int) -> str:
    number = finite_number(value)
    return NA if number is None else f"{number:,.{digits}f}"


def _pair(a: Any, b: Any, digits: int) -> str:
    if finite_number(a) is None and finite_number(b) is None:
        return NA
    return f"{_fmt(a, digits)} / {_fmt(b, digits)}"


def _slowdown(row: Mapping[str, Any]) -> str:
    """``1.32x / 3.92x``: training's and the p99 latency's (the p50s are in their column)."""
    train, p99 = (
        finite_number(row.get("train_slowdown")),
        finite_number(row.get("infer_p99_slowdown")),
    )
    if train is None and p99 is None:
        return ""
    return " / ".join(NA if v is None else f"{v:.2f}x" for v in (train, p99))


def phase_cells(phases: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """A row of cells per phase, under :data:`HEADERS`."""
    return [
        [
            safe(str(row.get("phase", "?"))),
            _fmt(row.get("train_tokens_per_s"), 0),
            _pair(row.get("infer_latency_ms_p50"), row.get("infer_latency_ms_p99"), 1),
            _pair(row.get("power_w_mean"), row.get("power_w_peak"), 0),
            _fmt(row.get("util_pct_mean"), 0),
            _pair(row.get("sm_pct_train"), row.get("sm_pct_infer"), 0),
            _slowdown(row),
        ]
        for row in phases
    ]


def _text(value: Any) -> str | None:
    return safe(value) if isinstance(value, str) and value else None


def phase_notes(phases: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why figures are missing, each reason once."""
    notes: list[str] = []
    for row in phases:
        gpu, sm = _text(row.get("gpu_note")), _text(row.get("sm_note"))
        if gpu and gpu == sm:
            found = [f"power, utilisation and SM shares: {gpu}"]
        else:
            found = [f"{what}: {note}" for what, note in
                     (("power and utilisation", gpu), ("SM shares", sm)) if note]  # fmt: skip
        notes += [line for line in found if line not in notes]
    return notes


def phases_table(summary: Mapping[str, Any] | None) -> RenderableType | None:
    """The phases as a table with the notes under it (None: the run has no phases)."""
    phases = read_phases(summary)
    if phases is None:
        return None
    table = Table(
        title=Text("phases"),
        box=None,
        title_justify="left",
        header_style="bold",
        pad_edge=False,
    )
    for header in HEADERS:
        table.add_column(header, justify="left" if header == "phase" else "right")
    for cells in phase_cells(phases):
        table.add_row(*(Text(c) for c in cells))
    notes = [Text(n, style="dim") for n in phase_notes(phases)]
    return Group(table, *notes) if notes else table
