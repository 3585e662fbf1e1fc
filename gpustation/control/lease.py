"""Leases: which program owns which GPUs' power limits, taken under the control lock.

A program that keeps a card's limit changed for a while (a sweep sets one per
point) takes a lease on those GPUs: one small JSON file in ``<state dir>/leases``
naming the owner, its pid and the start time of that process, and each GPU's
index and UUID. While the owner lives, every other power change on those GPUs
(:func:`gpustation.control.power.apply_power`) is refused naming it, so two
owners never overwrite each other's limits. The owner releases the lease once
its limits are back. A lease whose process is gone (killed outright, the
machine lost power) is a *leftover*: its GPUs keep the limit it set, and
every view says so, naming the command that puts them back.

GPUs are matched by UUID, never by index alone: a card moved to another slot,
or another machine's (or another simulated card's) lease, is not this one.
The owner is recognised by pid *and* start time, so a reused pid is not it.

Kept light (no dataclasses, no psutil on Linux): ``gpustation snapshot``
reads the leftovers on every call.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gpustation.errors import GpustationError
from gpustation.paths import state_dir
from gpustation.procstart import process_matches, process_start

LEASE_DIR = "leases"


class Lease:
    """One owner's claim on some GPUs' power limits."""

    __slots__ = ("created_at", "gpus", "id", "owner", "pid", "restore", "simulated", "start")

    def __init__(
        self,
        id: str,
        owner: str,
        gpus: Sequence[tuple[int, str | None]],
        simulated: bool,
        restore: str = "",
        pid: int | None = None,
        start: str | None = None,
        created_at: float | None = None,
    ) -> None:
        self.id = id
        #: who holds it, as a person reads it: "sweep 20260101-...-sweep-x"
        self.owner = owner
        #: (index when taken, UUID) of each GPU
        self.gpus = [(int(i), u) for i, u in gpus]
        self.simulated = simulated
        #: the command that gives the limits back when the owner is gone
        self.restore = restore
        self.pid = os.getpid() if pid is None else pid
        self.start = process_start(self.pid) if start is None else start
        self.created_at = time.time() if created_at is None else created_at

    @property
    def alive(self) -> bool:
        return process_matches(self.pid, self.start)

    def covers(self, index: int, uuid: str | None) -> bool:
        """True when this lease is on that GPU (by UUID; by index only where neither has one)."""
        for i, u in self.gpus:
            if u is not None and uuid is not None:
                if u == uuid:
                    return True
            elif i == index:
                return True
        return False

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "owner": self.owner,
            "gpus": [{"index": i, "uuid": u} for i, u in self.gpus],
            "simulated": self.simulated,
            "restore": self.restore,
            "pid": self.pid,
            "start": self.start,
            "created_at": self.created_at,
        }

    @classmethod
    def from_dict(cls, doc: Any) -> Lease:
        """ValueError for a document of the wrong shape."""
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        try:
            gpus = [(g["index"], g.get("uuid")) for g in doc["gpus"]]
            if not all(type(i) is int and (u is None or isinstance(u, str)) for i, u in gpus):
                raise ValueError("a GPU of the wrong type")
            lease = cls(
                id=str(doc["id"]),
                owner=str(doc["owner"]),
                gpus=gpus,
                simulated=bool(doc.get("simulated")),
                restore=str(doc.get("restore") or ""),
                pid=int(doc["pid"]),
                start=None if doc.get("start") is None else str(doc["start"]),
                created_at=float(doc.get("created_at") or 0.0),
            )
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"missing or wrong field ({err})") from None
        if lease.start is None:
            lease.start = ""  # never matches: a lease without a start time is nobody's
        return lease

    def describe(self) -> str:
        gpus = ", ".join(str(i) for i, _ in self.gpus)
        return f"{self.owner} (pid {self.pid}, on GPU {gpus})"


class LeaseHeld(GpustationError):
    """Another live program owns some of these GPUs' limits."""

    def __init__(self, holders: Sequence[Lease], what: str = "") -> None:
        self.holders = list(holders)
        names = "; ".join(h.describe() for h in self.holders)
        super().__init__(
            f"{what or 'the power limit'} is refused: {names} owns these GPUs' power limits "
            "now; wait for it to end or stop it (`sweep --force` and `power set --force` end "
            "it first, and it puts its limits back). Nothing was changed."
        )


def lease_dir() -> Path:
    return state_dir() / LEASE_DIR


def _path(lease_id: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in lease_id)
    return lease_dir() / f"{safe}.json"


def read_leases(simulated: bool | None = None) -> list[Lease]:
    """Every lease on disk (of real or simulated GPUs when ``simulated`` is given);
    a damaged file is skipped, never the whole list."""
    root = lease_dir()
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    out: list[Lease] = []
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(root / name, "rb") as f:
                lease = Lease.from_dict(json.loads(f.read(64 * 1024)))
        except (OSError, ValueError, RecursionError):
            continue
        if simulated is None or lease.simulated == simulated:
            out.append(lease)
    return out


def holders(
    gpus: Iterable[tuple[int, str | None]], simulated: bool, but: str | None = None
) -> list[Lease]:
    """The live leases (other than ``but``) on any of ``gpus``."""
    wanted = list(gpus)
    return [
        lease
        for lease in read_leases(simulated)
        if lease.id != but and lease.alive and any(lease.covers(i, u) for i, u in wanted)
    ]


def check_free(
    gpus: Iterable[tuple[int, str | None]], simulated: bool, owner: str | None, what: str = ""
) -> None:
    """Raise LeaseHeld when a live owner other than ``owner`` holds any of ``gpus``."""
    held = holders(gpus, simulated, but=owner)
    if held:
        raise LeaseHeld(held, what)


def take(lease: Lease) -> None:
    """Write ``lease``, under the control lock; LeaseHeld when a live owner has its GPUs."""
    # start-up time: the journal (dataclasses) stays off the snapshot's path
    from gpustation.control.journal import control_lock

    with control_lock():
        check_free(lease.gpus, lease.simulated, lease.id, f"{lease.owner}'s lease")
        path = _path(lease.id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(lease.to_dict()), encoding="utf-8")
            os.replace(tmp, path)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            raise GpustationError(
                f"cannot write the lease {path}: {err.strerror or err}; nothing was changed. "
                "Check that the state directory is writable (or set GPUSTATION_STATE_DIR)."
            ) from None


def release(lease_id: str) -> None:
    """Remove a lease (its limits are back); nothing when there is none."""
    try:
        _path(lease_id).unlink()
    except FileNotFoundError:
        pass


def get(lease_id: str) -> Lease | None:
    try:
        with open(_path(lease_id), "rb") as f:
            return Lease.from_dict(json.loads(f.read(64 * 1024)))
    except (OSError, ValueError, RecursionError):
        return None


def leftovers(simulated: bool) -> list[Lease]:
    """Leases whose owner is gone without giving the limits back, oldest first."""
    return sorted(
        (lease for lease in read_leases(simulated) if not lease.alive),
        key=lambda lease: (lease.created_at, lease.id),
    )


def left_notes(gpus: Iterable[tuple[int, str | None]], simulated: bool) -> dict[int, str]:
    """GPU index -> "limit left by sweep ID; `gpustation sweeps restore ID`" for each
    of ``gpus`` (index, UUID) whose limit a gone owner left changed."""
    found = leftovers(simulated)
    notes: dict[int, str] = {}
    if not found:
        return notes
    for index, uuid in gpus:
        for lease in found:
            if uuid is not None and any(u == uuid for _, u in lease.gpus):
                note = f"limit left by {lease.owner}"
                notes[index] = note + (f"; `{lease.restore}`" if lease.restore else "")
                break
    return notes


def end_holders(found: Sequence[Lease], timeout_s: float = 60.0) -> None:
    """Ask each live holder to end (SIGTERM) and wait until it has released its lease.

    A holder gives its limits back on the way out. GpustationError when one is
    still holding at the deadline.
    """
    for lease in found:
        if lease.alive:
            try:
                os.kill(lease.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            except PermissionError:
                raise GpustationError(
                    f"{lease.owner} (pid {lease.pid}) belongs to another user; stop it as "
                    "that user or with sudo. Nothing was changed."
                ) from None
    deadline = time.monotonic() + timeout_s
    waiting = list(found)
    while waiting:
        waiting = [x for x in waiting if x.alive and get(x.id) is not None]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise GpustationError(
                f"{waiting[0].owner} (pid {waiting[0].pid}) did not end within "
                f"{timeout_s:g} s; nothing was changed."
            )
        time.sleep(0.05)  # polling another process's exit
