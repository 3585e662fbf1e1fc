"""``[slowdown]`` of config.toml: when a run counts as slowed down.

::

    [slowdown]
    drop_pct = 20        # throughput more than this % below the run's steady level ...
    min_s = 5            # ... for at least this many seconds
    warmup_s = 30        # the run's first seconds and reports are its warm-up
    warmup_reports = 3
    window_s = 120       # the steady level: the median of this many seconds of reports
    enabled = true

A bad value is named (each one, once, where the run starts and in the
supervisor's log) and its default used: a typo never stops a run, nor
turns the watch off unasked.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from gpustation.config import section
from gpustation.errors import UsageError
from gpustation.runs.slowdown.detect import DetectSettings

#: key -> (lowest, highest, whole number): the range of each number
RANGES: dict[str, tuple[float, float, bool]] = {
    "drop_pct": (1.0, 95.0, False),
    "min_s": (0.5, 3600.0, False),
    "warmup_s": (0.0, 3600.0, False),
    "warmup_reports": (0.0, 10000.0, True),
    "window_s": (5.0, 86400.0, False),
}
KEYS = tuple(f.name for f in fields(DetectSettings))


def load_settings(path: Path | None = None) -> tuple[DetectSettings, list[str]]:
    """The settings, and a line for each problem (its key's default is used instead)."""
    try:
        table = section("slowdown", path)
    except UsageError as err:
        return DetectSettings(), [f"{err}; the slowdown defaults are used"]
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, (low, high, whole) in RANGES.items():
        if key not in table:
            continue
        value = table[key]
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if not number or (whole and not isinstance(value, int)) or not low <= value <= high:
            kind = "a whole number" if whole else "a number"
            default = getattr(DetectSettings(), key)
            problems.append(
                f"config.toml [slowdown] {key}: {kind} from {low:g} to {high:g}, "
                f"got {value!r}; using {default:g}"
            )
            continue
        values[key] = int(value) if whole else float(value)
    if "enabled" in table:
        if isinstance(table["enabled"], bool):
            values["enabled"] = table["enabled"]
        else:
            problems.append(
                f"config.toml [slowdown] enabled: true or false, got {table['enabled']!r}; "
                "using true"
            )
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        problems.append(
            f"config.toml [slowdown]: unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}"
        )
    settings = replace(DetectSettings(), **values)
    if settings.window_s < settings.min_s:
        problems.append(
            f"config.toml [slowdown] window_s ({settings.window_s:g}) is shorter than min_s "
            f"({settings.min_s:g}); using window_s {DetectSettings.window_s:g}"
        )
        settings = replace(settings, window_s=max(DetectSettings.window_s, settings.min_s))
    return settings, problems
