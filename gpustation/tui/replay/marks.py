"""The replay's timeline: the marks of a recording's period, and the line that draws them.

A mark is a moment worth jumping to: a run starting ``[`` or ending ``]``
(from the run store), an alert ``!`` (:class:`~gpustation.telemetry.alerts.AlertLog`
over the recorded snapshots) or a control change ``◆`` (the control journal).
:func:`timeline_text` draws the recording as one line with its marks and the
playback position.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text

from gpustation import timefmt
from gpustation.control.journal import describe_value, read_journal
from gpustation.runs.store.index import RunStore
from gpustation.telemetry.alerts import AlertLog
from gpustation.telemetry.model import Snapshot
from gpustation.telemetry.recording.file import Recording
from gpustation.textsafe import safe

RUN_START, RUN_END, ALERT, CONTROL = "run_start", "run_end", "alert", "control"
SYMBOLS = {RUN_START: "[", RUN_END: "]", ALERT: "!", CONTROL: "◆"}
STYLES = {RUN_START: "bold green", RUN_END: "bold green", ALERT: "bold red", CONTROL: "bold cyan"}
# Where marks share a cell, the higher one shows.
PRIORITY = {RUN_START: 0, RUN_END: 0, CONTROL: 1, ALERT: 2}


@dataclass(frozen=True, slots=True)
class Mark:
    time: float
    kind: str  # run_start | run_end | alert | control
    text: str


def alert_marks(recording: Recording) -> list[Mark]:
    """The alerts the dashboard would have raised over the recorded snapshots."""
    log = AlertLog()
    out = []
    for doc in recording.iter_docs():
        for alert in log.update(Snapshot.from_dict(doc)):
            out.append(Mark(alert.time, ALERT, alert.message))
    return out


def run_marks(start: float, end: float, store: RunStore | None = None) -> list[Mark]:
    out = []
    for run in (store or RunStore()).list_runs():
        name = run.title or run.preset or run.id
        if run.started_at is not None and start <= run.started_at <= end:
            out.append(Mark(run.started_at, RUN_START, f"run {name} started ({run.id})"))
        if run.ended_at is not None and start <= run.ended_at <= end:
            out.append(Mark(run.ended_at, RUN_END, f"run {name} ended: {run.status}"))
    return out


def control_marks(start: float, end: float, host: str, journal: Path | None = None) -> list[Mark]:
    out = []
    for e in read_journal(journal).entries:
        if not start <= e.time <= end or (e.host and e.host != host):
            continue
        what = e.what.replace("_", " ") + (f" (fan {e.fan})" if e.fan is not None else "")
        out.append(
            Mark(
                e.time,
                CONTROL,
                f"GPU {e.gpu} {what} {describe_value(e.what, e.previous)} → "
                f"{describe_value(e.what, e.new)}: {e.outcome}, by {e.command}",
            )
        )
    return out


def collect_marks(
    recording: Recording,
    store: RunStore | None = None,
    journal: Path | None = None,
    local_host: str | None = None,
) -> list[Mark]:
    """Every mark of the recording's period, oldest first.

    Runs and control changes are this machine's: they are marked only on a
    recording made here (the journal's entries name their host).
    """
    first = recording.snapshot_at(recording.start)
    here = local_host if local_host is not None else os.uname().nodename
    marks = alert_marks(recording)
    marks += control_marks(recording.start, recording.end, first.hostname, journal)
    if first.hostname == here:
        marks += run_marks(recording.start, recording.end, store)
    # recorded alerts, journal commands and run titles: the terminal gets them made safe
    return sorted((Mark(m.time, m.kind, safe(m.text)) for m in marks), key=lambda m: m.time)


def clock_text(t: float, with_date: bool) -> str:
    return timefmt.compact(t, seconds=True) if with_date else timefmt.clock(t)


def timeline_cells(start: float, end: float, t: float, width: int) -> int:
    """The cell of time ``t`` on a timeline ``width`` cells wide."""
    if end <= start or width <= 1:
        return 0
    return max(0, min(width - 1, round((t - start) / (end - start) * (width - 1))))


def timeline_text(start: float, end: float, pos: float, marks: list[Mark], width: int) -> Text:
    """``09:12:03 ──[───!──◆──┃───]── 09:40:00``: the recording, its marks, the position."""
    with_date = time.localtime(start)[:3] != time.localtime(end)[:3]
    left, right = clock_text(start, with_date) + " ", " " + clock_text(end, with_date)
    n = max(10, width - len(left) - len(right))
    chars = ["─"] * n
    styles = ["dim"] * n
    rank = [-1] * n
    for mark in marks:
        c = timeline_cells(start, end, mark.time, n)
        if PRIORITY[mark.kind] >= rank[c]:
            chars[c], styles[c], rank[c] = (
                SYMBOLS[mark.kind],
                STYLES[mark.kind],
                PRIORITY[mark.kind],
            )
    c = timeline_cells(start, end, pos, n)
    chars[c], styles[c] = "┃", "bold reverse"
    out = Text(left, style="dim")
    for ch, st in zip(chars, styles, strict=True):
        out.append(ch, style=st)
    out.append(right, style="dim")
    return out
