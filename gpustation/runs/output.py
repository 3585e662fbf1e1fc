"""A Rich console for the run commands' tables, tidy when piped."""

from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


class _RstripLines:
    """A text stream that drops the padding Rich leaves at the end of lines."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self.stream.write(line.rstrip() + "\n")
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self.stream.write(self._pending.rstrip())
            self._pending = ""
        self.stream.flush()

    def isatty(self) -> bool:
        return False


def console(width: int = 200) -> Console:
    """A console on stdout; piped (no terminal), wide enough not to fold, no trailing blanks."""
    # start-up time: rich, for terminal output only
    from rich.console import Console

    if sys.stdout.isatty():
        return Console(highlight=False)
    stream: Any = _RstripLines(sys.stdout)  # duck-typed: write, flush, isatty
    return Console(highlight=False, width=width, file=stream)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def strict_json(data: Any, indent: int | None = 2) -> str:
    """JSON that any parser reads: NaN and Infinity (a row written by an older
    version may hold them) become null, never the bare ``NaN`` Python writes."""
    return json.dumps(_finite(data), indent=indent, allow_nan=False)
