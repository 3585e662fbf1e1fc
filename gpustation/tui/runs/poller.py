"""Reading run directories off the UI thread: one pass over every followed run.

:class:`RunsPass` is the ``work`` of the screen's
:class:`~gpustation.tui.poll.Poller`: on the poller's thread it reads every
followed run with a :class:`~gpustation.runs.follow.RunFollower`, turns what
it read into a :class:`~gpustation.tui.runs.model.RunDelta` per run, now and
then looks for runs started elsewhere and reads the history, and returns one
:class:`RunsPolled` message. The screen applies it and re-arms the poller, so
passes never overlap and a slow UI slows the passes down instead of queueing
batches (that is what coalesces a log flood: a pass takes whatever came since
the last one, at most a bite of it).

Everything here only reads: the run directories and ``runs.db`` are left as
they are (a run whose supervisor died is shown ``lost`` from its files).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from textual.message import Message

from gpustation.errors import UsageError
from gpustation.runs import rundir
from gpustation.runs.cost import load_price
from gpustation.runs.follow import FollowUpdate, RunFollower
from gpustation.runs.gputrace import TelemetrySummary, summarize_telemetry
from gpustation.runs.kernel_profile import read_top_ops
from gpustation.runs.rundir import RunState
from gpustation.runs.store.index import RunStore, apply_telemetry
from gpustation.runs.store.reconcile import check_run, list_active_runs
from gpustation.runs.summary import RunSummary
from gpustation.runs.timeline import TimelineReader
from gpustation.tui.runs.model import (
    ACTIVE_BITE,
    DISCOVER_EVERY_S,
    FINISHED_BITE,
    HISTORY_LIMIT,
    MAX_LOG_LINES,
    PassResult,
    RunDelta,
)

#: seconds between two looks for a running run's ``profile/top_ops.json``
PROFILE_EVERY_S = 2.0


class RunsPolled(Message):
    """One pass's result, for the screen to apply (then it re-arms the poller)."""

    def __init__(self, result: PassResult) -> None:
        super().__init__()
        self.result = result


class RunTrack:
    """The poller-side state of one followed run."""

    def __init__(self, run_id: str, directory: Path, active: bool) -> None:
        self.id = run_id
        self.directory = directory
        self.follower = RunFollower(directory, max_bytes=ACTIVE_BITE if active else FINISHED_BITE)
        self.timeline = TimelineReader(directory)
        self.fresh = True
        self._state: RunState | None = None
        self._losses = 0
        self._evals = 0
        self._profile: dict[str, Any] | None = None
        self._profile_at = 0.0
        #: what the GPUs did, summed up once the run has ended
        self._telemetry: TelemetrySummary | None = None

    def digest(self, update: FollowUpdate) -> RunDelta:
        state = update.state
        if state is not None:
            self.timeline.start_at(state.started_at)
        self.timeline.add_events(update.events)
        self.timeline.add_slowdowns(update.slowdowns)
        self.timeline.read_telemetry(max_bytes=self.follower.max_bytes)
        # Ended only once the telemetry has been read to its end too.
        delta = RunDelta(self.id, ended=update.ended and self.timeline.drained())
        if self.fresh:
            self.fresh = False
            delta.reset = True
        if self.timeline.changed or delta.reset:
            delta.timeline = self.timeline.data()
        self._read_profile(delta)
        if state is not None and not state.active:
            # Ended: take what is left in bigger bites.
            self.follower.max_bytes = FINISHED_BITE
        if update.lines:
            lines = update.lines
            if len(lines) > MAX_LOG_LINES:
                delta.dropped = len(lines) - MAX_LOG_LINES
                lines = lines[-MAX_LOG_LINES:]
            delta.lines = FollowUpdate(lines=lines).text_lines()
        fold = self.follower.fold
        if len(fold.losses) != self._losses or (delta.reset and self._losses):
            self._losses = len(fold.losses)
            delta.losses = fold.losses.points()
        if len(fold.evals) != self._evals:
            self._evals = len(fold.evals)
            delta.evals = fold.evals.points()
        if update.events or delta.reset or update.state is not self._state:
            self._state = update.state
            delta.summary = self._summary()
        return delta

    def _summary(self) -> RunSummary:
        """The follower's summary, with the GPUs' energy and peaks once the run has ended."""
        summary = self.follower.summary()
        if summary.active:
            return summary

        if self._telemetry is None:
            self._telemetry = summarize_telemetry(self.directory / rundir.TELEMETRY_FILE)
        return apply_telemetry(summary, self._telemetry, self.directory)

    def _read_profile(self, delta: RunDelta) -> None:
        """``profile/top_ops.json``: read at once, then now and then while the run goes."""
        now = time.monotonic()
        if not delta.reset and (now < self._profile_at or self._profile):
            return  # looked a moment ago, or found (a profile is written once)
        self._profile_at = now + PROFILE_EVERY_S

        found = read_top_ops(self.directory) or {}
        if delta.reset or found != self._profile:
            self._profile = found
            delta.profile = found

    def close(self) -> None:
        self.follower.close()
        self.timeline.close()


class RunsPass:
    """The poll pass of the runs screen; what to follow is set from the UI thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Shared with the UI thread, under the lock.
        self._wanted: dict[str, tuple[Path, bool]] = {}
        self._unwanted: set[str] = set()
        self._want_history = True
        self._closed = False
        self._busy = False
        # The poller's thread only.
        self._tracks: dict[str, RunTrack] = {}
        self._next_discover = 0.0
        self._price_problem = ""
        #: active runs whose run.json could not be read (said once)
        self._unreadable: set[str] = set()

    # -- asked from the UI thread --------------------------------------------------------
    def want(self, run_id: str, directory: Path, active: bool) -> None:
        """Follow ``run_id`` (its log from the start) until it ends."""
        with self._lock:
            self._unwanted.discard(run_id)
            self._wanted[run_id] = (directory, active)

    def drop(self, run_id: str) -> None:
        """Stop following ``run_id`` and close its files."""
        with self._lock:
            self._wanted.pop(run_id, None)
            self._unwanted.add(run_id)

    def want_history(self) -> None:
        with self._lock:
            self._want_history = True

    @property
    def following(self) -> bool:
        with self._lock:
            return bool(self._wanted)

    def close(self) -> None:
        """No more passes; the followers' files are closed now or when the pass in flight ends."""
        with self._lock:
            self._closed = True
            busy = self._busy
        if not busy:
            self._close_tracks()

    # -- on the poller's thread ------------------------------------------------------------
    def __call__(self) -> RunsPolled | None:
        with self._lock:
            if self._closed:
                return None
            self._busy = True
            wanted = dict(self._wanted)
            unwanted, self._unwanted = self._unwanted, set()
            want_history, self._want_history = self._want_history, False
        try:
            result = self._pass(wanted, unwanted, want_history)
        except Exception as err:
            # Said, and the screen re-arms the next pass: a pass that raised and
            # posted nothing would leave every run on screen as it was, for good.
            result = PassResult(errors=[f"reading the runs: {type(err).__name__}: {err}"])
            with self._lock:
                self._want_history = self._want_history or want_history
        finally:
            with self._lock:
                self._busy = False
                closed = self._closed
        if closed:
            self._close_tracks()
            return None
        return RunsPolled(result)

    def _pass(
        self, wanted: dict[str, tuple[Path, bool]], unwanted: set[str], want_history: bool
    ) -> PassResult:
        result = PassResult()
        for run_id in unwanted:
            track = self._tracks.pop(run_id, None)
            if track is not None:
                track.close()
        now = time.monotonic()
        if now >= self._next_discover:
            self._next_discover = now + DISCOVER_EVERY_S
            try:
                found = list_active_runs()
            except Exception as err:  # a damaged run directory must not stop the others
                found = []
                result.errors.append(f"looking for active runs: {err}")
            result.discovered = []
            for active in list(found):
                try:
                    summary = RunSummary.from_run(active.run, active.run_dir)
                except (AttributeError, TypeError, ValueError) as err:
                    # run.json of another shape: said once, the run left out
                    found.remove(active)
                    if active.id not in self._unreadable:
                        self._unreadable.add(active.id)
                        result.errors.append(f"run {active.id}: {rundir.RUN_JSON}: {err}")
                    continue
                result.discovered.append(summary.apply_state(active.state))
            for active in found:
                wanted.setdefault(active.id, (active.run_dir, True))
                with self._lock:
                    self._wanted.setdefault(active.id, (active.run_dir, True))
        for run_id, (directory, is_active) in wanted.items():
            if run_id not in self._tracks:
                self._tracks[run_id] = RunTrack(run_id, directory, is_active)
        ended: list[str] = []
        for run_id, track in list(self._tracks.items()):
            try:
                delta = track.digest(track.follower.poll())
            except Exception as err:
                result.errors.append(f"run {run_id}: {type(err).__name__}: {err}")
                ended.append(run_id)
                continue
            if (
                delta.reset
                or delta.lines
                or delta.summary
                or delta.ended
                or delta.timeline is not None
                or delta.profile is not None
            ):
                result.deltas.append(delta)
            if delta.ended:
                ended.append(run_id)
        for run_id in ended:
            self._tracks.pop(run_id).close()
            with self._lock:
                self._wanted.pop(run_id, None)
        if want_history or any(d.ended for d in result.deltas):
            try:
                history = RunStore().list_runs(limit=HISTORY_LIMIT)
                for record in history:
                    if record.active and record.run_dir:
                        # The row says running; the files say whether it still is.
                        state = check_run(Path(record.run_dir))
                        if state is not None:
                            record.apply_state(state)
                result.history = history
            except Exception as err:
                result.errors.append(f"reading the run history: {err}")
            self._read_price(result)
        return result

    def _read_price(self, result: PassResult) -> None:
        """``[energy]`` from config.toml, for the cost of each run (read with the history)."""

        try:
            result.price = load_price()
        except UsageError as err:
            if str(err) != self._price_problem:
                result.errors.append(f"{err}; no cost is shown")
            self._price_problem = str(err)
        else:
            self._price_problem = ""
        result.price_read = True

    def _close_tracks(self) -> None:
        for track in self._tracks.values():
            track.close()
        self._tracks.clear()
