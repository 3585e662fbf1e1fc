"""The replay's data source: the snapshots of a recording at a playback position.

A :class:`ReplaySource` stands in for the :class:`~gpustation.tui.source.DataSource`:
each pass of the sampling thread (:meth:`ReplaySource.advance`) carries out
the requests the keys left (seek, step, speed, pause), plays on by the wall
time passed, and returns a :class:`Step`: the snapshot at the playback
position as a :class:`~gpustation.tui.source.Frame`, with the snapshots
played over since the last pass (so the graphs miss none at 16x). Every
decompression happens on that thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpustation.telemetry.model import Snapshot
from gpustation.telemetry.recording.file import SPEEDS, Recording
from gpustation.telemetry.rings import DEFAULT_LENGTH
from gpustation.tui.app import GRAPH_WINDOW_S
from gpustation.tui.source import DataSource, Frame

#: a pause in the recording longer than this is played as one second
GAP_S = 30.0
#: the quickest a playing replay repaints (more snapshots go to the graphs)
MIN_PASS_S = 0.1
MAX_PASS_S = 1.0
#: played over in one pass beyond this, the graphs are rebuilt instead
MAX_PASSED = 2000


@dataclass(slots=True)
class Step:
    """What one pass of the replay produced."""

    frame: Frame
    #: snapshots played over since the last pass, oldest first (for the graphs)
    passed: list[Snapshot] = field(default_factory=list)
    #: the graphs start again from ``passed`` (a jump back, a seek, the first pass)
    reset: bool = False
    playing: bool = False
    at_end: bool = False
    delay_s: float = MAX_PASS_S
    #: the position changed (or was set): the shown snapshot is new to the graphs
    moved: bool = True


_Pos = tuple[int, int]


class ReplaySource(DataSource):
    """Snapshots of a :class:`Recording` at a playback position (used from the worker).

    The UI thread calls the request methods (cheap: a lock and a field);
    :meth:`advance` carries them out on the sampling thread.
    """

    def __init__(
        self,
        recording: Recording,
        start: float | None = None,
        speed: float = 1.0,
        playing: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(backend_factory=lambda: _no_backend())
        self.recording = recording
        self._wall_clock = clock
        self._lock = threading.Lock()
        self._seek_to: float | None = recording.start if start is None else start
        self._step = 0
        self._playing = playing
        self.speed = speed
        self._pos: _Pos = (0, 0)
        self._was_playing = False
        self._play_t = recording.start
        self._wall = clock()
        #: the recording time of the snapshot shown (read by the UI thread)
        self.position = recording.start

    # ---- requests (UI thread) -------------------------------------------------
    @property
    def playing(self) -> bool:
        return self._playing

    def set_playing(self, playing: bool) -> None:
        with self._lock:
            self._playing = playing

    def step(self, n: int) -> None:
        """Move ``n`` snapshots (back when negative) and pause."""
        with self._lock:
            self._playing = False
            self._step += n

    def seek(self, seconds: float) -> None:
        """Jump ``seconds`` from the position (back when negative)."""
        with self._lock:
            base = self._seek_to if self._seek_to is not None else self.position
            self._seek_to = base + seconds
            self._step = 0

    def seek_to(self, t: float) -> None:
        with self._lock:
            self._seek_to = t
            self._step = 0

    def set_speed(self, speed: float) -> None:
        self.speed = min(SPEEDS[-1], max(SPEEDS[0], speed))

    # ---- the worker's side ---------------------------------------------------------
    def sample(self) -> Frame:
        return self.advance().frame

    def _time(self, pos: _Pos) -> float:
        return float(self.recording.docs(pos[0])[pos[1]]["time"])

    def _next(self, pos: _Pos) -> _Pos | None:
        i, j = pos
        if j + 1 < len(self.recording.docs(i)):
            return i, j + 1
        for k in range(i + 1, len(self.recording.frames)):
            if self.recording.docs(k):
                return k, 0
        return None

    def _prev(self, pos: _Pos) -> _Pos | None:
        i, j = pos
        if j > 0:
            return i, j - 1
        for k in range(i - 1, -1, -1):
            docs = self.recording.docs(k)
            if docs:
                return k, len(docs) - 1
        return None

    def _window(self, pos: _Pos) -> list[Snapshot]:
        """The snapshots of the graph window before ``pos``, oldest first."""
        since = self._time(pos) - GRAPH_WINDOW_S
        out: list[dict[str, Any]] = []
        p = self._prev(pos)
        while p is not None and len(out) < DEFAULT_LENGTH:
            if self._time(p) < since:
                break
            out.append(self.recording.docs(p[0])[p[1]])
            p = self._prev(p)
        return [Snapshot.from_dict(d) for d in reversed(out)]

    def advance(self) -> Step:
        """Carry out the requests and the playing since the last pass; the frame to show."""
        with self._lock:
            seek_to, self._seek_to = self._seek_to, None
            step, self._step = self._step, 0
            playing = self._playing
        now = self._wall_clock()
        rec = self.recording
        pos = start_pos = self._pos
        passed: list[dict[str, Any]] = []
        reset = False
        at_end = False
        if seek_to is not None:
            pos = rec.locate(min(rec.end, max(rec.start, seek_to)))
            reset = True
            self._play_t = self._time(pos)
        elif step:
            for _ in range(abs(step)):
                nxt = self._next(pos) if step > 0 else self._prev(pos)
                if nxt is None:
                    break
                pos = nxt
                if step > 0:
                    passed.append(rec.docs(pos[0])[pos[1]])
            reset = step < 0
            self._play_t = self._time(pos)
        elif playing and self._was_playing:
            self._play_t += (now - self._wall) * self.speed
            while True:
                nxt = self._next(pos)
                if nxt is None:
                    at_end = True
                    break
                cur_t, next_t = self._time(pos), self._time(nxt)
                if next_t - cur_t > GAP_S and self._play_t >= cur_t + self.speed * MIN_PASS_S:
                    self._play_t = max(self._play_t, next_t)  # skip a pause in the recording
                if next_t > self._play_t:
                    break
                pos = nxt
                passed.append(rec.docs(pos[0])[pos[1]])
        elif playing:
            self._play_t = self._time(pos)
        if playing and self._next(pos) is None:
            at_end = True
        if at_end:
            playing = False
            with self._lock:
                self._playing = False
        self._was_playing = playing
        self._wall = now
        self._pos = pos
        snap = Snapshot.from_dict(rec.docs(pos[0])[pos[1]])
        self.position = snap.time
        passed = passed[:-1]  # the last is the one shown, which the app adds itself
        if len(passed) > MAX_PASSED:
            reset, passed = True, []
        history = self._window(pos) if reset else [Snapshot.from_dict(d) for d in passed]
        delay = MAX_PASS_S
        nxt = self._next(pos)
        if playing and nxt is not None:
            wait = (self._time(nxt) - self._play_t) / self.speed
            delay = max(MIN_PASS_S, min(MAX_PASS_S, wait))
        moved = reset or pos != start_pos
        return Step(Frame(snap), history, reset, playing, at_end, delay, moved)

    def close(self) -> None:
        pass


def _no_backend() -> Any:
    raise RuntimeError("a replay reads no GPU")
