"""Following one run: its new log lines, metric events, slowdowns and state, poll by poll.

:class:`RunFollower` is what a log pane, a loss-curve pane or ``gpustation
run`` needs from a run directory. Creating one does no I/O; each
:meth:`RunFollower.poll` reads only what was appended since the last (at most
``max_bytes`` of log, so a flood is taken in bites) and returns a plain
:class:`FollowUpdate`; the metric events are folded as they come
(:attr:`RunFollower.fold`) and :meth:`RunFollower.summary` reads the run as a
:class:`~gpustation.runs.summary.RunSummary`. A UI calls both from a worker
thread and posts what they return. Following only reads: it never writes the
run directory or ``runs.db``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpustation.runs import rundir
from gpustation.runs.fold import MetricsFold
from gpustation.runs.rundir import RunState
from gpustation.runs.slowdown import records as slowdown_records
from gpustation.runs.store.reconcile import check_run
from gpustation.runs.summary import RunSummary
from gpustation.runs.tail import MetricsReader, Tailer
from gpustation.textsafe import safe


@dataclass
class FollowUpdate:
    """What happened in a run since the previous poll."""

    lines: list[bytes] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    #: the records of ``slowdowns.jsonl`` written since (a slowdown confirmed, or ended)
    slowdowns: list[dict[str, Any]] = field(default_factory=list)
    #: the run's state when it was last checked (None before the first check)
    state: RunState | None = None
    #: True once the run has ended and everything it wrote has been read
    ended: bool = False

    def text_lines(self) -> list[str]:
        """The log lines as text safe for any view (rule 8): a progress bar's ``\\r``
        redraws keep their last frame, tabs are expanded, escape sequences removed."""
        out = []
        for line in self.lines:
            text = line.decode("utf-8", errors="replace").rstrip("\r").rsplit("\r", 1)[-1]
            out.append(text if text.isprintable() else safe(text.expandtabs()))
        return out


class RunFollower:
    """Reads a run directory incrementally. Not thread-safe: one poller at a time."""

    def __init__(
        self, directory: Path, max_bytes: int = 1 << 20, state_every_s: float = 0.5
    ) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.state_every_s = state_every_s
        self.log = Tailer(self.directory / rundir.OUTPUT_LOG, keep_tail=True)
        self.metrics = MetricsReader(self.directory / rundir.METRICS_FILE)
        self.fold = MetricsFold()
        self._slowdowns = slowdown_records.SlowdownTail(self.directory)
        #: the run's slowdowns so far, folded by id
        self.slowdowns: dict[int, dict[str, Any]] = {}
        self._run: dict[str, Any] | None = None
        self.state: RunState | None = None
        self._next_check = 0.0
        self._ended = False

    @property
    def malformed_metrics(self) -> int:
        return self.metrics.malformed_count

    def poll(self) -> FollowUpdate:
        """New lines and events, and the state (checked every ``state_every_s``)."""
        if self._ended:
            return FollowUpdate(state=self.state, ended=True)

        # The state is read before the files: when it says "ended", everything
        # the run wrote is already on disk, and the reads below will see it.
        now = time.monotonic()
        final = False
        if now >= self._next_check:
            self._next_check = now + self.state_every_s
            self.state = check_run(self.directory)
            final = self.state is not None and not self.state.active
        update = FollowUpdate(state=self.state)
        update.lines = self.log.read_new(max_bytes=self.max_bytes)
        update.events = self.metrics.read_new()
        update.slowdowns = self._slowdowns.read_new()
        slowdown_records.fold(update.slowdowns, self.slowdowns)
        if final and self.log.at_end():
            # Ended and drained: take a last line written without a newline.
            rest = self.log.read_partial()
            if rest:
                update.lines.append(rest)
            update.events.extend(self.metrics.finish())
            update.ended = self._ended = True
        elif final:
            self._next_check = 0.0  # more to drain; stay on "final" next poll
        for event in update.events:
            self.fold.add(event)
        return update

    def summary(self) -> RunSummary:
        """The run as read so far: ``run.json``, the last state checked, the folded figures."""
        if not self._run:
            self._run = rundir.read_run(self.directory) or {}
        summary = RunSummary.from_run(self._run, self.directory)
        if self.state is not None:
            summary.apply_state(self.state)
        summary.malformed_metrics = self.metrics.malformed_count
        return self.fold.apply(summary)

    def close(self) -> None:
        self.log.close()
        self.metrics.close()
        self._slowdowns.close()

    def __enter__(self) -> RunFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
