"""A Rich console for the run commands' tables, tidy when piped."""

from __future__ import annotations

import sys
from typing import Any


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


def console(width: int = 200) -> Any:
    """A console on stdout; piped (no terminal), wide enough not to fold, no trailing blanks."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console(highlight=False)
    stream: Any = _RstripLines(sys.stdout)  # duck-typed: write, flush, isatty
    return Console(highlight=False, width=width, file=stream)
