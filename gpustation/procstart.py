"""Which process is which: a token for a process's start that a reused pid and a
change of the clock both leave alone.

A pid names a process only while it lives; after it ends the number comes back
for another. gpustation records the pid *and* this token of the process it
started (a run's supervisor and child, a sweep, a lease's owner) and takes the
process for the same one only when both match.

The token is the start time in clock ticks since boot (``/proc/PID/stat``,
field 22) and the boot's id: a number the clock does not move. The wall-clock
start time psutil gives is the boot time plus those ticks, and the boot time
moves with every step of the clock (an NTP correction, a virtual machine's
clock set after a pause): a step of one second made every running run read
``lost`` and a stop miss the processes it should end. Kept light (no psutil on
Linux): ``gpustation snapshot`` checks leases on every call.
"""

from __future__ import annotations

import sys
from functools import cache

BOOT_ID = "/proc/sys/kernel/random/boot_id"


@cache
def _boot() -> str:
    """This boot's id (a new one after each reboot), shortened; empty when unknown."""
    try:
        with open(BOOT_ID, encoding="ascii") as f:
            return f.read().strip()[:8]
    except OSError:
        return ""


def process_start(pid: int) -> str | None:
    """A token for the start of process ``pid`` (None when it is gone or a zombie).

    Two processes with the same pid have different tokens: a pid reused after
    the first ended, or after a reboot, is not mistaken for it.
    """
    if pid <= 0:
        return None
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            return None
        # the name is in parentheses and may itself hold spaces or parentheses
        fields = stat[stat.rindex(")") + 2 :].split()
        if len(fields) < 20 or fields[0] in ("Z", "X"):
            return None
        ticks = fields[19]  # start time, in clock ticks since boot
        boot = _boot()
        return f"{ticks}@{boot}" if boot else ticks
    # start-up time: psutil, only when processes are inspected
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return f"{proc.create_time():.2f}"
    except (psutil.Error, OSError):
        return None


def process_matches(pid: int | None, start: str | None) -> bool:
    """True while the process ``pid`` that started at ``start`` still runs (any
    ``pid`` alive when ``start`` is None)."""
    if not pid:
        return False
    now = process_start(pid)
    if now is None:
        return False
    if start is None or now == start:
        return True
    # A token written before the boot's id was part of it: the ticks alone.
    return "@" not in start and now.split("@", 1)[0] == start
