"""One energy account per GPU, kept by every run on it together.

A GPU's energy counter counts every process on it as one. Each run's
supervisor samples the GPU on its own clock; if each split the counter by the
shares it saw, two runs' parts would come from different instants and need
not add up to the counter (they drifted 1.4 % over on an H200). So the runs
on a GPU keep one account of it, ``<state dir>/gpu-energy/<UUID>.json``:

- at each of its samples, a run's supervisor takes the account's lock (held
  for one read and one write of a small file), names its run and the run's
  processes, adds what the sample shows to what is pending (the shares of
  :func:`~gpustation.telemetry.shares.gpu_shares`, weighted by the power the
  GPU drew: ``telemetry/shares.py`` says why), and when its counter reading
  is newer and higher than the account's last, closes an *entry*: the rise
  since the last reading, split by what is pending between the runs (their
  processes' shares), other processes (by PID), ``unattributed`` (processes
  the driver gives no share for) and ``idle``;
- time when no process held the GPU is split evenly between the runs on it
  then, as the SMs' idle time is split between the processes holding the
  card: the price of holding it, which a run alone on its GPU pays whole (its
  energy is then the counter's, as ever); ``idle`` only when no run was there;
- every supervisor then takes the entries closed since it last looked and
  records its run's part in the run's own telemetry (``gpu_energy``, see
  :mod:`gpustation.runs.gputrace`), so the run directory alone gives the
  run's energy.

Every entry's parts add up to its rise, so the parts of all runs and other
processes on a GPU add up to its counter over any span of entries. The
account keeps the last :data:`KEPT_ENTRIES` entries (minutes of them): a
supervisor reads every second. An account nobody has touched for
:data:`STALE_S` starts afresh from the next reading.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpustation import paths, private
from gpustation.files import read_bytes
from gpustation.telemetry.model import GpuSample
from gpustation.telemetry.shares import IDLE, UNATTRIBUTED, gpu_shares

#: entries the account keeps for its readers
KEPT_ENTRIES = 64
#: an account (or a run in it) not touched for this long is over
STALE_S = 30.0
#: larger than any account gpustation writes
MAX_ACCOUNT_BYTES = 1 << 20

_RUN = "run:"
_PID = "pid:"


def accounts_dir() -> Path:
    return paths.state_dir() / "gpu-energy"


def _file_name(uuid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", uuid)[:128] or "gpu"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class GpuAccount:
    """One run's view of one GPU's shared account (see the module)."""

    def __init__(self, uuid: str, run_id: str, directory: Path | None = None) -> None:
        self.run_id = run_id
        root = directory if directory is not None else accounts_dir()
        private.make_dir(root)
        name = _file_name(uuid)
        self.path = root / f"{name}.json"
        self._lock_path = root / f"{name}.lock"
        #: the newest entry this run has taken (-1: none yet)
        self._seen_seq: int | None = None

    def add(
        self, gpu: GpuSample, energy_j: float | None, pids: Iterable[int], now: float
    ) -> list[list[float]]:
        """Add one sample of the GPU read at ``now``, with ``energy_j`` its counter
        when this sample read it afresh (None otherwise); the entries closed since
        the last call, as ``[t0, t1, rise_j, part_j, seen]`` (``seen``: 1 when the
        run's processes were on the GPU during the entry, else 0)."""
        fd = private.open_fd(self._lock_path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            account = self._read()
            if self._seen_seq is None or account["seq"] < self._seen_seq:
                # Joining now (or the account started over): earlier entries are not this run's.
                self._seen_seq = account["seq"]
            self._update(account, gpu, energy_j, set(pids), now)
            taken = self._take(account)
            self._write(account)
            return taken
        finally:
            os.close(fd)  # closing releases the lock

    def leave(self) -> None:
        """The run has ended: it is no longer on the GPU."""
        with contextlib.suppress(OSError):
            fd = private.open_fd(self._lock_path, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                account = self._read()
                account["runs"].pop(self.run_id, None)
                self._write(account)
            finally:
                os.close(fd)

    # ---- the account -------------------------------------------------------------------

    def _read(self) -> dict[str, Any]:
        try:
            doc = json.loads(read_bytes(self.path, "GPU energy account", MAX_ACCOUNT_BYTES))
        except (OSError, ValueError):
            doc = None
        if not isinstance(doc, dict) or not self._sound(doc):
            return {"seq": 0, "runs": {}, "pending": {}, "seen": [], "entries": []}
        return doc

    @staticmethod
    def _sound(doc: dict[str, Any]) -> bool:
        return (
            isinstance(doc.get("seq"), int)
            and isinstance(doc.get("runs"), dict)
            and isinstance(doc.get("pending"), dict)
            and all(_finite(v) for v in doc["pending"].values())
            and isinstance(doc.get("seen"), list)
            and isinstance(doc.get("entries"), list)
            and all(isinstance(e, dict) for e in doc["entries"])
        )

    def _write(self, account: dict[str, Any]) -> None:
        temporary = self.path.with_suffix(".tmp")
        private.write_text(temporary, json.dumps(account, separators=(",", ":")))
        os.replace(temporary, self.path)

    def _update(
        self,
        account: dict[str, Any],
        gpu: GpuSample,
        energy: float | None,
        pids: set[int],
        now: float,
    ) -> None:
        last_time = account.get("last_time")
        if last_time is not None and (
            not _finite(last_time) or now - last_time > STALE_S or now < last_time - STALE_S
        ):
            # Nobody has kept the account lately: start afresh from this reading.
            account.update(pending={}, seen=[], last_time=None, last_j=None)
        runs: dict[str, Any] = account["runs"]
        for run_id in [r for r, info in runs.items() if not self._fresh(info, now)]:
            del runs[run_id]
        runs[self.run_id] = {"time": now, "pids": sorted(pids)}
        if gpu.lost:
            return
        if account.get("last_time") is not None:
            self._gather(account, gpu)
        if energy is None or not _finite(energy):
            return
        last_j = account.get("last_j")
        if last_j is None or not _finite(last_j) or energy < 0.5 * last_j:
            # The first reading, or a counter that started again (a driver reload).
            account.update(pending={}, seen=[], last_time=now, last_j=energy)
            return
        if energy <= last_j or now <= account["last_time"]:
            # Read a moment before the account's last reading (another run's):
            # its shares count, its counter does not.
            return
        self._close(account, energy - last_j, now)
        account.update(last_time=now, last_j=energy)

    @staticmethod
    def _fresh(info: Any, now: float) -> bool:
        return (
            isinstance(info, dict) and _finite(info.get("time")) and now - info["time"] <= STALE_S
        )

    def _gather(self, account: dict[str, Any], gpu: GpuSample) -> None:
        owners: dict[int, str] = {}
        for run_id, info in account["runs"].items():
            for pid in info.get("pids") or ():
                if isinstance(pid, int):
                    owners[pid] = run_id
        shares = gpu_shares(gpu.processes or [])
        drawn = gpu.power_w if gpu.power_w is not None and gpu.power_w > 0 else 1.0
        pending: dict[str, float] = account["pending"]
        seen: list[str] = account["seen"]

        def put(key: str, part: float) -> None:
            if part > 0:
                pending[key] = pending.get(key, 0.0) + part * drawn

        for pid, part in shares.processes.items():
            owner = owners.get(pid)
            put(_RUN + owner if owner is not None else f"{_PID}{pid}", part)
            if owner is not None and owner not in seen:
                seen.append(owner)
        put(UNATTRIBUTED, shares.unattributed)
        here = list(account["runs"])
        for run_id in here:
            put(_RUN + run_id, shares.idle / len(here))
        if not here:
            put(IDLE, shares.idle)

    def _close(self, account: dict[str, Any], rise: float, now: float) -> None:
        pending: dict[str, float] = account["pending"]
        weight = sum(pending.values())
        parts = (
            {key: round(w / weight * rise, 4) for key, w in pending.items()}
            if weight > 0
            else {UNATTRIBUTED: rise}
        )
        account["seq"] += 1
        account["entries"].append(
            {
                "seq": account["seq"],
                "t0": account["last_time"],
                "t1": now,
                "rise_j": round(rise, 4),
                "parts": parts,
                "seen": list(account["seen"]),
            }
        )
        del account["entries"][:-KEPT_ENTRIES]
        account.update(pending={}, seen=[])

    def _take(self, account: dict[str, Any]) -> list[list[float]]:
        seen_seq = self._seen_seq if self._seen_seq is not None else account["seq"]
        taken: list[list[float]] = []
        for entry in account["entries"]:
            if not isinstance(entry.get("seq"), int) or entry["seq"] <= seen_seq:
                continue
            parts = entry.get("parts") if isinstance(entry.get("parts"), dict) else {}
            part = parts.get(_RUN + self.run_id, 0.0)
            if not all(_finite(entry.get(k)) for k in ("t0", "t1", "rise_j")) or not _finite(part):
                continue
            seen = 1 if self.run_id in (entry.get("seen") or ()) else 0
            taken.append([entry["t0"], entry["t1"], entry["rise_j"], part, seen])
        self._seen_seq = max(seen_seq, account["seq"])
        return taken
