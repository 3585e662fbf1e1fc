"""The control journal: every hardware change, written down before it is made.

One JSON object per line in ``<state dir>/control-journal.jsonl``. Each entry
is flushed and fsynced before the change it describes, so that after a crash
(or a reboot mid-change) the journal still says what the card was set to
before gpustation touched it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpustation.errors import GpustationError
from gpustation.paths import state_dir

JOURNAL_NAME = "control-journal.jsonl"

#: The kinds of change the journal records.
POWER_LIMIT = "power_limit"
FAN_SPEED = "fan_speed"
FAN_AUTO = "fan_auto"


def journal_path() -> Path:
    return state_dir() / JOURNAL_NAME


@dataclass(slots=True)
class JournalEntry:
    time: float
    host: str
    gpu: int
    uuid: str | None
    what: str  # power_limit | fan_speed | fan_auto
    previous: Any
    new: Any
    command: str
    fan: int | None = None
    simulated: bool = False
    pid: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JournalEntry:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def record(
    *,
    gpu: int,
    uuid: str | None,
    what: str,
    previous: Any,
    new: Any,
    command: str,
    fan: int | None = None,
    simulated: bool = False,
    path: Path | None = None,
) -> JournalEntry:
    """Append one entry and make it durable; raise GpustationError if that fails.

    Callers make the change only after this returns, so a change is never made
    that the journal does not know about.
    """
    entry = JournalEntry(
        time=time.time(),
        host=socket.gethostname(),
        gpu=gpu,
        uuid=uuid,
        what=what,
        previous=previous,
        new=new,
        command=command,
        fan=fan,
        simulated=simulated,
        pid=os.getpid(),
    )
    path = path or journal_path()
    line = json.dumps(entry.to_dict(), separators=(",", ":")) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND keeps lines from concurrent writers (a fan controller and a
        # `power set`) whole.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        raise GpustationError(
            f"cannot write the control journal {path}: {err.strerror or err}; "
            "nothing was changed. Check that the state directory is writable "
            "(or set GPUSTATION_STATE_DIR)."
        ) from None
    return entry


def read_entries(path: Path | None = None) -> Iterator[JournalEntry]:
    """The journal's entries, oldest first; a torn last line is skipped."""
    path = path or journal_path()
    try:
        f = path.open(encoding="utf-8")
    except FileNotFoundError:
        return
    with f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield JournalEntry.from_dict(json.loads(line))
            except (ValueError, TypeError):
                continue


def describe_value(what: str, value: Any) -> str:
    """A journal value as a person reads it."""
    if value is None:
        return "n/a"
    if what == POWER_LIMIT and isinstance(value, (int, float)):
        return f"{value:g} W"
    if isinstance(value, dict):
        mode = value.get("mode")
        pct = value.get("pct")
        if mode == "auto":
            return "auto" + (f" ({pct:g} %)" if isinstance(pct, (int, float)) else "")
        if isinstance(pct, (int, float)):
            return f"{pct:g} %"
        return str(mode)
    if isinstance(value, (int, float)):
        return f"{value:g} %"
    return str(value)


_PROFILE_COMMAND = re.compile(r"^gpustation profile apply (\S+)")


def active_profile(journal: Path | None = None) -> str | None:
    """The hardware profile in force, from the control journal; None if unknown.

    The journal (JSON Lines in the state directory, written by the control
    layer) attributes each change to the command that made it. When the latest
    change came from ``gpustation profile apply NAME``, NAME is in force; a
    later manual change (``power set``, ``fan``...) means no profile is.
    Read defensively: a torn or foreign line must not break the endpoint.
    """
    path = journal or journal_path()
    try:
        with open(path, "rb") as fh:
            # The journal only grows; its tail holds the latest entries.
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            lines = fh.read().splitlines()
    except OSError:
        return None
    for raw in reversed(lines):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        if entry.get("profile"):
            return str(entry["profile"])
        m = _PROFILE_COMMAND.match(str(entry.get("command") or ""))
        return m.group(1) if m else None
    return None
