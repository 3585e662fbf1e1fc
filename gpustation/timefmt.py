"""The time formats gpustation writes, one for each purpose.

Every time a person reads is local time; the stamp in ids and file names is
UTC, so names sort in the order things happened whatever the zone or a change
of clocks. Parsing what a user types is :mod:`gpustation.timespec`'s job.
"""

from __future__ import annotations

import time

#: a time of day: live views, alerts, log lines read the same day
CLOCK = "%H:%M:%S"
#: a stamp in a table of things that span days (runs list, sweeps list)
STAMP = "%Y-%m-%d %H:%M"
#: a full time, to the second: ``runs show``, the journal, a process's start
FULL = "%Y-%m-%d %H:%M:%S"
#: a dated stamp where a column is narrow (the dashboard's runs table, a timeline)
COMPACT = "%m-%d %H:%M"
#: a day: energy per day
DAY = "%Y-%m-%d"
#: ids and file names (UTC)
FILE = "%Y%m%d-%H%M%S"


def _local(fmt: str, t: float | None) -> str:
    return time.strftime(fmt, time.localtime(t))


def clock(t: float | None = None) -> str:
    """``20:02:46`` (now when ``t`` is None)."""
    return _local(CLOCK, t)


def stamp(t: float) -> str:
    """``2026-12-01 20:02``."""
    return _local(STAMP, t)


def full(t: float | None = None, zone: bool = False) -> str:
    """``2026-12-01 20:02:46`` (with ``zone``: `` +0100``); now when ``t`` is None."""
    return _local(FULL + (" %z" if zone else ""), t)


def compact(t: float, seconds: bool = False) -> str:
    """``12-01 20:02`` (with ``seconds``: ``12-01 20:02:46``)."""
    return _local(COMPACT + (":%S" if seconds else ""), t)


def day(t: float) -> str:
    """``2026-12-01``."""
    return _local(DAY, t)


def recent(t: float, now: float | None = None) -> str:
    """A clock time within a day of ``now``, a full time beyond."""
    return clock(t) if (time.time() if now is None else now) - t < 86400 else full(t)


def file_stamp(t: float | None = None) -> str:
    """``20261201-190246``, in UTC (now when ``t`` is None)."""
    return time.strftime(FILE, time.gmtime(t))
