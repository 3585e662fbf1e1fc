"""The files of one run directory, and the process identity checks on them.

``runs/<id>/`` holds ``run.json`` (what was launched: the resolved preset,
argv, GPUs, the environment gpustation set), ``state.json`` (where the run
stands: PIDs, status, exit code), ``output.log``, ``metrics.jsonl``,
``telemetry.jsonl``, ``slowdowns.jsonl`` (what slowed the run down, as its
supervisor found it), ``supervisor.log``, ``exit-status`` (a fixed-size file
the supervisor overwrites in place with the run's end, so a full disk cannot
lose it), ``shared-gpus`` when another run used the same GPU meanwhile,
once someone asks for a stop, a ``stop_requested`` marker and, for a
multi-node run, ``nodes.json`` and ``nodes/<host>/`` (see ``nodes.py``). Every JSON file is
written atomically so a reader in another process never sees half a document.

Whatever a run (or anyone) puts in its directory, reading it never hangs: each
file is read through :mod:`gpustation.files` (regular files only, no links,
non-blocking, size-capped); one that is not a regular file is skipped, and
said so once on stderr.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpustation import paths, private, procstart
from gpustation.errors import UsageError
from gpustation.files import NotRegularFile, open_regular, read_bytes, read_text, say_skipped
from gpustation.textsafe import safe, safe_doc, valid_unicode

RUN_JSON = "run.json"
#: the user's note and tags (``runs note``, ``runs tag``)
ANNOTATIONS_JSON = "annotations.json"
STATE_JSON = "state.json"
OUTPUT_LOG = "output.log"
METRICS_FILE = "metrics.jsonl"
TELEMETRY_FILE = "telemetry.jsonl"
#: the run's slowdowns and their causes (``runs/slowdown/records.py``)
SLOWDOWNS_FILE = "slowdowns.jsonl"
SUPERVISOR_LOG = "supervisor.log"
STOP_MARKER = "stop_requested"
EXIT_STATUS = "exit-status"
#: a line per other run that used one of this run's GPUs at the same time
SHARED_GPUS = "shared-gpus"
#: the exit-status file's fixed size: written whole at start, overwritten in place at the end
EXIT_STATUS_BYTES = 4096
#: larger than any JSON file of a run directory gpustation writes
MAX_JSON_BYTES = 16 << 20

#: statuses of a run that has not ended
ACTIVE_STATUSES = ("starting", "running")
#: statuses of a run that has ended
FINAL_STATUSES = ("succeeded", "failed", "stopped", "lost")
#: the status of a run waiting in the GPU queue (runs/queue/): not started, not ended
QUEUED = "queued"
#: every status a run can have
STATUSES = (QUEUED, *ACTIVE_STATUSES, *FINAL_STATUSES)


@dataclass
class RunState:
    """Where a run stands: the content of ``state.json``."""

    id: str
    status: str = "starting"
    supervisor_pid: int | None = None
    #: when the supervisor started (Unix time); ``supervisor_start`` tells it from
    #: a process that reuses its pid (:mod:`gpustation.procstart`)
    supervisor_create_time: float | None = None
    child_pid: int | None = None
    child_create_time: float | None = None
    pgid: int | None = None
    #: [pid, create_time, start] of the child's descendants seen so far (torchrun's
    #: workers run in sessions of their own; these let a stop find them)
    descendants: list[list[Any]] = field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    oom: bool = False
    reason: str | None = None
    error_tail: list[str] = field(default_factory=list)
    #: the supervisor's and the child's start tokens (:mod:`gpustation.procstart`);
    #: None in a state written before they were kept (their create times are compared)
    supervisor_start: str | None = None
    child_start: str | None = None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunState:
        known = set(cls.__dataclass_fields__)
        # the reason and error tail quote the run's own output (rule 8)
        return cls(**{k: safe_doc(v) for k, v in data.items() if k in known})


def run_dir(run_id: str) -> Path:
    return paths.runs_dir() / run_id


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically: a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # whatever is there (a FIFO would block the write)
    private.write_text(tmp, json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a run's file; None when it is missing, damaged or not an object
    (or not a regular file, which is also said)."""
    try:
        data = json.loads(read_text(path, "run file", MAX_JSON_BYTES, follow=False))
    except NotRegularFile as err:
        say_skipped(err)
        return None
    except (UsageError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def string_list(value: Any) -> list[str]:
    """The strings of a list read from a file; nothing from a value of another shape
    (a string is not taken apart into letters)."""
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, str)]


def read_annotations(directory: Path) -> tuple[list[str], str | None]:
    """The user's tags and note of a run (``annotations.json``); what is of the wrong
    shape is left out."""
    data = read_json(directory / ANNOTATIONS_JSON) or {}
    note = data.get("note")
    # a file written by hand or by an older version may hold what SQLite refuses
    tags = [valid_unicode(t) for t in string_list(data.get("tags"))]
    return tags, valid_unicode(note) if isinstance(note, str) and note else None


def read_state(directory: Path) -> RunState | None:
    """The run's state: ``state.json``, or the ``exit-status`` the supervisor left
    when it could not write ``state.json`` (a full disk) and the run has ended."""
    data = read_json(directory / STATE_JSON)
    if data is not None and data.get("status") not in ACTIVE_STATUSES:
        return RunState.from_dict(data)
    final = read_exit_status(directory)
    if final is not None and (data is None or final.get("id") == data.get("id")):
        return RunState.from_dict({**(data or {}), **final})
    return None if data is None else RunState.from_dict(data)


def prepare_exit_status(directory: Path) -> None:
    """Create ``exit-status`` at its full size, so the end can be written without new blocks.

    Written with blanks (and allocated where the filesystem can), synced: later
    writes overwrite those bytes in place, which a full disk does not refuse.
    """
    fd = os.open(directory / EXIT_STATUS, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, private.FILE_MODE)
    try:
        try:
            os.posix_fallocate(fd, 0, EXIT_STATUS_BYTES)
        except OSError:
            pass  # not every filesystem allocates ahead; the blanks below still do
        os.pwrite(fd, b" " * EXIT_STATUS_BYTES, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_exit_status(directory: Path, state: RunState) -> None:
    """Overwrite ``exit-status`` in place with the run's end (raises OSError)."""
    data = {
        k: v
        for k, v in state.to_dict().items()
        if k in ("id", "status", "started_at", "ended_at", "exit_code", "signal", "oom", "reason")
    }
    tail = list(state.error_tail)
    while True:
        payload = json.dumps({**data, "error_tail": tail}).encode()
        if len(payload) < EXIT_STATUS_BYTES or not tail:
            break
        tail = tail[1:]
    if len(payload) >= EXIT_STATUS_BYTES:
        data["reason"] = str(data.get("reason") or "")[:200]
        payload = json.dumps(data).encode()
    # Never created here (no new blocks); whatever the run put in its place is not waited on.
    fd = os.open(directory / EXIT_STATUS, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{directory / EXIT_STATUS} is not a regular file")
        os.pwrite(fd, payload.ljust(EXIT_STATUS_BYTES), 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_exit_status(directory: Path) -> dict[str, Any] | None:
    """The end written to ``exit-status`` (None while it holds only blanks)."""
    try:
        raw = read_bytes(directory / EXIT_STATUS, "run file", EXIT_STATUS_BYTES + 1, follow=False)
    except NotRegularFile as err:
        say_skipped(err)
        return None
    except OSError:
        return None
    raw = raw.strip()
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("status") not in FINAL_STATUSES:
        return None
    return data


def write_state(directory: Path, state: RunState) -> None:
    write_json(directory / STATE_JSON, state.to_dict())


def read_run(directory: Path, exact: bool = False) -> dict[str, Any] | None:
    """``run.json``, its text made safe for any view (rule 8); ``exact`` for what
    launches from it (the supervisor, a resume, run again), which must run the
    argv and arguments as they were written."""
    run = read_json(directory / RUN_JSON)
    return run if exact or run is None else safe_doc(run)


def stop_requested(directory: Path) -> bool:
    return (directory / STOP_MARKER).exists()


def request_stop(directory: Path, by: str) -> None:
    """Leave the marker that makes the run's end count as ``stopped``."""
    marker = directory / STOP_MARKER
    if not marker.exists():
        write_json(marker, {"time": time.time(), "by": by, "pid": os.getpid()})


def read_stop(directory: Path) -> dict[str, Any] | None:
    """The stop marker: who asked, and the signals sent so far (None: no stop)."""
    return read_json(directory / STOP_MARKER)


def note_stop_signal(directory: Path, signal_name: str) -> None:
    """Record in the stop marker that ``signal_name`` was sent to the run."""
    marker = read_stop(directory) or {"time": time.time(), "by": "unknown"}
    marker.setdefault("signals", []).append(signal_name)
    write_json(directory / STOP_MARKER, marker)


def note_shared_gpus(directory: Path, other_id: str, gpus: list[int]) -> None:
    """Note in ``directory`` that run ``other_id`` used its GPUs ``gpus`` meanwhile."""
    line = json.dumps({"run": other_id, "gpus": gpus, "time": time.time()}) + "\n"
    # Another run's directory: whatever it holds there, appending must not wait on it.
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW
    fd = os.open(directory / SHARED_GPUS, flags, private.FILE_MODE)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{directory / SHARED_GPUS} is not a regular file")
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def shared_gpus(directory: Path) -> bool:
    """Whether another run used this run's GPUs while it ran (see gputrace.py)."""
    return (directory / SHARED_GPUS).exists()


def process_matches(pid: int | None, create_time: float | None, start: str | None = None) -> bool:
    """True when ``pid`` is alive, not a zombie, and is the process that started at
    ``start`` (its token, :mod:`gpustation.procstart`), else at ``create_time``.

    The start guards against PID reuse: after a reboot or a long time a recorded
    PID can belong to an unrelated process. The token is the one a step of the
    clock leaves alone; ``create_time`` is compared only for a state written
    before tokens were kept.
    """
    if not pid:
        return False
    if start is not None:
        return procstart.process_matches(pid, start)
    # start-up time: psutil, only when processes are inspected
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - create_time) <= 0.05
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        return False


def start_of(pid: int) -> str | None:
    """The start token of ``pid`` (None when it is gone), for :func:`process_matches`."""
    return procstart.process_start(pid)


def descendant_matches(entry: Sequence[Any]) -> bool:
    """True while a ``[pid, create_time, start]`` entry of ``descendants`` still runs
    (an entry of two, written before tokens were kept, by its create time)."""
    start = entry[2] if len(entry) > 2 and isinstance(entry[2], str) else None
    return process_matches(int(entry[0]), float(entry[1]), start)


def create_time_of(pid: int) -> float | None:
    # start-up time: psutil, only when processes are inspected
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def group_members(pgid: int | None) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    if not pgid:
        return []
    # start-up time: psutil, only when processes are inspected
    import psutil

    members: list[int] = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def tail_lines(path: Path, count: int = 20, max_bytes: int = 64 * 1024) -> list[str]:
    """The last ``count`` lines of a text file, reading only its end, as text safe for
    any view (a run's log: its error tail)."""
    try:
        with open_regular(path, "run file", follow=False) as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - max_bytes))
            data = fh.read(max_bytes)
    except NotRegularFile as err:
        say_skipped(err)
        return []
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace")
    # Progress bars redraw with \r; keep what the line finally showed.
    lines = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n")]
    if lines and not lines[-1]:
        lines.pop()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first one is probably cut
    return [safe(line.expandtabs()) for line in lines[-count:]]


def status_label(
    status: str, oom: bool = False, signal: str | None = None, exit_code: int | None = None
) -> str:
    """A run's status as people read it: ``failed (OOM)``, ``failed (exit 3)`` ..."""
    if status != "failed":
        return status
    if oom:
        return f"{status} (OOM)"
    if signal:
        return f"{status} ({signal})"
    if exit_code is not None:
        return f"{status} (exit {exit_code})"
    return status
