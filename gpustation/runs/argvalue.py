"""The values of a preset's ``[args]``: their type, and the words that mean yes and no.

Shared by the presets and by the reader of a runner's own parser, which types
a key the preset does not set (so neither imports the other).
"""

from __future__ import annotations

#: the package the shipped runners are modules of
RUNNER_PACKAGE = "gpustation.runners"

ArgValue = str | int | float | bool | list[str | int | float | bool]


def parse_bool(text: str) -> bool | None:
    """True or False for the usual words (``yes``, ``off``, ``1`` ...); None for others."""
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    return None
