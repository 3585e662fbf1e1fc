"""``gpustation replay FILE``: the dashboard on a recording.

The recorded snapshots reach the dashboard's own screens (cards, graphs,
topology, alert log) through the same path as live ones: a
:class:`~gpustation.tui.replay.source.ReplaySource` stands in for the
:class:`~gpustation.tui.source.DataSource` and each pass of the sampling
thread returns the snapshot at the playback position, with the snapshots
played over since the last pass. The keys only leave requests (seek, step,
speed) that the next pass carries out.

The banner says REPLAY and the recording's time, and draws a timeline of the
recording with marks (:mod:`gpustation.tui.replay.marks`): runs starting
``[`` and ending ``]``, alerts ``!`` and control changes ``◆``, from the same
period. ``n``/``N`` jump to the next or previous mark.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from gpustation import timefmt
from gpustation.errors import UsageError
from gpustation.telemetry.alerts import AlertLog
from gpustation.telemetry.recording.file import SPEEDS, Recording
from gpustation.timespec import parse_time
from gpustation.tui.app import DashboardApp, FrameReady
from gpustation.tui.keys import KeymapConfig
from gpustation.tui.modes import SCREENS_BY_MODE
from gpustation.tui.poll import Poller
from gpustation.tui.procrows import ProcRow
from gpustation.tui.replay.marks import (
    STYLES,
    SYMBOLS,
    Mark,
    clock_text,
    collect_marks,
    timeline_text,
)
from gpustation.tui.replay.source import ReplaySource, Step
from gpustation.tui.screens import LiveScreen

# ---- going to a time -------------------------------------------------------------


def parse_goto(text: str, position: float, start: float, end: float) -> float:
    """A time from what the user typed: ``start``, ``end`` or any form of
    :func:`gpustation.timespec.parse_time` (relative ones from ``position``)."""
    text = text.strip()
    if text in ("start", "end"):
        return start if text == "start" else end
    return parse_time(text, "go to", position, (start, end))


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
    #: the footer's keys, most needed first (see tui/footer.py): moving in the recording
    FOOTER_NEED = ("seek", "step", "toggle_pause", "goto", "mark", "speed")

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
            except UsageError as err:
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
        t.append(" " + timefmt.full(when, zone=True))
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
            t.append(f"{label} {clock_text(mark.time, False)} ", style="dim")
            t.append(SYMBOLS[mark.kind] + " ", style=STYLES[mark.kind])
            t.append(mark.text)
        return t

    def on_unmount(self) -> None:
        self._marks_poller.close()
        super().on_unmount()


def run_replay(
    recording: Recording,
    speed: float = 1.0,
    start: float | None = None,
    keymap: KeymapConfig | None = None,
) -> int:
    """Open the dashboard on ``recording`` (playing from ``start``, or its start)."""
    source = ReplaySource(recording, start=start, speed=speed)
    app = ReplayApp(source, keymap=keymap)
    return int(app.run() or 0)
