"""Following a run's growing files by byte offset.

:class:`Tailer` remembers how far it has read and returns only complete new
lines; a line still being written waits until its newline arrives. Nothing is
read twice, so following a long log costs what the new bytes cost.
:class:`MetricsReader` parses ``metrics.jsonl`` on top of it: a malformed line
is counted and skipped, never fatal. :class:`MetricsAccumulator` folds events
into the figures a progress bar or the run store needs.

These classes never block on anything but a read of the file, so a UI calls
them from a worker thread and posts what they return.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
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


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def work_unit(throughput_unit: str | None) -> str | None:
    """``img/s`` -> ``img``: what one unit of work is, when the unit says."""
    if not throughput_unit or not throughput_unit.endswith("/s"):
        return None
    unit = throughput_unit[:-2].strip()
    singular = {"tokens": "token", "samples": "sample", "images": "img", "imgs": "img"}
    return singular.get(unit, unit) or None


@dataclass
class MetricsAccumulator:
    """Running figures from metric events (feed it events in order)."""

    step: int | None = None
    total_steps: int | None = None
    epoch: float | None = None
    last_t: float | None = None
    final_loss: float | None = None
    best_loss: float | None = None
    last_eval_loss: float | None = None
    best_eval_loss: float | None = None
    throughput: float | None = None
    best_throughput: float | None = None
    unit: str | None = None
    mem_peak_mib: float | None = None
    work: float = 0.0  # throughput integrated over time (samples, tokens ...)
    lr: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    events: int = 0
    #: (step or event number, loss) pairs, for curves
    losses: list[tuple[float, float]] = field(default_factory=list)

    def add(self, event: dict[str, Any]) -> None:
        self.events += 1
        t = _num(event.get("t"))
        step = event.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            self.step = step
        total = event.get("total_steps")
        if isinstance(total, int) and not isinstance(total, bool) and total > 0:
            self.total_steps = total
        epoch = _num(event.get("epoch"))
        if epoch is not None:
            self.epoch = epoch
        loss = _num(event.get("loss"))
        if loss is not None:
            self.final_loss = loss
            self.best_loss = loss if self.best_loss is None else min(self.best_loss, loss)
            x = float(self.step) if self.step is not None else float(self.events)
            self.losses.append((x, loss))
        eval_loss = _num(event.get("eval_loss"))
        if eval_loss is not None:
            self.last_eval_loss = eval_loss
            self.best_eval_loss = (
                eval_loss if self.best_eval_loss is None else min(self.best_eval_loss, eval_loss)
            )
        lr = _num(event.get("lr"))
        if lr is not None:
            self.lr = lr
        if isinstance(event.get("unit"), str):
            self.unit = event["unit"]
        rate = _num(event.get("throughput"))
        if rate is not None:
            self.throughput = rate
            self.best_throughput = (
                rate if self.best_throughput is None else max(self.best_throughput, rate)
            )
            # The rate reported at t is the rate since the previous report.
            if t is not None:
                since = self.last_t if self.last_t is not None else 0.0
                if t > since:
                    self.work += rate * (t - since)
        mem = _num(event.get("mem_peak_mib"))
        if mem is not None:
            self.mem_peak_mib = mem if self.mem_peak_mib is None else max(self.mem_peak_mib, mem)
        if isinstance(event.get("summary"), dict):
            self.summary.update(event["summary"])
        if t is not None:
            self.last_t = t

    @property
    def fraction_done(self) -> float | None:
        if self.step is None or not self.total_steps:
            return None
        return min(1.0, max(0.0, self.step / self.total_steps))

    def work_done(self) -> tuple[float | None, str | None]:
        """Units of work done (e.g. images), preferring what the summary says."""
        for key in ("samples", "tokens", "images", "work"):
            value = _num(self.summary.get(key))
            if value is not None:
                unit = {"samples": "sample", "tokens": "token", "images": "img"}.get(key)
                return value, unit or work_unit(self.unit)
        unit = work_unit(self.unit)
        if unit is None or self.work <= 0:
            return None, unit
        return self.work, unit
