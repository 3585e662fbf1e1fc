"""Run history: one SQLite row per run, in ``<data dir>/runs.db``, an index of the run directories.

A row is built from the run directory (:func:`record_from_dir`): what was
launched (``run.json``), how it ended (``state.json``), what the run reported
(``metrics.jsonl``) and what its GPUs did meanwhile (``telemetry.jsonl``).
Building it again from the files is always safe, so the launcher writes the
row when a run starts and the supervisor rewrites it when the run ends.

``runs.db`` is an index, never the only record. Each row keeps a key of the
state it was built from (:func:`state_key`); a run directory whose state no
longer matches its row (or that has none: a write that found the database
locked, or full) is read from its files instead, so every reader sees every
run. A database that is missing, or not a database any more (garbage, a
truncated file), is rebuilt from ``runs/*/``, with a message on stderr: in
memory by a reader, on disk (the bad file kept aside) by the next writer.
Writers wait a bounded time for a lock held elsewhere and retry; one that
still cannot write leaves the row for the next writer (:meth:`RunStore.catch_up`).

Readers never write: :meth:`RunStore.get`, :meth:`RunStore.list_runs` and
:meth:`RunStore.resolve_id` open the database read-only (no schema set-up, no
file created when there is none), so following runs or listing them leaves
``runs.db`` as it was. Only :meth:`RunStore.upsert` (the launcher, the
supervisor, a stop) opens it for writing.

Each call opens its own connection, so any thread (a UI worker, the
supervisor) may use a :class:`RunStore`; WAL mode lets readers and the one
writer of a finishing run work at once.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from gpustation import paths, private, timefmt
from gpustation.errors import UsageError
from gpustation.runs import rundir
from gpustation.runs.fold import MetricsFold
from gpustation.runs.gputrace import TelemetrySummary, summarize_telemetry
from gpustation.runs.multinode.nodes import combined_telemetry, nodes_energy
from gpustation.runs.output import strict_json
from gpustation.runs.rundir import RunState
from gpustation.runs.slowdown.records import read_slowdowns
from gpustation.runs.summary import RunSummary
from gpustation.textsafe import safe_doc, valid_unicode

# Lists and dicts are kept as JSON text, flags as 0/1: both read off the summary's fields.
_JSON_FIELDS = {f.name for f in fields(RunSummary) if f.default_factory is not MISSING}
_BOOL_FIELDS = {f.name for f in fields(RunSummary) if f.type in ("bool", bool)}


def _sql_type(name: str) -> str:
    if name in _JSON_FIELDS or name in {
        "id",
        "preset",
        "title",
        "runner",
        "launcher",
        "run_dir",
        "status",
        "signal",
        "reason",
        "throughput_unit",
        "work_unit",
        "note",
        "ran_as",
    }:
        return "TEXT"
    if name in _BOOL_FIELDS or name in {"exit_code", "steps", "total_steps", "malformed_metrics"}:
        return "INTEGER"
    return "REAL"


COLUMNS = [f.name for f in fields(RunSummary)]
#: the key of the state a row was built from (not a field of RunSummary)
KEY_COLUMN = "indexed_state"
#: a writer waits this long for a lock held by another process, in all
WRITE_WAIT_S = 30.0


def state_key(state: RunState | None) -> str:
    """What a row must agree with its run directory's ``state.json`` on."""
    if state is None:
        return ""
    # strict: a NaN that Python's json read from a state file is null here, never a crash
    fields = [state.status, state.started_at, state.ended_at, state.exit_code, state.signal]
    return strict_json(fields, indent=None)


def _busy(err: sqlite3.Error) -> bool:
    text = str(err).lower()
    return "locked" in text or "busy" in text


def _corrupt(err: sqlite3.Error) -> bool:
    """The file is not a (sound) database: it must be rebuilt, not retried."""
    text = str(err).lower()
    return (
        isinstance(err, sqlite3.DatabaseError) and not isinstance(err, sqlite3.OperationalError)
    ) or ("malformed" in text or "not a database" in text)


_WARNED: set[str] = set()


def _warn(message: str) -> None:
    """Say it on stderr, once a process (a dashboard lists the runs every few seconds)."""
    if message in _WARNED:
        return
    _WARNED.add(message)
    try:
        print(f"gpustation: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def run_dirs(root: Path | None = None) -> list[Path]:
    """The run directories on disk (those with a ``run.json``)."""
    root = root or paths.runs_dir()
    try:
        return sorted(p.parent for p in root.glob(f"*/{rundir.RUN_JSON}"))
    except OSError:
        return []


# state.json's (mtime, size) -> its key, per path: a reader that lists the
# runs again reads only the states that changed (and those of active runs,
# whose end may be in exit-status).
_KEYS: dict[str, tuple[int, int, str]] = {}


def _dir_key(directory: Path) -> str | None:
    """The key of a run directory's state as it is on disk (None: no state)."""
    path = directory / rundir.STATE_JSON
    try:
        st = path.stat()
    except OSError:
        return None
    cached = _KEYS.get(str(path))
    if cached is not None and cached[:2] == (st.st_mtime_ns, st.st_size):
        return cached[2]
    state = rundir.read_state(directory)
    key = state_key(state)
    if state is not None and not state.active:
        _KEYS[str(path)] = (st.st_mtime_ns, st.st_size, key)
    return key


def db_path() -> Path:
    return paths.data_dir() / "runs.db"


class RunStore:
    """The run history database. Cheap to create: it connects on first use.

    ``root`` is the folder of the run directories it indexes (the data
    dir's ``runs/``); ``warn`` says on stderr when the index had to be rebuilt.
    """

    def __init__(
        self,
        path: Path | None = None,
        root: Path | None = None,
        warn: Callable[[str], None] = _warn,
        write_wait_s: float = WRITE_WAIT_S,
    ) -> None:
        self.path = path
        self.root = root
        self.warn = warn
        self.write_wait_s = write_wait_s
        self._ready = False

    @property
    def db(self) -> Path:
        return self.path or db_path()

    @property
    def runs_root(self) -> Path:
        return self.root or (self.db.parent / "runs" if self.path else paths.runs_dir())

    @contextmanager
    def _connect(self, except_id: str | None = None) -> Iterator[sqlite3.Connection]:
        """A connection for writing: the database made sound first, locks waited for."""
        path = self.db
        path.parent.mkdir(parents=True, exist_ok=True)
        if not self._ready:
            self._prepare(except_id)
        private.create(path)
        conn = sqlite3.connect(path, timeout=min(10.0, self.write_wait_s))
        try:
            yield conn
            conn.commit()
        finally:
            conn.close()

    def _retry(self, job: Callable[[], None]) -> None:
        """Run a write, retrying while another process holds the lock (bounded)."""
        deadline = time.monotonic() + self.write_wait_s
        rebuilt = False
        while True:
            try:
                job()
                return
            except sqlite3.Error as err:
                if _corrupt(err) and self._ready and not rebuilt:
                    # Found bad under us: rebuild (once), then try again.
                    self._ready, rebuilt = False, True
                    continue
                if not _busy(err) or time.monotonic() >= deadline:
                    raise
            time.sleep(0.05)

    def _prepare(self, except_id: str | None) -> None:
        """Create the schema; rebuild from the run directories a missing or unsound file.

        Under a lock across processes, so writers starting together rebuild once.
        """
        path = self.db
        with open(path.with_name(path.name + ".lock"), "a", opener=private.opener) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            missing = not path.exists()
            problem = None if missing else self._problem()
            if problem is not None:
                aside = path.with_name(f"{path.name}.bad-{timefmt.file_stamp()}")
                os.replace(path, aside)
                for extra in ("-wal", "-shm", "-journal"):
                    try:
                        os.unlink(f"{path}{extra}")
                    except FileNotFoundError:
                        pass
            private.create(path)  # SQLite gives its -wal and -shm files the same mode
            conn = sqlite3.connect(path, timeout=min(10.0, self.write_wait_s))
            try:
                self._setup(conn)
                conn.commit()
                if missing or problem is not None:
                    count = self._rebuild(conn, except_id)
                    if problem is not None:
                        self.warn(
                            f"{path} was unreadable ({problem}); kept it as {aside.name} and "
                            f"rebuilt the run history from {count} run directories"
                        )
                    elif count:
                        self.warn(
                            f"{path} was missing; rebuilt the run history "
                            f"from {count} run directories"
                        )
            finally:
                conn.close()
        self._ready = True

    def _problem(self) -> str | None:
        """Why the database file is not sound (None: it is, or is only busy)."""
        try:
            conn = sqlite3.connect(self.db, timeout=min(10.0, self.write_wait_s))
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
                have = conn.execute(
                    "SELECT name FROM sqlite_master WHERE type='table' AND name='runs'"
                ).fetchone()
                if have:
                    conn.execute(f"SELECT id FROM runs ORDER BY {KEY_COLUMN}").fetchall()
            finally:
                conn.close()
        except sqlite3.Error as err:
            if _corrupt(err):
                return str(err)
            if "no such column" in str(err):
                return None  # an older schema: _setup adds the column
            if _busy(err):
                return None
            raise
        return None

    def _rebuild(self, conn: sqlite3.Connection, except_id: str | None) -> int:
        count = 0
        for directory in run_dirs(self.runs_root):
            if directory.name == except_id:
                continue
            try:
                state = rundir.read_state(directory)
                record = record_from_dir(directory, state)
            except Exception:
                continue
            self._write(conn, record, state_key(state))
            count += 1
        conn.commit()
        return count

    def _setup(self, conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA journal_mode=WAL")
        cols = ", ".join(
            f"{name} {_sql_type(name)}" + (" PRIMARY KEY" if name == "id" else "")
            for name in COLUMNS
        )
        conn.execute(f"CREATE TABLE IF NOT EXISTS runs ({cols}, {KEY_COLUMN} TEXT)")
        # A database written by an older version gains the new columns.
        have = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
        for name in COLUMNS:
            if name not in have:
                conn.execute(f"ALTER TABLE runs ADD COLUMN {name} {_sql_type(name)}")
        if KEY_COLUMN not in have:
            conn.execute(f"ALTER TABLE runs ADD COLUMN {KEY_COLUMN} TEXT")
        conn.execute("CREATE INDEX IF NOT EXISTS runs_started ON runs(started_at)")

    @staticmethod
    def _write(conn: sqlite3.Connection, record: RunSummary, key: str | None) -> None:
        values: list[Any] = []
        for name in COLUMNS:
            value = getattr(record, name)
            if name in _JSON_FIELDS:
                value = strict_json(value, indent=None)
            elif name in _BOOL_FIELDS:
                value = int(bool(value))
            elif isinstance(value, float) and not math.isfinite(value):
                value = None
            elif isinstance(value, int) and not -(1 << 63) <= value < (1 << 63):
                value = None  # SQLite holds 64 bits
            elif isinstance(value, str):
                value = valid_unicode(value)  # SQLite refuses lone surrogates
            values.append(value)
        values.append(key)
        names = [*COLUMNS, KEY_COLUMN]
        placeholders = ", ".join("?" for _ in names)
        updates = ", ".join(f"{n}=excluded.{n}" for n in names if n != "id")
        conn.execute(
            f"INSERT INTO runs ({', '.join(names)}) VALUES ({placeholders}) "
            f"ON CONFLICT(id) DO UPDATE SET {updates}",
            values,
        )

    def upsert(self, record: RunSummary, key: str | None = None) -> None:
        """Write a run's row (``key``: of the state it was built from; None: unknown)."""

        def job() -> None:
            with self._connect(except_id=record.id) as conn:
                self._write(conn, record, key)

        self._retry(job)

    def catch_up(self) -> int:
        """Write the rows of run directories the index lags behind (a writer's job)."""
        stale = self._stale()
        if not stale:
            return 0

        def job() -> None:
            with self._connect() as conn:
                for directory in stale:
                    state = rundir.read_state(directory)
                    try:
                        record = record_from_dir(directory, state)
                    except Exception:  # deleted meanwhile or unreadable: as in a rebuild
                        continue
                    self._write(conn, record, state_key(state))

        self._retry(job)
        return len(stale)

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection | None]:
        """A read-only connection, or None when there is no database yet."""
        path = self.db
        if not path.exists():
            yield None
            return
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0)
        conn.row_factory = sqlite3.Row
        try:
            yield conn
        except sqlite3.OperationalError as err:
            if "no such table" not in str(err):
                raise
        finally:
            conn.close()

    def _rows(self) -> tuple[dict[str, tuple[RunSummary, str | None]], str | None]:
        """Every row with its key, and why the database could not be read (None: it could)."""
        rows: dict[str, tuple[RunSummary, str | None]] = {}
        if not self.db.exists():
            return rows, "missing"
        try:
            with self._read() as conn:
                if conn is not None:
                    for row in conn.execute("SELECT * FROM runs").fetchall():
                        # A Row's `in` looks at its values, not its column names.
                        has_key = KEY_COLUMN in row.keys()  # noqa: SIM118
                        key = row[KEY_COLUMN] if has_key else None
                        rows[row["id"]] = (self._record(row), key)
        except sqlite3.Error as err:
            if _busy(err):
                return {}, None  # locked: the run directories answer for now
            # Not a database, or not readable now (a full disk cannot take the
            # WAL's shared-memory file): the run directories answer.
            return {}, f"unreadable ({err})"
        return rows, None

    def _stale(self) -> list[Path]:
        rows, _problem = self._rows()
        stale = []
        for directory in run_dirs(self.runs_root):
            got = rows.get(directory.name)
            key = _dir_key(directory)
            if key is not None and (got is None or (got[1] is not None and got[1] != key)):
                stale.append(directory)
        return stale

    def _all(self) -> list[RunSummary]:
        """Every run: the index's rows, the run directories it lags behind read from their files."""
        rows, problem = self._rows()
        dirs = run_dirs(self.runs_root)
        on_disk = {directory.name for directory in dirs}
        found: dict[str, RunSummary] = {
            run_id: record
            for run_id, (record, _k) in rows.items()
            if run_id in on_disk or not self._vanished(record)
        }
        read = 0
        for directory in dirs:
            got = rows.get(directory.name)
            key = _dir_key(directory)
            # A row written without a key (None) is taken as it is.
            if key is None or (got is not None and got[1] in (None, key)):
                continue
            try:
                found[directory.name] = record_from_dir(directory)
                read += 1
            except Exception:
                continue
        if problem is not None and dirs:
            self.warn(
                f"{self.db} is {problem}; rebuilt the run history from {len(dirs)} run "
                "directories (the next run writes it again)"
            )
        return sorted(
            found.values(),
            key=lambda r: (r.started_at is not None, r.started_at or 0.0, r.id),
            reverse=True,
        )

    def _vanished(self, record: RunSummary) -> bool:
        """A row whose run directory, once under this store's runs, is gone (deleted by hand)."""
        if not record.run_dir:
            return False
        directory = Path(record.run_dir)
        return directory.parent == self.runs_root and not directory.exists()

    @staticmethod
    def _record(row: sqlite3.Row) -> RunSummary:
        data: dict[str, Any] = {}
        have = set(row.keys())
        for name in COLUMNS:
            # A database written by an older version lacks the newer columns.
            value = row[name] if name in have else None
            if name in _JSON_FIELDS:
                try:
                    value = json.loads(value) if value else None
                except ValueError:
                    value = None
                if value is None:
                    value = {} if name in ("overrides", "summary", "resumed_from") else []
            elif name in _BOOL_FIELDS:
                value = bool(value)
            elif name == "malformed_metrics":
                value = value or 0
            # a row written by an older version holds the run's text as it came (rule 8)
            data[name] = safe_doc(value) if isinstance(value, (str, list, dict)) else value
        return RunSummary(**data)

    def delete(self, run_id: str) -> None:
        """Remove a run's row (its directory is the caller's to remove first)."""

        def job() -> None:
            with self._connect() as conn:
                conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))

        self._retry(job)

    def get(self, run_id: str) -> RunSummary | None:
        for record in self._all():
            if record.id == run_id:
                return record
        return None

    def list_runs(self, limit: int | None = None, status: str | None = None) -> list[RunSummary]:
        """Runs, newest first."""
        records = [r for r in self._all() if not status or r.status == status]
        return records[:limit] if limit else records

    def resolve_id(self, text: str) -> str:
        """A run id from what the user typed: the id, ``last``, or a unique part of it."""
        ids = [r.id for r in self._all()]
        if text == "last" and ids:
            return ids[0]
        if text in ids:
            return text
        matches = [i for i in ids if i.startswith(text)] or [i for i in ids if text in i]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise UsageError(f"no run {text!r}; see `gpustation runs list`")
        raise UsageError(
            f"{text!r} matches {len(matches)} runs ({', '.join(matches[:4])}...); "
            "give more of the id"
        )


def record_from_dir(directory: Path, state: RunState | None = None) -> RunSummary:
    """Build a run's history row from its run directory.

    ``state`` stands in for ``state.json`` (one about to be written).
    """
    run = rundir.read_run(directory)
    if run is None and not directory.is_dir():
        # Deleted between being listed and being read: no row for it.
        raise FileNotFoundError(f"run directory {directory} is gone")
    run = run or {}
    if state is None:
        state = rundir.read_state(directory)
    record = RunSummary.from_run(run, directory)
    if state is not None:
        record.apply_state(state)
    elif record.started_at is not None:
        record.duration_s = max(0.0, time.time() - record.started_at)
    user_tags, record.note = rundir.read_annotations(directory)
    record.tags = [*record.tags, *(t for t in user_tags if t not in record.tags)]
    fold = MetricsFold()
    record.malformed_metrics = fold.read(directory / rundir.METRICS_FILE)
    fold.apply(record)
    record.slowdowns = read_slowdowns(directory)
    node_energy = nodes_energy(directory)  # a multi-node run: its nodes' GPUs, read on each
    tele = (
        combined_telemetry(node_energy)
        if node_energy
        else summarize_telemetry(directory / rundir.TELEMETRY_FILE)
    )
    return apply_telemetry(record, tele, directory)


def apply_telemetry(record: RunSummary, tele: TelemetrySummary, directory: Path) -> RunSummary:
    """Write what the run's GPUs did (``tele``) into ``record``, energy per unit of work too."""
    record.energy_j = tele.energy_j
    record.avg_power_w = tele.avg_power_w
    record.peak_power_w = tele.peak_power_w
    record.peak_temp_c = tele.peak_temp_c
    record.peak_memory_temp_c = tele.peak_memory_temp_c
    record.tensor_active_pct = tele.tensor_active_pct
    record.throttled_s = tele.throttled_s
    # A simulated GPU's memory is no figure of the run: only the run's own peak counts there.
    gpu_peak = None if record.simulated else tele.peak_vram_mib
    peaks = [v for v in (record.peak_vram_mib, gpu_peak) if v is not None]
    record.peak_vram_mib = max(peaks) if peaks else None
    # Another run used the same GPU meanwhile and the run's part was not told.
    record.energy_shared = (
        record.energy_j is not None and not tele.split and rundir.shared_gpus(directory)
    )
    record.energy_estimated = record.energy_j is not None and tele.estimated
    if record.energy_j is not None and record.work:
        record.energy_per_unit_j = record.energy_j / record.work
    return record


def sync_run(
    directory: Path, store: RunStore | None = None, state: RunState | None = None
) -> RunSummary:
    """Rebuild a run's row from its directory (and ``state``, if given) and save it."""
    if state is None:
        state = rundir.read_state(directory)
    record = record_from_dir(directory, state)
    (store or RunStore()).upsert(record, state_key(state))
    return record


def runs_by_status(db: Path | None = None) -> dict[str, int]:
    """How many runs the run history holds per status; {} when there is none.

    Opened read-only so the endpoint never creates or locks the database.
    """
    path = db or db_path()
    if not path.exists():
        return {}
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error:
        return {}
    try:
        rows = conn.execute("SELECT status, COUNT(*) FROM runs GROUP BY status").fetchall()
    except sqlite3.Error:
        return {}
    finally:
        conn.close()
    return {str(status): int(count) for status, count in rows if status}
