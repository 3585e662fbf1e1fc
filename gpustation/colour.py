"""Whether gpustation colours what it writes: only on a terminal, never with
``NO_COLOR`` set (https://no-color.org), so files, pipes and cron get clean text."""

from __future__ import annotations

import os
from typing import TextIO


def wanted(stream: TextIO) -> bool:
    """Whether ``stream`` may get colour codes."""
    if os.environ.get("NO_COLOR"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or duck-typed stream
        return False
