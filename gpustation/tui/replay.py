"""``gpustation replay FILE``: the dashboard on a recording.

The recorded snapshots reach the dashboard's own screens (cards, graphs,
topology, alert log) through the same path as live ones: a
:class:`ReplaySource` stands in for the :class:`~gpustation.tui.source.DataSource`
and each pass of the sampling thread returns the snapshot at the playback
position as a :class:`~gpustation.tui.source.Frame`, with the snapshots played
over since the last pass (so the graphs miss none at 16x). Every
decompression happens on that thread; the keys only leave requests (seek,
step, speed) that the next pass carries out.

The banner says REPLAY and the recording's time, and draws a timeline of the
recording with marks: runs starting ``[`` and ending ``]`` (from the run store),
alerts ``!`` (:class:`~gpustation.telemetry.alerts.AlertLog` over the recorded
snapshots) and control changes ``◆`` (the control journal), from the same
period. ``n``/``N`` jump to the next or previous mark.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from gpustation.control.journal import describe_value, read_journal
from gpustation.runs.store import RunStore
from gpustation.telemetry.alerts import AlertLog
from gpustation.telemetry.history import DEFAULT_LENGTH
from gpustation.telemetry.model import Snapshot
from gpustation.telemetry.recording import SPEEDS, Recording, parse_time
from gpustation.tui.app import (
    GRAPH_WINDOW_S,
    SCREENS_BY_MODE,
    DashboardApp,
    FrameReady,
)
from gpustation.tui.poll import Poller
from gpustation.tui.screens import LiveScreen
from gpustation.tui.source import DataSource, Frame
from gpustation.tui.widgets import ProcRow

#: a pause in the recording longer than this is played as one second
GAP_S = 30.0
#: the quickest a playing replay repaints (more snapshots go to the graphs)
MIN_PASS_S = 0.1
MAX_PASS_S = 1.0
#: played over in one pass beyond this, the graphs are rebuilt instead
MAX_PASSED = 2000

# ---- marks -------------------------------------------------------------------

RUN_START, RUN_END, ALERT, CONTROL = "run_start", "run_end", "alert", "control"
SYMBOLS = {RUN_START: "[", RUN_END: "]", ALERT: "!", CONTROL: "◆"}
STYLES = {RUN_START: "bold green", RUN_END: "bold green", ALERT: "bold red", CONTROL: "bold cyan"}
# Where marks share a cell, the higher one shows.
PRIORITY = {RUN_START: 0, RUN_END: 0, CONTROL: 1, ALERT: 2}


@dataclass(frozen=True, slots=True)
class Mark:
    time: float
    kind: str  # run_start | run_end | alert | control
    text: str


def alert_marks(recording: Recording) -> list[Mark]:
    """The alerts the dashboard would have raised over the recorded snapshots."""
    log = AlertLog()
    out = []
    for doc in recording.iter_docs():
        for alert in log.update(Snapshot.from_dict(doc)):
            out.append(Mark(alert.time, ALERT, alert.message))
    return out


def run_marks(start: float, end: float, store: RunStore | None = None) -> list[Mark]:
    out = []
    for run in (store or RunStore()).list_runs():
        name = run.title or run.preset or run.id
        if run.started_at is not None and start <= run.started_at <= end:
            out.append(Mark(run.started_at, RUN_START, f"run {name} started ({run.id})"))
        if run.ended_at is not None and start <= run.ended_at <= end:
            out.append(Mark(run.ended_at, RUN_END, f"run {name} ended: {run.status}"))
    return out


def control_marks(start: float, end: float, host: str, journal: Path | None = None) -> list[Mark]:
    out = []
    for e in read_journal(journal).entries:
        if not start <= e.time <= end or (e.host and e.host != host):
            continue
        what = e.what.replace("_", " ") + (f" (fan {e.fan})" if e.fan is not None else "")
        out.append(
            Mark(
                e.time,
                CONTROL,
                f"GPU {e.gpu} {what} {describe_value(e.what, e.previous)} → "
                f"{describe_value(e.what, e.new)}: {e.outcome}, by {e.command}",
            )
        )
    return out


def collect_marks(
    recording: Recording,
    store: RunStore | None = None,
    journal: Path | None = None,
    local_host: str | None = None,
) -> list[Mark]:
    """Every mark of the recording's period, oldest first.

    Runs and control changes are this machine's: they are marked only on a
    recording made here (the journal's entries name their host).
    """
    first = recording.snapshot_at(recording.start)
    here = local_host if local_host is not None else os.uname().nodename
    marks = alert_marks(recording)
    marks += control_marks(recording.start, recording.end, first.hostname, journal)
    if first.hostname == here:
        marks += run_marks(recording.start, recording.end, store)
    return sorted(marks, key=lambda m: m.time)


def _clock_text(t: float, with_date: bool) -> str:
    return time.strftime("%m-%d %H:%M:%S" if with_date else "%H:%M:%S", time.localtime(t))


def timeline_cells(start: float, end: float, t: float, width: int) -> int:
    """The cell of time ``t`` on a timeline ``width`` cells wide."""
    if end <= start or width <= 1:
        return 0
    return max(0, min(width - 1, round((t - start) / (end - start) * (width - 1))))


def timeline_text(start: float, end: float, pos: float, marks: list[Mark], width: int) -> Text:
    """``09:12:03 ──[───!──◆──┃───]── 09:40:00``: the recording, its marks, the position."""
    with_date = time.localtime(start)[:3] != time.localtime(end)[:3]
    left, right = _clock_text(start, with_date) + " ", " " + _clock_text(end, with_date)
    n = max(10, width - len(left) - len(right))
    chars = ["─"] * n
    styles = ["dim"] * n
    rank = [-1] * n
    for mark in marks:
        c = timeline_cells(start, end, mark.time, n)
        if PRIORITY[mark.kind] >= rank[c]:
            chars[c], styles[c], rank[c] = (
                SYMBOLS[mark.kind],
                STYLES[mark.kind],
                PRIORITY[mark.kind],
            )
    c = timeline_cells(start, end, pos, n)
    chars[c], styles[c] = "┃", "bold reverse"
    out = Text(left, style="dim")
    for ch, st in zip(chars, styles, strict=True):
        out.append(ch, style=st)
    out.append(right, style="dim")
    return out


# ---- the source ------------------------------------------------------------------


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


# ---- going to a time -------------------------------------------------------------

_RELATIVE = re.compile(r"([+-])\s*(\d+(?:\.\d*)?)\s*([smh]?)")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}(?:\.\d*)?))?")


def parse_goto(text: str, position: float, start: float, end: float) -> float:
    """A time from what the user typed: ``+30s``, ``-10m``, ``09:20``, ``start``, ISO, Unix."""
    text = text.strip()
    if text in ("start", "end"):
        return start if text == "start" else end
    m = _RELATIVE.fullmatch(text)
    if m:
        sign = 1 if m.group(1) == "+" else -1
        unit = {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(3)]
        return position + sign * float(m.group(2)) * unit
    m = _CLOCK.fullmatch(text)
    if m:
        day = datetime.fromtimestamp(position)
        seconds = float(m.group(3) or 0)
        at = day.replace(
            hour=int(m.group(1)), minute=int(m.group(2)), second=int(seconds), microsecond=0
        )
        return at.timestamp() + seconds % 1
    return parse_time(text)


class GotoDialog(ModalScreen[str | None]):
    """Asks for a time to go to."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="replay.goto.cancel")
    ]
    DEFAULT_CSS = """
    GotoDialog { align: center middle; }
    GotoDialog > Vertical { width: 64; height: auto; border: round $accent;
                            background: $panel; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Go to: +30s, -10m, 09:20, 09:20:05, start, end, ISO 8601 or Unix time")
            yield Input(id="goto")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


# ---- the app -------------------------------------------------------------------


class ReplayFrameReady(FrameReady):
    """A replay pass ended (posted from the sampling thread)."""

    def __init__(self, step: Step) -> None:
        super().__init__(step.frame)
        self.step = step


class MarksReady(Message):
    """The timeline's marks have been read (posted from their own thread)."""

    def __init__(self, marks: list[Mark], error: str | None = None) -> None:
        super().__init__()
        self.marks = marks
        self.error = error


#: the screens a replay shows: those that only read snapshots (no control, no runs)
REPLAY_SCREENS = [
    e for e in SCREENS_BY_MODE if e.mode in ("dashboard", "topology", "alerts", "help")
]


class ReplayApp(DashboardApp):
    """The dashboard fed by a :class:`ReplaySource`, with playback keys."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("space", "toggle_pause", "Play/Pause", id="replay.play"),
        Binding("full_stop", "step(1)", "Step", key_display=".", id="replay.step"),
        Binding("comma", "step(-1)", "Back", key_display=",", id="replay.back"),
        Binding("right", "seek(10)", "+10s", priority=True, id="replay.forward"),
        Binding("left", "seek(-10)", "-10s", priority=True, id="replay.rewind"),
        Binding("shift+right", "seek(60)", "+60s", show=False, id="replay.forward_more"),
        Binding("shift+left", "seek(-60)", "-60s", show=False, id="replay.rewind_more"),
        Binding("right_square_bracket", "speed(1)", "Faster", key_display="]", id="replay.faster"),
        Binding("left_square_bracket", "speed(-1)", "Slower", key_display="[", id="replay.slower"),
        Binding("g", "goto", "Go to", id="replay.goto"),
        Binding("n", "mark(1)", "Next mark", id="replay.next_mark"),
        Binding("N", "mark(-1)", "Prev mark", key_display="N", id="replay.prev_mark"),
    ]

    source: ReplaySource

    def __init__(
        self,
        source: ReplaySource,
        marks: Callable[[], list[Mark]] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("screens", REPLAY_SCREENS)
        kwargs.setdefault("notify_alerts", False)  # the timeline marks them
        super().__init__(source, **kwargs)
        self.paused = not source.playing
        self.marks: list[Mark] | None = None
        self._marks_work = marks or (lambda: collect_marks(source.recording))
        self._marks_poller = Poller(self._marks_pass, target=self, name="gpustation-marks")

    def on_mount(self) -> None:
        super().on_mount()
        self._marks_poller.run_now()

    def _marks_pass(self) -> MarksReady:
        try:
            return MarksReady(self._marks_work())
        except Exception as err:  # marks are a help, never a reason to fail
            return MarksReady([], f"{type(err).__name__}: {err}")

    def on_marks_ready(self, event: MarksReady) -> None:
        self.marks = event.marks
        if event.error:
            self.notify(event.error, title="Timeline marks", severity="warning")
        self.update_chrome(self.screen)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The arrows seek, except in a text field (the go-to dialog, the filter).
        if action == "seek" and isinstance(self.focused, Input):
            return False
        return super().check_action(action, parameters)

    def _sample_pass(self) -> FrameReady:
        return ReplayFrameReady(self.source.advance())

    def on_replay_frame_ready(self, event: ReplayFrameReady) -> None:
        # The live handler's path, but the graphs and alerts take what was
        # played over, and a pass that did not move adds nothing.
        step = event.step
        if step.reset:
            self.history.clear()
            self.alerts = AlertLog()
        shown = [event.frame.snapshot] if step.moved else []
        for snap in [*step.passed, *shown]:
            self.history.add(snap)
            self.alerts.update(snap)
        self.passes += 1
        self._last_frame_at = time.monotonic()
        self.error = None
        self.frame = event.frame
        self.paused = not step.playing
        try:
            screen = self.screen
            if isinstance(screen, LiveScreen):
                screen.show_frame(event.frame)
            self.update_chrome(screen)
        except Exception as err:  # a drawing bug must not stop the replay
            self.notify(f"{type(err).__name__}: {err}", title="Display error", severity="error")
        finally:
            self._rearm(step.delay_s)

    @property
    def position(self) -> float:
        """The recording time of the snapshot shown."""
        return self.latest.time if self.latest is not None else self.source.recording.start

    # ---- actions -------------------------------------------------------------
    def _pass_now(self) -> None:
        self._poller.run_now()

    def action_toggle_pause(self) -> None:
        src = self.source
        playing = not src.playing
        if playing and self.position >= src.recording.end:
            src.seek_to(src.recording.start)  # play again from the start
        src.set_playing(playing)
        self.paused = not playing
        self._pass_now()
        self.update_chrome(self.screen)

    def action_step(self, n: int) -> None:
        self.source.step(n)
        self.paused = True
        self._pass_now()

    def action_seek(self, seconds: float) -> None:
        self.source.seek(seconds)
        self._pass_now()

    def action_speed(self, direction: int) -> None:
        speeds = SPEEDS
        cur = self.source.speed
        if direction > 0:
            bigger = [s for s in speeds if s > cur]
            self.source.set_speed(bigger[0] if bigger else speeds[-1])
        else:
            smaller = [s for s in speeds if s < cur]
            self.source.set_speed(smaller[-1] if smaller else speeds[0])
        self.update_chrome(self.screen)

    def action_goto(self) -> None:
        rec = self.source.recording

        def done(text: str | None) -> None:
            if not text:
                return
            try:
                t = parse_goto(text, self.position, rec.start, rec.end)
            except ValueError as err:
                self.notify(str(err), title="Go to", severity="error")
                return
            if not rec.start <= t <= rec.end:
                self.notify(
                    f"outside the recording, which spans {rec.span()}",
                    title="Go to",
                    severity="warning",
                )
                return
            self.source.seek_to(t)
            self._pass_now()

        self.push_screen(GotoDialog(), done)

    def action_mark(self, direction: int) -> None:
        marks = self.marks or []
        pos = self.position
        if direction > 0:
            later = [m for m in marks if m.time > pos + 1e-6]
            target = later[0] if later else None
        else:
            earlier = [m for m in marks if m.time < pos - 1e-6]
            target = earlier[-1] if earlier else None
        if target is None:
            self.notify("no mark that way", severity="information", timeout=2)
            return
        self.source.seek_to(target.time)
        self._pass_now()

    def confirm_kill(self, row: ProcRow) -> None:
        self.notify(
            f"PID {row.pid} is a recorded process, not a live one: a replay sends no signal.",
            severity="warning",
        )

    def all_bindings(self) -> list[Binding]:
        base = [
            b
            for b in DashboardApp.BINDINGS
            if isinstance(b, Binding) and not b.action.startswith("switch_to")
        ]
        return [self.remapped(b) for b in [*base, *self.BINDINGS] if isinstance(b, Binding)]

    # ---- banner and status line --------------------------------------------------
    def banner_text(self, width: int = 200) -> Text:
        rec = self.source.recording
        t = Text()
        t.append(" REPLAY ", style="bold white on blue")
        shown = self.latest
        when = shown.time if shown is not None else rec.start
        t.append(" " + datetime.fromtimestamp(when).astimezone().strftime("%Y-%m-%d %H:%M:%S %z"))
        state = f"▶ {self.source.speed:g}x" if self.source.playing else "⏸ paused"
        if shown is not None and when >= rec.end and not self.source.playing:
            state = "⏹ end"
        t.append(f"  {state}  ", style="bold")
        t.append_text(super().banner_text(max(20, width - t.cell_len)))
        t.append("\n")
        t.append_text(timeline_text(rec.start, rec.end, when, self.marks or [], width - 1))
        t.append("\n")
        t.append_text(self.marks_line(when))
        return t

    def marks_line(self, when: float) -> Text:
        t = Text()
        if self.marks is None:
            t.append("marks: reading alerts, runs and control changes…", style="dim")
            return t
        if not self.marks:
            t.append("no runs, alerts or control changes in this recording", style="dim")
            return t
        before = [m for m in self.marks if m.time <= when]
        after = [m for m in self.marks if m.time > when]
        for label, mark in (
            ("last", before[-1] if before else None),
            ("next", after[0] if after else None),
        ):
            if mark is None:
                continue
            if t:
                t.append("   ")
            t.append(f"{label} {_clock_text(mark.time, False)} ", style="dim")
            t.append(SYMBOLS[mark.kind] + " ", style=STYLES[mark.kind])
            t.append(mark.text)
        return t

    def on_unmount(self) -> None:
        self._marks_poller.close()
        super().on_unmount()


def run_replay(recording: Recording, speed: float = 1.0, start: float | None = None) -> int:
    """Open the dashboard on ``recording`` (playing from ``start``, or its start)."""
    source = ReplaySource(recording, start=start, speed=speed)
    app = ReplayApp(source)
    return int(app.run() or 0)
