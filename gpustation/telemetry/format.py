"""Text formatting shared by every renderer: a missing value reads "n/a"."""

from __future__ import annotations

from gpustation.telemetry.model import THROTTLE_WORDS as THROTTLE_WORDS

NA = "n/a"


def num(value: float | None, digits: int = 0, unit: str = "") -> str:
    if value is None:
        return NA
    return f"{value:.{digits}f}{unit}"


def pair(cur: float | None, top: float | None, unit: str = "", digits: int = 0) -> str:
    """``cur/top unit`` with n/a for a missing side; ``cur unit`` when top is missing."""
    if cur is None and top is None:
        return NA
    if top is None:
        return f"{num(cur, digits)}{unit}"
    return f"{num(cur, digits)}/{num(top, digits)}{unit}"


def mib(value: float | None) -> str:
    """MiB as a short human size (``812M``, ``23.1G``)."""
    if value is None:
        return NA
    if value >= 1024:
        return f"{value / 1024:.1f}G"
    return f"{value:.0f}M"


def mib_words(value: float | None) -> str:
    """MiB for a sentence (``812 MiB``, ``3.2 GiB``)."""
    if value is None:
        return NA
    if value >= 1024:
        return f"{value / 1024:.1f} GiB"
    return f"{value:.0f} MiB"


def rate(bytes_per_s: float | None) -> str:
    """Bytes/s as ``12.3 MB/s`` (decimal units, as disk and network tools show)."""
    if bytes_per_s is None:
        return NA
    value = float(bytes_per_s)
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if value < 1000 or unit == "GB/s":
            return f"{value:.0f} {unit}" if unit == "B/s" else f"{value:.1f} {unit}"
        value /= 1000
    return NA  # pragma: no cover


def kib_rate(kib_per_s: float | None) -> str:
    return rate(None if kib_per_s is None else kib_per_s * 1024)


def duration(seconds: float | None) -> str:
    """``1:02:03`` or ``2:03``; n/a when unknown."""
    if seconds is None or seconds < 0:
        return NA
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def duration_words(seconds: float | None) -> str:
    """A duration for a sentence: ``45 s``, ``12 min 30 s``, ``2 h 05 min``; n/a when unknown."""
    if seconds is None or seconds < 0:
        return NA
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def pstate(value: int | None) -> str:
    return NA if value is None else f"P{value}"


def pcie_link(gen: int | None, width: int | None) -> str:
    if gen is None and width is None:
        return NA
    return f"Gen{num(gen)} x{num(width)}"


def throttle(reasons: list[str] | None) -> str:
    """Active clocks-event reasons in words; ``none`` when the card reports none."""
    if reasons is None:
        return NA
    if not reasons:
        return "none"
    return ", ".join(THROTTLE_WORDS.get(r, r) for r in reasons)
