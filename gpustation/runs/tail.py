"""Following a run's growing files by byte offset.

:class:`Tailer` remembers how far it has read and returns only complete new
lines; a line still being written waits until its newline arrives. Nothing is
read twice, so following a long log costs what the new bytes cost. Reading is
bounded: the file is read in chunks, and a line longer than
:data:`MAX_LINE_BYTES` is skipped (counted in :attr:`Tailer.skipped`), so a
writer that never ends its line costs a chunk of memory, not the line.
:class:`MetricsReader` parses ``metrics.jsonl`` on top of it: a malformed line
is counted and skipped, never fatal. Folding the events into figures is
:mod:`gpustation.runs.fold`'s job.

:func:`parse_metric_line` is strict about what an event may hold, so that
whatever a line says, nothing downstream can fail on it: no NaN or Infinity
(JSON has none; a number too large for a float is one), no integer beyond 64
bits (SQLite stores no more), no nesting deep enough to exhaust the parser's
stack, and the protocol's keys (``step``, ``loss`` ...) of their own type.

These classes never block on anything but a read of the file, so a UI calls
them from a worker thread and posts what they return. A run can put anything
in its directory: a file that is not a regular one (a FIFO, a link to
``/dev/zero``) is opened through :func:`gpustation.files.open_regular`,
refused, said once and read as empty.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from gpustation.files import NotRegularFile, open_regular, say_skipped
from gpustation.textsafe import plain_json, safe_doc

#: a line longer than this is skipped and counted malformed, whatever it holds
MAX_LINE_BYTES = 1 << 20
#: bytes read at a time
CHUNK_BYTES = 1 << 20
#: integers in an event must fit in 64 bits (the run store is SQLite)
INT_LIMIT = 1 << 63
#: keys of the metrics protocol that hold a number (or null)
NUMBER_KEYS = (
    "t",
    "loss",
    "eval_loss",
    "lr",
    "grad_norm",
    "throughput",
    "epoch",
    "mem_peak_mib",
    "mem_static_mib",
)
#: ... a whole number (or null)
INT_KEYS = ("step", "total_steps")


class Tailer:
    """Reads the complete lines appended to ``path`` since the last call."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        chunk_bytes: int = CHUNK_BYTES,
        max_line_bytes: int = MAX_LINE_BYTES,
        keep_tail: bool = False,
        what: str = "run file",
    ) -> None:
        self.path = Path(path)
        self.what = what
        #: a line too long is cut to its last max_line_bytes rather than skipped
        #: (a log: a progress bar redraws with \r and its last frame is what shows)
        self.keep_tail = keep_tail
        self.offset = 0  # bytes consumed, up to the end of the last whole (or skipped) line
        self.chunk_bytes = chunk_bytes
        self.max_line_bytes = max_line_bytes
        #: lines skipped for being longer than max_line_bytes
        self.skipped = 0
        self._fh: IO[bytes] | None = None
        self._partial = b""
        #: inside a line too long to keep: discard up to its newline
        self._skipping = False

    def _open(self) -> IO[bytes] | None:
        if self._fh is None:
            try:
                # Kept open between reads; closed by close().
                self._fh = open_regular(self.path, self.what, follow=False)
            except FileNotFoundError:
                return None
            except NotRegularFile as err:
                say_skipped(err)
                return None
        return self._fh

    def _keep(self, lines: list[bytes], line: bytes) -> None:
        if len(line) <= self.max_line_bytes:
            lines.append(line)
        elif self.keep_tail:
            lines.append(line[-self.max_line_bytes :])
        else:
            self.skipped += 1

    def read_new(self, max_bytes: int | None = None) -> list[bytes]:
        """Complete lines (without their newline) added since the last call.

        ``max_bytes`` bounds one call's reading so a flood is taken in bites;
        the rest comes on the next call. Memory stays within a chunk and a
        line's limit whatever the file holds.
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
            self._skipping = False
            read_to = 0
        budget = size - read_to if max_bytes is None else min(max_bytes, size - read_to)
        lines: list[bytes] = []
        if budget <= 0:
            return lines
        fh.seek(read_to)
        while budget > 0:
            data = fh.read(min(self.chunk_bytes, budget))
            if not data:
                break
            budget -= len(data)
            if self._skipping:
                newline = data.find(b"\n")
                if newline < 0:
                    self.offset += len(data)
                    continue
                self.offset += newline + 1
                self._skipping = False
                self.skipped += 1
                data = data[newline + 1 :]
            data = self._partial + data
            end = data.rfind(b"\n")
            if end >= 0:
                for line in data[:end].split(b"\n"):
                    self._keep(lines, line)
                self.offset += end + 1
                data = data[end + 1 :]
            if len(data) > self.max_line_bytes and self.keep_tail:
                # Too long: keep its end only (bounded), the rest counts as read.
                self._partial = data[-self.max_line_bytes :]
                self.offset += len(data) - len(self._partial)
            elif len(data) > self.max_line_bytes:
                # No newline in sight and already too long: skip to the next one.
                self.offset += len(data)
                self._partial = b""
                self._skipping = True
            else:
                self._partial = data
        return lines

    def read_partial(self) -> bytes:
        """The unfinished last line seen so far (for a run that has ended)."""
        return self._partial

    def take_partial(self) -> tuple[bytes, bool]:
        """Consume the unfinished last line: (its bytes, whether it was too long to keep)."""
        partial, skipping = self._partial, self._skipping
        self.offset += len(partial)
        self._partial = b""
        self._skipping = False
        if skipping:
            self.skipped += 1
        return partial, skipping

    def at_end(self) -> bool:
        """Whether everything the file held has been read: the file this tailer
        reads, not whatever its name points at now (a run may replace it)."""
        fh = self._open()
        if fh is None:
            return True
        try:
            return os.fstat(fh.fileno()).st_size <= self.offset + len(self._partial)
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


def bounded_lines(
    fh: IO[bytes],
    max_line_bytes: int = MAX_LINE_BYTES,
    chunk_bytes: int = CHUNK_BYTES,
    total_bytes: int | None = None,
) -> Iterator[bytes | None]:
    """The lines of a whole file, read in chunks; None for each line too long to keep.

    The last line counts even without its newline. Memory stays within a chunk
    and a line's limit, however long a line is; with ``total_bytes`` (the size
    when it was opened) a file that keeps growing is read to there, not forever.
    """
    partial = b""
    skipping = False
    left = total_bytes
    while left is None or left > 0:
        data = fh.read(chunk_bytes if left is None else min(chunk_bytes, left))
        if not data:
            break
        if left is not None:
            left -= len(data)
        if skipping:
            newline = data.find(b"\n")
            if newline < 0:
                continue
            skipping = False
            yield None
            data = data[newline + 1 :]
        data = partial + data
        end = data.rfind(b"\n")
        if end >= 0:
            for line in data[:end].split(b"\n"):
                yield None if len(line) > max_line_bytes else line
            data = data[end + 1 :]
        if len(data) > max_line_bytes:
            partial, skipping = b"", True
        else:
            partial = data
    if skipping:
        yield None
    elif partial:
        yield partial


def file_lines(path: str | os.PathLike[str], what: str = "run file") -> Iterator[bytes | None]:
    """The lines of a whole run file, as :func:`bounded_lines` gives them, up to its size
    when opened; none when it is missing, or not a regular file (said once).

    A read that fails midway raises OSError.
    """
    try:
        fh = open_regular(path, what, follow=False)
    except NotRegularFile as err:
        say_skipped(err)
        return
    except OSError:
        return
    with fh:
        yield from bounded_lines(fh, total_bytes=os.fstat(fh.fileno()).st_size)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} does not fit in a float")
    return value


def _bounded_int(text: str) -> int:
    value = int(text)
    if not -INT_LIMIT <= value < INT_LIMIT:
        raise ValueError("an integer beyond 64 bits")
    return value


def loads_strict(data: bytes | str) -> Any:
    """``json.loads`` that refuses NaN, Infinity, overflowing numbers and deep nesting.

    Raises ValueError for each (a RecursionError becomes one).
    """
    try:
        return json.loads(
            data,
            parse_constant=_no_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
        )
    except RecursionError as err:
        raise ValueError("nested too deep") from err


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def valid_event(event: Any) -> bool:
    """Whether a decoded line is a metrics event of the protocol's types."""
    if not isinstance(event, dict):
        return False
    for key in NUMBER_KEYS:
        if not _is_number(event.get(key)):
            return False
    for key in INT_KEYS:
        value = event.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            return False
    for key in ("unit", "phase"):
        text = event.get(key)
        if text is not None and not isinstance(text, str):
            return False
    summary = event.get("summary")
    return summary is None or isinstance(summary, dict)


def parse_metric_line(line: bytes | str, check: bool = True) -> dict[str, Any] | None:
    """One metrics event, or None when the line is not one (whatever it holds).

    ``check=False`` accepts any JSON object (for files other than metrics,
    still without NaN, overflow or deep nesting).
    """
    if len(line) > MAX_LINE_BYTES:
        return None
    line = line.strip()
    if not line:
        return None
    try:
        event = loads_strict(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(event, dict):
        return None
    if check and not valid_event(event):
        return None
    # A run's text (its unit, its summary) reaches every view: cleaned here (rule 8).
    return event if plain_json(line) else safe_doc(event)


class MetricsReader:
    """Parses new events from ``metrics.jsonl``; malformed lines are counted."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.tailer = Tailer(path, what="metrics file")
        self._malformed = 0
        self.event_count = 0

    @property
    def malformed_count(self) -> int:
        """Lines that were not events, lines too long to read among them."""
        return self._malformed + self.tailer.skipped

    def read_new(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for line in self.tailer.read_new():
            if not line.strip():
                continue
            event = parse_metric_line(line)
            if event is None:
                self._malformed += 1
                continue
            events.append(event)
        self.event_count += len(events)
        return events

    def finish(self) -> list[dict[str, Any]]:
        """After the run ended: also take a last line written without a newline."""
        events = self.read_new()
        tail, _too_long = self.tailer.take_partial()
        if tail.strip():
            event = parse_metric_line(tail)
            if event is None:
                self._malformed += 1
            else:
                events.append(event)
                self.event_count += 1
        return events

    def close(self) -> None:
        self.tailer.close()
