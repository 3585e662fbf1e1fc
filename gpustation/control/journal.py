"""The control journal: every hardware change, written down before it is made.

One JSON object per line in ``<state dir>/control-journal.jsonl``. A change
is written as an *intent* (what the card was, what it will be), fsynced,
then made, then *settled* by a second, short line with the same ``id``: the
outcome (``made`` with the value read back from the card, or ``refused`` with
the driver's answer). After a crash between the two, the journal still says
what the card was before gpustation touched it (outcome ``unknown``).

Rules that keep it the truth about the hardware:

* :func:`control_lock` is one lock across processes (``flock`` on
  ``control.lock`` beside the journal); callers hold it from reading the
  current value, through the intent and the change, to the read-back, so two
  commands at once never journal a "previous" value the other has replaced.
* A write that does not land whole (a full disk, a short write) is cut back
  off the file and refuses the change; a torn last line left by someone else
  is ended before the next entry, so it never swallows it.
* Readers take any file: garbage, lines that are not objects and fields of
  the wrong type are counted as problems and skipped (:func:`read_journal`).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import threading
import time
import uuid as uuidlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpustation import private
from gpustation.errors import GpustationError
from gpustation.paths import state_dir

JOURNAL_NAME = "control-journal.jsonl"
LOCK_NAME = "control.lock"

#: The kinds of change the journal records.
POWER_LIMIT = "power_limit"
FAN_SPEED = "fan_speed"
FAN_AUTO = "fan_auto"

#: Outcomes of a change.
MADE = "made"
REFUSED = "refused"
UNKNOWN = "unknown"  # intent written, no outcome (the process died in between)


def journal_path() -> Path:
    return state_dir() / JOURNAL_NAME


# ---- the lock across processes ------------------------------------------------

_local = threading.RLock()
_held: dict[str, Any] = {"depth": 0, "fd": None}


@contextmanager
def control_lock(path: Path | None = None, timeout_s: float = 30.0) -> Iterator[None]:
    """Hold the control lock (re-entrant within a process).

    Covers read-current, journal, set and read-back. Raises GpustationError
    when another process holds it for longer than ``timeout_s``.
    """
    with _local:
        if _held["depth"] == 0:
            lock_path = path or journal_path().with_name(LOCK_NAME)
            try:
                lock_path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, private.FILE_MODE)
            except OSError as err:
                raise GpustationError(
                    f"cannot open the control lock {lock_path}: {err.strerror or err}; "
                    "nothing was changed. Check that the state directory is writable "
                    "(or set GPUSTATION_STATE_DIR)."
                ) from None
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        os.close(fd)
                        raise GpustationError(
                            f"another gpustation process has held {lock_path} for "
                            f"{timeout_s:g} s; nothing was changed."
                        ) from None
                    time.sleep(0.01)  # polling a lock another process holds
            _held["fd"] = fd
        _held["depth"] += 1
        try:
            yield
        finally:
            _held["depth"] -= 1
            if _held["depth"] == 0:
                fd = _held["fd"]
                _held["fd"] = None
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)


# ---- entries --------------------------------------------------------------------


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
    id: str = ""
    #: made | refused | unknown (no outcome line: the process died in between)
    outcome: str = UNKNOWN
    #: the value read back from the card after the change
    read_back: Any = None
    #: the driver's answer when it refused
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JournalEntry:
        """An entry from one line's object; ValueError naming the field that is wrong."""
        for name, types in _REQUIRED.items():
            if not isinstance(data.get(name), types) or isinstance(data.get(name), bool):
                raise ValueError(f"{name!r} is missing or not {_TYPE_NAMES[name]}")
        for name, types in _OPTIONAL.items():
            value = data.get(name)
            if value is not None and not isinstance(value, types):
                raise ValueError(f"{name!r} is not {_TYPE_NAMES[name]}")
        known = set(cls.__dataclass_fields__)
        # A line may leave out what it does not know (a hand-written or foreign one).
        entry = cls(**(_ABSENT | {k: v for k, v in data.items() if k in known}))
        entry.outcome = str(data.get("outcome") or (MADE if not entry.id else UNKNOWN))
        return entry


_REQUIRED: dict[str, Any] = {"time": (int, float), "gpu": int, "what": str}
#: what an entry holds for a field its line leaves out
_ABSENT: dict[str, Any] = {"host": "", "uuid": None, "previous": None, "new": None, "command": ""}
_OPTIONAL: dict[str, Any] = {
    "host": str,
    "uuid": str,
    "command": str,
    "fan": int,
    "pid": int,
    "id": str,
    "outcome": str,
    "error": str,
}
_TYPE_NAMES = {
    "time": "a number",
    "gpu": "a GPU index",
    "what": "text",
    "host": "text",
    "uuid": "text",
    "command": "text",
    "fan": "a fan index",
    "pid": "a process id",
    "id": "text",
    "outcome": "text",
    "error": "text",
}


def _append(path: Path, doc: dict[str, Any]) -> None:
    """Append one line whole and durable, or leave the file as it was and raise."""
    line = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode() + b"\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, private.FILE_MODE)
    except OSError as err:
        raise _unwritable(path, err) from None
    try:
        size = os.fstat(fd).st_size
        # A torn last line (another writer died mid-line) is ended first, so
        # it cannot swallow this entry.
        data = line if size == 0 or os.pread(fd, 1, size - 1) == b"\n" else b"\n" + line
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(28, f"only {written} of {len(data)} bytes were written")
            os.fsync(fd)
        except OSError as err:
            try:
                os.ftruncate(fd, size)  # no fragment stays behind
            except OSError:
                pass
            raise _unwritable(path, err) from None
    finally:
        os.close(fd)


def _unwritable(path: Path, err: OSError) -> GpustationError:
    return GpustationError(
        f"cannot write the control journal {path}: {err.strerror or err}; "
        "nothing was changed. Check that the state directory is writable and has "
        "free space (or set GPUSTATION_STATE_DIR)."
    )


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
    """Write the intent of one change; raise GpustationError if it does not land.

    Callers make the change only after this returns, so a change is never made
    that the journal does not know about, and then call :func:`settle`.
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
        id=uuidlib.uuid4().hex[:16],
    )
    doc = entry.to_dict()
    for key in ("outcome", "read_back", "error"):
        del doc[key]
    with control_lock(None if path is None else path.with_name(LOCK_NAME)):
        _append(path or journal_path(), doc)
    return entry


def settle(
    entry: JournalEntry,
    outcome: str,
    read_back: Any = None,
    error: str | None = None,
    path: Path | None = None,
) -> None:
    """Write what became of a change; never raises (the change is already made)."""
    entry.outcome, entry.read_back, entry.error = outcome, read_back, error
    doc: dict[str, Any] = {"id": entry.id, "outcome": outcome, "time": time.time()}
    if read_back is not None:
        doc["read_back"] = read_back
    if error is not None:
        doc["error"] = error
    try:
        with control_lock(None if path is None else path.with_name(LOCK_NAME)):
            _append(path or journal_path(), doc)
    except GpustationError:
        pass  # the intent is on disk; its outcome stays "unknown"


@dataclass(slots=True)
class JournalRead:
    entries: list[JournalEntry]
    #: one line per line that could not be read: "line N: why"
    problems: list[str]


def read_journal(path: Path | None = None) -> JournalRead:
    """Every entry, oldest first, with outcomes merged in; bad lines reported, skipped."""
    path = path or journal_path()
    entries: list[JournalEntry] = []
    by_id: dict[str, JournalEntry] = {}
    problems: list[str] = []
    try:
        with path.open("rb") as f:
            for number, raw in enumerate(f, 1):
                raw = raw.strip()
                if not raw:
                    continue
                try:
                    doc = json.loads(raw.decode("utf-8"))
                    if not isinstance(doc, dict):
                        raise ValueError(f"a JSON {type(doc).__name__}, not an object")
                    if "what" not in doc and isinstance(doc.get("id"), str):
                        target = by_id.get(doc["id"])
                        if target is None:
                            raise ValueError(f"an outcome for unknown change {doc['id']!r}")
                        target.outcome = str(doc.get("outcome") or UNKNOWN)
                        target.read_back = doc.get("read_back")
                        err = doc.get("error")
                        target.error = None if err is None else str(err)
                        continue
                    entry = JournalEntry.from_dict(doc)
                except (ValueError, UnicodeDecodeError, RecursionError) as err:
                    problems.append(f"line {number}: {_why(err)}")
                    continue
                entries.append(entry)
                if entry.id:
                    by_id[entry.id] = entry
    except FileNotFoundError:
        pass
    except OSError as err:
        problems.append(f"cannot read {path}: {err.strerror or err}")
    return JournalRead(entries, problems)


def _why(err: BaseException) -> str:
    if isinstance(err, UnicodeDecodeError):
        return "not text (binary data)"
    if isinstance(err, RecursionError):
        return "nested too deeply"
    if isinstance(err, json.JSONDecodeError):
        return f"not JSON ({err.msg})"
    return str(err)


def read_entries(path: Path | None = None) -> Iterator[JournalEntry]:
    """The journal's entries, oldest first; lines that cannot be read are skipped."""
    yield from read_journal(path).entries


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
        if not isinstance(entry, dict) or "what" not in entry:
            continue  # an outcome line, or not an entry at all
        if entry.get("profile"):
            return str(entry["profile"])
        m = _PROFILE_COMMAND.match(str(entry.get("command") or ""))
        return m.group(1) if m else None
    return None
