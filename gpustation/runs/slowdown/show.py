"""How a run's slowdowns read: the table of ``runs show``, the lines of ``gpustation run``.

Each takes the slowdowns as ``records.py`` folds them (the run store's
``slowdowns``), so a number is used only where it is one and a missing
figure reads ``n/a``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from gpustation.runs.fold import finite_number
from gpustation.telemetry.format import NA, duration

HEADERS = ("start", "length", "throughput lost", "cause", "evidence")


def _number(row: Mapping[str, Any], key: str) -> float | None:
    return finite_number(row.get(key))


def _cause(row: Mapping[str, Any]) -> Mapping[str, Any]:
    cause = row.get("cause")
    return cause if isinstance(cause, Mapping) else {}


def lost_text(row: Mapping[str, Any]) -> str:
    """``-48 % (-392 img/s of 812)``: the throughput lost, in % and in the run's unit."""
    pct, lost, steady = _number(row, "lost_pct"), _number(row, "lost"), _number(row, "steady")
    if pct is None:
        return NA
    text = f"-{pct:.0f} %"
    unit = row.get("unit") if isinstance(row.get("unit"), str) else ""
    if lost is not None:
        of = f" of {steady:,.4g}" if steady is not None else ""
        text += f" (-{lost:,.4g} {unit}{of})".replace("  ", " ")
    return text


def length_text(row: Mapping[str, Any], active: bool) -> str:
    """How long it lasted; ``going on`` while it does, ``to the end`` when the run ended in it."""
    if row.get("state") != "ended":
        return "going on" if active else "to the end"
    text = duration(_number(row, "length_s"))
    return f"{text} (to the end)" if row.get("ended_with_run") else text


def start_text(row: Mapping[str, Any]) -> str:
    return duration(_number(row, "start_s"))


def slowdowns_table(
    rows: Sequence[Mapping[str, Any]], simulated: bool = False, active: bool = False
) -> RenderableType | None:
    """The slowdowns as a table (None: the run had none)."""
    if not rows:
        return None
    title = "slowdowns" + (" (SIMULATED GPUs)" if simulated else "")
    table = Table(
        title=Text(title), box=None, title_justify="left", header_style="bold", pad_edge=False
    )
    for header in HEADERS:
        table.add_column(header, justify="right" if header in ("start", "length") else "left")
    for row in rows:
        cause = _cause(row)
        table.add_row(
            Text(start_text(row)),
            Text(length_text(row, active)),
            Text(lost_text(row)),
            Text(str(cause.get("label") or cause.get("kind") or "unknown")),
            Text(str(cause.get("detail") or "")),
        )
    return table


def follow_line(row: Mapping[str, Any], record: Mapping[str, Any]) -> str:
    """What ``gpustation run`` says of a record just read (``row``: its slowdown so far)."""
    at = start_text(row)
    if record.get("state") == "ended":
        how = "lasted to the end of the run" if row.get("ended_with_run") else "ended"
        return (
            f"gpustation: the slowdown at {at} {how} after "
            f"{duration(_number(row, 'length_s'))}; throughput {lost_text(row)}"
        )
    words = _cause(row).get("words") or "unknown"
    return f"gpustation: slowdown at {at} into the run, throughput {lost_text(row)}; {words}"


def print_slowdowns(records: Sequence[Mapping[str, Any]], folded: Mapping[int, Any]) -> None:
    """A line on stderr for each record just read."""
    for record in records:
        ident = record.get("id")
        row = folded.get(ident) if isinstance(ident, int) else None
        if isinstance(row, Mapping) and "cause" in row:
            print(follow_line(row, record), file=sys.stderr, flush=True)
