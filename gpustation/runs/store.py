"""Run history: one SQLite row per run, in ``<data dir>/runs.db``.

A row is built from the run directory (:func:`record_from_dir`): what was
launched (``run.json``), how it ended (``state.json``), what the run reported
(``metrics.jsonl``) and what its GPUs did meanwhile (``telemetry.jsonl``).
Building it again from the files is always safe, so the launcher writes the
row when a run starts and the supervisor rewrites it when the run ends.

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

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

from gpustation import paths
from gpustation.errors import UsageError
from gpustation.runs import rundir
from gpustation.runs.fold import MetricsFold
from gpustation.runs.gputrace import summarize_telemetry
from gpustation.runs.rundir import RunState
from gpustation.runs.summary import RunSummary

_JSON_FIELDS = {"overrides", "gpus", "argv", "summary", "error_tail"}
_BOOL_FIELDS = {"simulated", "oom"}


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
    }:
        return "TEXT"
    if name in _BOOL_FIELDS or name in {"exit_code", "steps", "total_steps", "malformed_metrics"}:
        return "INTEGER"
    return "REAL"


COLUMNS = [f.name for f in fields(RunSummary)]


def db_path() -> Path:
    return paths.data_dir() / "runs.db"


class RunStore:
    """The run history database. Cheap to create: it connects on first use."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._ready = False

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        path = self.path or db_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, timeout=10.0)
        try:
            if not self._ready:
                self._setup(conn)
                self._ready = True
            yield conn
            conn.commit()
        finally:
            conn.close()

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection | None]:
        """A read-only connection, or None when there is no database yet."""
        path = self.path or db_path()
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

    def _setup(self, conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA journal_mode=WAL")
        cols = ", ".join(
            f"{name} {_sql_type(name)}" + (" PRIMARY KEY" if name == "id" else "")
            for name in COLUMNS
        )
        conn.execute(f"CREATE TABLE IF NOT EXISTS runs ({cols})")
        # A database written by an older version gains the new columns.
        have = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
        for name in COLUMNS:
            if name not in have:
                conn.execute(f"ALTER TABLE runs ADD COLUMN {name} {_sql_type(name)}")
        conn.execute("CREATE INDEX IF NOT EXISTS runs_started ON runs(started_at)")

    def upsert(self, record: RunSummary) -> None:
        values = []
        for name in COLUMNS:
            value = getattr(record, name)
            if name in _JSON_FIELDS:
                value = json.dumps(value)
            elif name in _BOOL_FIELDS:
                value = int(bool(value))
            values.append(value)
        placeholders = ", ".join("?" for _ in COLUMNS)
        updates = ", ".join(f"{n}=excluded.{n}" for n in COLUMNS if n != "id")
        with self._connect() as conn:
            conn.execute(
                f"INSERT INTO runs ({', '.join(COLUMNS)}) VALUES ({placeholders}) "
                f"ON CONFLICT(id) DO UPDATE SET {updates}",
                values,
            )

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
                    value = {} if name in ("overrides", "summary") else []
            elif name in _BOOL_FIELDS:
                value = bool(value)
            elif name == "malformed_metrics":
                value = value or 0
            data[name] = value
        return RunSummary(**data)

    def get(self, run_id: str) -> RunSummary | None:
        row = None
        with self._read() as conn:
            if conn is not None:
                row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return self._record(row) if row else None

    def list_runs(self, limit: int | None = None, status: str | None = None) -> list[RunSummary]:
        """Runs, newest first."""
        query = "SELECT * FROM runs"
        params: list[Any] = []
        if status:
            query += " WHERE status = ?"
            params.append(status)
        query += " ORDER BY started_at DESC, id DESC"
        if limit:
            query += " LIMIT ?"
            params.append(limit)
        rows: list[sqlite3.Row] = []
        with self._read() as conn:
            if conn is not None:
                rows = conn.execute(query, params).fetchall()
        return [self._record(r) for r in rows]

    def resolve_id(self, text: str) -> str:
        """A run id from what the user typed: the id, ``last``, or a unique part of it."""
        ids: list[str] = []
        with self._read() as conn:
            if conn is not None:
                ids = [r[0] for r in conn.execute("SELECT id FROM runs ORDER BY started_at DESC")]
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
    run = rundir.read_run(directory) or {}
    if state is None:
        state = rundir.read_state(directory)
    record = RunSummary.from_run(run, directory)
    if state is not None:
        record.apply_state(state)
    elif record.started_at is not None:
        record.duration_s = max(0.0, time.time() - record.started_at)
    fold = MetricsFold()
    record.malformed_metrics = fold.read(directory / rundir.METRICS_FILE)
    fold.apply(record)

    tele = summarize_telemetry(directory / rundir.TELEMETRY_FILE)
    record.energy_j = tele.energy_j
    record.avg_power_w = tele.avg_power_w
    record.peak_power_w = tele.peak_power_w
    record.peak_temp_c = tele.peak_temp_c
    record.throttled_s = tele.throttled_s
    peaks = [v for v in (record.peak_vram_mib, tele.peak_vram_mib) if v is not None]
    record.peak_vram_mib = max(peaks) if peaks else None
    if record.energy_j is not None and record.work:
        record.energy_per_unit_j = record.energy_j / record.work
    return record


def sync_run(
    directory: Path, store: RunStore | None = None, state: RunState | None = None
) -> RunSummary:
    """Rebuild a run's row from its directory (and ``state``, if given) and save it."""
    record = record_from_dir(directory, state)
    (store or RunStore()).upsert(record)
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
