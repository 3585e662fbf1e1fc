"""Limits that drifted: a card whose power limit (or fans) is not what the
control journal says was applied to it last, with no entry that explains it.

A reboot or a driver reload puts every card back on its defaults, and a
change made with ``nvidia-smi`` is not journalled: either way the card no
longer has the limit a profile or ``power set`` gave it. Cards are matched by
UUID (an index changes when cards are added or moved), simulated cards only
with simulated entries. ``gpustation profile apply --again`` applies the
journalled values again, journalled like any change.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpustation.paths import state_dir
from gpustation.telemetry.model import GpuSample, Snapshot
from gpustation.telemetry.slotted import field, record

if TYPE_CHECKING:
    from gpustation.control.journal import JournalEntry

#: the command that applies the journalled values again
AGAIN = "gpustation profile apply --again"
#: power limits closer than this are the same limit (the driver rounds to mW)
SAME_W = 0.5
#: ``journal.JOURNAL_NAME``: named here so that a snapshot with no journal on
#: disk never imports the journal (and ``dataclasses`` with it)
JOURNAL_NAME = "control-journal.jsonl"


@record
class Applied:
    """What the journal says was applied last to one card."""

    power_w: float | None = None
    power_command: str = ""
    power_time: float = 0.0
    #: fan index -> "manual" (a fixed speed or a curve took it) or "auto"
    fans: dict[int, str] = field(default_factory=dict)
    fan_command: str = ""


@record(frozen=True)
class Drift:
    """One card whose settings differ from the journal's last."""

    gpu: int
    uuid: str
    #: the journalled limit to apply again (None: the power limit did not drift)
    power_w: float | None
    power_now_w: float | None
    power_command: str
    #: fans that should be manual (under a curve) but are automatic, and the
    #: command that took them; fans that should be automatic but are manual
    fans_left: tuple[int, ...] = ()
    fan_command: str = ""
    fans_taken: tuple[int, ...] = ()

    def text(self) -> str:
        """What drifted, in a line, with the command that puts it back."""
        parts: list[str] = []
        if self.power_w is not None:
            now = "n/a" if self.power_now_w is None else f"{self.power_now_w:g} W"
            parts.append(
                f"power limit {now}, not the {self.power_w:g} W `{self.power_command}` set"
            )
        if self.fans_left:
            parts.append(
                f"fans {_fans(self.fans_left)} on automatic, no longer under `{self.fan_command}`"
            )
        if self.fans_taken:
            parts.append(f"fans {_fans(self.fans_taken)} on manual control nothing journalled")
        return "; ".join(parts) + f" (a reboot or driver reload?): {AGAIN}"


def _fans(fans: Sequence[int]) -> str:
    return ",".join(str(f) for f in fans)


def last_applied(entries: Sequence[JournalEntry], simulated: bool) -> dict[str, Applied]:
    """UUID -> what was applied to that card last, from the journal's entries."""
    # start-up time: the journal (and dataclasses) only once a journal is read
    from gpustation.control import journal

    out: dict[str, Applied] = {}
    for e in entries:
        if not e.uuid or e.simulated != simulated or e.outcome == journal.REFUSED:
            continue
        applied = out.setdefault(e.uuid, Applied())
        if e.what == journal.POWER_LIMIT and e.outcome == journal.MADE:
            value = e.read_back if isinstance(e.read_back, (int, float)) else e.new
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                applied.power_w = float(value)
                applied.power_command = e.command
                applied.power_time = e.time
        elif e.what == journal.FAN_SPEED and e.fan is not None:
            # A curve journals its take-over only (it keeps setting speeds after).
            applied.fans[e.fan] = "manual"
            applied.fan_command = e.command
        elif e.what == journal.FAN_AUTO and e.fan is not None:
            applied.fans[e.fan] = "auto"
    return out


def find_drift(gpus: Sequence[GpuSample], applied: dict[str, Applied]) -> dict[int, Drift]:
    """GPU index -> what drifted, for each card that differs from the journal."""
    out: dict[int, Drift] = {}
    for gpu in gpus:
        last = applied.get(gpu.uuid or "")
        if gpu.lost or last is None:
            continue
        power: float | None = None
        now = gpu.power_limit_w
        if last.power_w is not None and now is not None and abs(now - last.power_w) >= SAME_W:
            power = last.power_w
        left = tuple(
            f
            for f, mode in sorted(last.fans.items())
            if mode == "manual" and _mode(gpu, f) == "auto"
        )
        taken = tuple(
            f
            for f, mode in sorted(last.fans.items())
            if mode == "auto" and _mode(gpu, f) == "manual"
        )
        if power is None and not left and not taken:
            continue
        out[gpu.index] = Drift(
            gpu=gpu.index,
            uuid=gpu.uuid or "",
            power_w=power,
            power_now_w=now,
            power_command=last.power_command,
            fans_left=left,
            fan_command=last.fan_command,
            fans_taken=taken,
        )
    return out


def _mode(gpu: GpuSample, fan: int) -> str | None:
    return gpu.fan_control[fan] if fan < len(gpu.fan_control) else None


# ---- the journal, read again only when it changed ---------------------------------

_cache_lock = threading.Lock()
_cache: dict[tuple[str, bool], tuple[tuple[int, int, int], dict[str, Applied]]] = {}


def applied_now(simulated: bool, path: Path | None = None) -> dict[str, Applied]:
    """:func:`last_applied` of the journal on disk; read again only when the file
    changed (a dashboard asks every refresh, the journal grows rarely)."""
    path = path or state_dir() / JOURNAL_NAME
    try:
        st = os.stat(path)
    except OSError:
        return {}

    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    key = (str(path), simulated)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
    # start-up time: the journal (and dataclasses) only once there is one to read
    from gpustation.control import journal

    applied = last_applied(journal.read_journal(path).entries, simulated)
    with _cache_lock:
        _cache[key] = (stamp, applied)
    return applied


def mark_drift(snapshot: Snapshot, path: Path | None = None) -> dict[int, Drift]:
    """Find the drifted cards of ``snapshot`` and say so in each one's
    ``limit_drift``; never raises (a journal that cannot be read finds none)."""
    try:
        found = find_drift(snapshot.gpus, applied_now(snapshot.simulated, path))
    except Exception:
        return {}
    for gpu in snapshot.gpus:
        drift = found.get(gpu.index)
        gpu.limit_drift = None if drift is None else drift.text()
    return found
