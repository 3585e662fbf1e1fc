"""``slowdowns.jsonl``: a run's slowdowns as its supervisor found them, and how readers fold them.

The watch appends a line when a slowdown is confirmed (``"state":
"ongoing"``: its start, the steady level it fell from, the throughput so
far and its cause with the evidence) and one when it ends (``"state":
"ended"``: its end, length and the throughput lost). The lines of one
slowdown share its ``id``; :func:`fold` merges them, later keys over
earlier ones, into one object per slowdown, the shape ``runs show --json``
gives::

    {"id": 1, "state": "ended", "start_time": 1700000042.1, "start_s": 42.1,
     "confirmed_time": 1700000047.3, "end_time": 1700000061.0, "length_s": 18.9,
     "steady": 812.0, "throughput": 420.5, "unit": "img/s", "lost_pct": 48.2,
     "lost": 391.5, "ended_with_run": false,
     "cause": {"kind": "power_cap", "label": "power cap",
               "detail": "300 W limit, GPU at 299 W, SM clock 1410 of 1980 MHz",
               "words": "power cap: 300 W limit, ...", "evidence": {...}}}

A run can put anything in its directory: the file is read through
:mod:`gpustation.files` (a regular file, bounded lines), each line's text is
made safe (rule 8), and a value of the wrong shape is left out.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpustation import private
from gpustation.runs import rundir
from gpustation.runs.fold import finite_number
from gpustation.runs.tail import Tailer, file_lines, parse_metric_line

STATES = ("ongoing", "ended")
#: the number fields of a slowdown
NUMBERS = (
    "start_time",
    "start_s",
    "confirmed_time",
    "end_time",
    "length_s",
    "steady",
    "throughput",
    "lost_pct",
    "lost",
)
#: slowdowns kept per run (a file written by something else cannot grow a reader's memory)
MAX_SLOWDOWNS = 1000
#: bytes of the file read per poll by a follower
BITE = 1 << 20


def path_of(directory: Path) -> Path:
    return Path(directory) / rundir.SLOWDOWNS_FILE


def append(directory: Path, record: dict[str, Any]) -> None:
    """Add one line (the watch's; raises OSError).

    The run can put anything in its directory: a FIFO or a link in the file's
    place is refused, never waited on or followed.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW
    fd = os.open(path_of(directory), flags, private.FILE_MODE)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path_of(directory)} is not a regular file")
        os.write(fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
    finally:
        os.close(fd)


def _cause(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
        return None
    cause: dict[str, Any] = {"kind": value["kind"]}
    for key in ("label", "detail", "words"):
        cause[key] = value[key] if isinstance(value.get(key), str) else ""
    cause["label"] = cause["label"] or cause["kind"]
    cause["words"] = cause["words"] or cause["label"]
    evidence = value.get("evidence")
    cause["evidence"] = evidence if isinstance(evidence, dict) else {}
    return cause


def parse(line: bytes | str) -> dict[str, Any] | None:
    """One line as a checked record (None: not one): its id, state and what it says."""
    raw = parse_metric_line(line, check=False)  # its text made safe, no NaN
    if raw is None:
        return None
    ident, state = raw.get("id"), raw.get("state")
    if isinstance(ident, bool) or not isinstance(ident, int) or ident < 1 or state not in STATES:
        return None
    record: dict[str, Any] = {"id": ident, "state": state}
    for key in NUMBERS:
        number = finite_number(raw.get(key))
        if number is not None:
            record[key] = number
    if isinstance(raw.get("unit"), str):
        record["unit"] = raw["unit"]
    if isinstance(raw.get("ended_with_run"), bool):
        record["ended_with_run"] = raw["ended_with_run"]
    cause = _cause(raw.get("cause"))
    if cause is not None:
        record["cause"] = cause
    return record


def fold(
    records: Iterable[dict[str, Any]], into: dict[int, dict[str, Any]] | None = None
) -> dict[int, dict[str, Any]]:
    """Merge records by id (later keys over earlier ones); ``into``: what was folded so far."""
    found = into if into is not None else {}
    for record in records:
        ident = record["id"]
        if ident not in found and len(found) >= MAX_SLOWDOWNS:
            continue
        found.setdefault(ident, {"id": ident}).update(record)
    return found


def as_list(folded: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The slowdowns in order, those whose first line never came (no cause) left out."""
    return [dict(s) for _, s in sorted(folded.items()) if "cause" in s and "start_time" in s]


def read_slowdowns(directory: Path) -> list[dict[str, Any]]:
    """A run's slowdowns, folded, from the whole file ([] when there is none)."""
    records = []
    try:
        for line in file_lines(path_of(directory), "slowdowns file"):
            record = None if line is None else parse(line)
            if record is not None:
                records.append(record)
    except OSError:
        return []
    return as_list(fold(records))


class SlowdownTail:
    """The records appended to a run's ``slowdowns.jsonl`` since the last call."""

    def __init__(self, directory: Path) -> None:
        self.tailer = Tailer(path_of(directory), what="slowdowns file")

    def read_new(self) -> list[dict[str, Any]]:
        found = []
        for line in self.tailer.read_new(max_bytes=BITE):
            record = parse(line)
            if record is not None:
                found.append(record)
        return found

    def close(self) -> None:
        self.tailer.close()
