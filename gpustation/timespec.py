"""The one grammar for times and spans a user types: every ``--at``,
``--since``, ``--older-than``, the dashboard's span fields and the replay's
"go to" read it.

- a span: ``90s``, ``5m``, ``2h``, ``3d``, ``1w`` (decimals allowed: ``1.5h``);
- a clock time: ``20:02``, ``20:02:46`` (on the day of the reference time);
- a date: ``2026-12-01``, ``2026-12-01T20:02``, with an offset or ``Z`` if
  wanted (local time otherwise); Unix seconds also read;
- a relative time: ``-3s``, ``-5m``, ``+30s`` (from the reference time).
"""

from __future__ import annotations

import math
import re
import time
from datetime import datetime, timedelta

from gpustation.errors import UsageError

#: the accepted forms, for messages
SPAN_FORMS = "a span (90s, 5m, 2h, 3d, 1w)"
TIME_FORMS = (
    "a clock time (20:02, 20:02:46), a date (2026-12-01, 2026-12-01T20:02), "
    "a relative time (-3s, -5m) or Unix seconds"
)

_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_SPAN = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_RELATIVE = re.compile(r"([+-])\s*(\d+(?:\.\d+)?)\s*([smhdw]?)")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}(?:\.\d+)?))?")


def _span_s(text: str) -> float | None:
    m = _SPAN.fullmatch(text.strip())
    return None if m is None else float(m.group(1)) * _UNIT_S[m.group(2)]


def parse_span(text: str, what: str = "the span") -> float:
    """Seconds from ``90s``, ``5m``, ``2h``, ``3d``, ``1w``; a UsageError naming ``what``."""
    seconds = _span_s(text)
    if seconds is None:
        raise UsageError(f"{what}: {SPAN_FORMS}, got {text!r}")
    return seconds


def _clock(m: re.Match[str], reference: float, within: tuple[float, float] | None) -> float:
    hour, minute = int(m.group(1)), int(m.group(2))
    seconds = float(m.group(3) or 0)
    if hour > 23 or minute > 59 or seconds >= 60:
        raise ValueError("not a clock time")
    day = datetime.fromtimestamp(reference).replace(
        hour=hour, minute=minute, second=int(seconds), microsecond=0
    )
    candidates = [(day + timedelta(days=d)).timestamp() + seconds % 1 for d in (0, -1, 1)]
    if within is not None:
        for t in candidates:
            if within[0] <= t <= within[1]:
                return t
    return candidates[0]


def _absolute(text: str, reference: float, within: tuple[float, float] | None) -> float:
    span = _span_s(text)
    if span is not None and within is not None:
        return within[0] + span
    m = _RELATIVE.fullmatch(text)
    if m:
        sign = 1 if m.group(1) == "+" else -1
        return reference + sign * float(m.group(2)) * _UNIT_S[m.group(3) or "s"]
    m = _CLOCK.fullmatch(text)
    if m:
        return _clock(m, reference, within)
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise ValueError("not a time")
        return value
    iso = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    return datetime.fromisoformat(iso).timestamp()  # naive: local time


def parse_time(
    text: str,
    what: str = "the time",
    reference: float | None = None,
    within: tuple[float, float] | None = None,
) -> float:
    """Unix seconds for a clock time, a date, a relative time or Unix seconds.

    ``reference`` (default: now) is what a relative time counts from and whose
    day a clock time falls on. With ``within`` (a start and an end, such as a
    recording's) a span counts from the start (``90s``: 90 s in) and a clock
    time falls on the day before or after when only that lands inside it.
    """
    ref = time.time() if reference is None else reference
    try:
        return _absolute(text.strip(), ref, within)
    except ValueError:
        forms = f"{SPAN_FORMS} from the start, {TIME_FORMS}" if within else TIME_FORMS
        raise UsageError(f"{what}: {forms}; got {text!r}") from None


def parse_since(text: str, what: str = "--since", now: float | None = None) -> float:
    """A start time: a span back from now (``7d``) or any form of :func:`parse_time`."""
    ref = time.time() if now is None else now
    seconds = _span_s(text)
    if seconds is not None:
        return ref - seconds
    try:
        return _absolute(text.strip(), ref, None)
    except ValueError:
        raise UsageError(
            f"{what}: {SPAN_FORMS} back from now, {TIME_FORMS}; got {text!r}"
        ) from None
