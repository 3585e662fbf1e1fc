"""Following a run's growing files by byte offset.

:class:`Tailer` remembers how far it has read and returns only complete new
lines; a line still being written waits until its newline arrives. Nothing is
read twice, so following a long log costs what the new bytes cost.
:class:`MetricsReader` parses ``metrics.jsonl`` on top of it: a malformed line
is counted and skipped, never fatal. Folding the events into figures is
:mod:`gpustation.runs.fold`'s job.

These classes never block on anything but a read of the file, so a UI calls
them from a worker thread and posts what they return.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any


class Tailer:
    """Reads the complete lines appended to ``path`` since the last call."""

    def __init__(self, path: str | os.PathLike[str], chunk_bytes: int = 1 << 20) -> None:
        self.path = Path(path)
        self.offset = 0  # bytes consumed, up to the end of the last whole line
        self.chunk_bytes = chunk_bytes
        self._fh: IO[bytes] | None = None
        self._partial = b""

    def _open(self) -> IO[bytes] | None:
        if self._fh is None:
            try:
                # Kept open between reads; closed by close().
                self._fh = open(self.path, "rb")  # noqa: SIM115
            except FileNotFoundError:
                return None
        return self._fh

    def read_new(self, max_bytes: int | None = None) -> list[bytes]:
        """Complete lines (without their newline) added since the last call.

        ``max_bytes`` bounds one call's reading so a flood is taken in bites;
        the rest comes on the next call.
        """
        fh = self._open()
        if fh is None:
            return []
        size = os.fstat(fh.fileno()).st_size
        read_to = self.offset + len(self._partial)
        if size < read_to:
            # Truncated or replaced: start again from the top.
            self.offset = 0
            self._partial = b""
            read_to = 0
        budget = max_bytes if max_bytes is not None else size - read_to
        if budget <= 0:
            return []
        fh.seek(read_to)
        data = fh.read(min(budget, max(size - read_to, 0)))
        if not data:
            return []
        data = self._partial + data
        end = data.rfind(b"\n")
        if end < 0:
            self._partial = data
            return []
        self._partial = data[end + 1 :]
        self.offset += end + 1
        return data[:end].split(b"\n")

    def read_partial(self) -> bytes:
        """The unfinished last line seen so far (for a run that has ended)."""
        return self._partial

    def at_end(self) -> bool:
        try:
            return self.path.stat().st_size <= self.offset + len(self._partial)
        except OSError:
            return True

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> Tailer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_metric_line(line: bytes | str) -> dict[str, Any] | None:
    """One metrics event, or None when the line is not a JSON object."""
    line = line.strip()
    if not line:
        return None
    try:
        event = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return event if isinstance(event, dict) else None


class MetricsReader:
    """Parses new events from ``metrics.jsonl``; malformed lines are counted."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.tailer = Tailer(path)
        self.malformed_count = 0
        self.event_count = 0

    def read_new(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for line in self.tailer.read_new():
            if not line.strip():
                continue
            event = parse_metric_line(line)
            if event is None:
                self.malformed_count += 1
                continue
            events.append(event)
        self.event_count += len(events)
        return events

    def finish(self) -> list[dict[str, Any]]:
        """After the run ended: also take a last line written without a newline."""
        events = self.read_new()
        tail = self.tailer.read_partial()
        if tail.strip():
            event = parse_metric_line(tail)
            if event is None:
                self.malformed_count += 1
            else:
                events.append(event)
                self.event_count += 1
            self.tailer._partial = b""
            self.tailer.offset += len(tail)
        return events

    def close(self) -> None:
        self.tailer.close()
