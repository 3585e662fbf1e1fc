"""The full-screen dashboard: ``gpustation`` with no subcommand.

Data flow: one sampling thread (:class:`~gpustation.tui.poll.Poller`) samples
(:class:`~gpustation.tui.source.DataSource`: backend,
:class:`~gpustation.telemetry.sampler.Sampler`, process CPU/RSS) and posts a
:class:`FrameReady` message with the :class:`~gpustation.tui.source.Frame`
(or :class:`SampleFailed`) to the app, whose handler feeds the ring
buffers (:class:`~gpustation.telemetry.rings.History`) and alert rules
(:class:`~gpustation.telemetry.alerts.AlertLog`) and repaints the visible
screen. The next pass is scheduled when a frame has been taken, so passes
never overlap and a slow pass never delays a frame; ``p`` stops the
scheduling. The UI thread never calls NVML.

Extension points (for new screens: runs, hardware control, fleet):

* ``SCREENS_BY_MODE`` (:mod:`gpustation.tui.modes`): one :class:`ScreenEntry` per screen. Each is a
  Textual mode with its own key, footer label, command-palette entry and help
  line; ``screen`` is a function returning its class, importing it when the
  screen is first shown (a missing ``requires`` module leaves the entry out).
  ``DashboardApp(screens=[...])`` runs with a subset (the tests use the
  built-in four, so their pictures do not change when a screen is added).
* Screens showing live data subclass :class:`~gpustation.tui.screens.LiveScreen`
  and implement ``show_frame(frame)``.
* ``app.latest`` is the newest :class:`~gpustation.telemetry.model.Snapshot`,
  ``app.frame`` the newest frame, ``app.backend`` the open backend (``None``
  until the first pass). Control actions must run in a worker
  (``app.run_worker(fn, thread=True)``), never on the UI thread; a worker's
  result reaches the UI as a typed message it posts (``post_message``).
* An action that changes the machine (a signal, power, fans, a profile, a run)
  first asks :func:`~gpustation.tui.readonly.refused`: ``app.read_only``
  dashboards show everything and change nothing.
* Bindings all carry ids (``app.quit``, ``dashboard.kill`` ...): the ``[keys]``
  table of config.toml remaps them (:mod:`gpustation.tui.keys`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual.app import SystemCommand
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.screen import Screen

from gpustation.errors import GpustationError
from gpustation.notify import alert_notifier_from_config, notify_warnings
from gpustation.telemetry.alerts import (
    AlertLog,
    fans_unattended,
    idle_rule_or_default,
    limits_left,
)
from gpustation.telemetry.backend import Backend
from gpustation.telemetry.model import Snapshot
from gpustation.telemetry.rings import METRIC_KEYS, METRICS, History
from gpustation.tui.keys import KeymapConfig, apply_keymap
from gpustation.tui.modes import (
    BUILTIN_MODES,
    SCREENS_BY_MODE,
    ScreenEntry,
    available,
    mode_binding,
    screen_maker,
)
from gpustation.tui.poll import Poller
from gpustation.tui.processes import ProcessActions
from gpustation.tui.screens import (
    DashboardScreen,
    LiveScreen,
)
from gpustation.tui.source import DataSource, Frame, dashboard_source

if TYPE_CHECKING:
    from gpustation.telemetry.recording.recorder import Recorder
    from gpustation.tui.dash import Dashboard

#: refresh intervals ``+``/``-`` step through, in seconds
REFRESH_STEPS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)
MIN_REFRESH_S, MAX_REFRESH_S = REFRESH_STEPS[0], REFRESH_STEPS[-1]
#: how much history the graphs show
GRAPH_WINDOW_S = 600.0
#: a pass this overdue (and at least 3 refresh intervals) is shown as stale
STALE_AFTER_S = 3.0
STALE_CHECK_S = 1.0
#: the banner shows a backend's note (why NVML is not used) in full this long,
#: then on its first line only, cut to fit: it stays true for the whole session
NOTE_FULL_S = 8.0


class FrameReady(Message):
    """A sampling pass ended with a frame (posted from the sampling thread)."""

    def __init__(self, frame: Frame) -> None:
        super().__init__()
        self.frame = frame


class NotifyProblems(Message):
    """``[notify]`` URLs that cannot be notified, redacted (posted from a worker)."""

    def __init__(self, warnings: list[str]) -> None:
        super().__init__()
        self.warnings = warnings


class SampleFailed(Message):
    """A sampling pass failed; ``fatal``: the backend could not be opened at all."""

    def __init__(self, message: str, fatal: bool) -> None:
        super().__init__()
        self.message = message
        self.fatal = fatal


class DashboardApp(ProcessActions):
    """The gpustation dashboard. See the module docstring for extension points."""

    TITLE = "gpustation"
    # by its path: screens of other folders (replay/, fleet/) subclass the app
    CSS_PATH = Path(__file__).with_name("dashboard.tcss")
    ENABLE_COMMAND_PALETTE = True

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit", id="app.quit"),
        Binding("question_mark", "show_help", "Help", key_display="?", id="app.help"),
        Binding("t", "show_topology", "Topology", id="app.topology"),
        Binding("a", "show_alerts", "Alerts", id="app.alerts"),
        Binding("m", "cycle_metric", "Metric", id="app.metric"),
        Binding("plus", "slower", "Slower", key_display="+", id="app.slower"),
        Binding("minus", "faster", "Faster", key_display="-", id="app.faster"),
        Binding("p", "toggle_pause", "Pause", id="app.pause"),
        # One key per added screen (app.control, app.runs ...): hidden by
        # check_action where this dashboard runs without that screen.
        *(mode_binding(e) for e in SCREENS_BY_MODE if e.mode not in BUILTIN_MODES),
    ]

    def __init__(
        self,
        source: DataSource | None = None,
        refresh_s: float = 1.0,
        kill: Callable[[int, int], None] = os.kill,
        metric: str = "util",
        autostart: bool = True,
        notify_alerts: bool = True,
        screens: Sequence[ScreenEntry] | None = None,
        keymap: KeymapConfig | None = None,
        read_only: bool = False,
    ) -> None:
        self.source = source or DataSource()
        #: shows everything, changes nothing (tui/readonly.py: what is refused)
        self.read_only = read_only
        self.refresh_s = min(MAX_REFRESH_S, max(MIN_REFRESH_S, refresh_s))
        self.metric = metric if metric in METRICS else "util"
        self.graph_window_s = GRAPH_WINDOW_S
        self.history = History()
        self.alerts = AlertLog(idle=idle_rule_or_default())
        #: sends the alerts [notify] chooses on a thread of its own (None: not configured)
        self.alert_notifier = alert_notifier_from_config()
        self.frame: Frame | None = None
        self.paused = False
        self.error: str | None = None
        self.passes = 0
        self._kill = kill
        #: the sampling thread; a pass is scheduled after each frame
        self._poller = Poller(self._sample_pass, target=self, name="gpustation-sampler")
        self._autostart = autostart
        self._notify_alerts = notify_alerts
        self._last_frame_at = time.monotonic()
        self._was_stale = False
        #: seconds a backend's note is shown in full before it shrinks to one line
        self.note_full_s = NOTE_FULL_S
        self.note_collapsed = False
        self._note_timer: object = None
        #: asked in turn on quit; one that returns True has taken over (asked a question)
        self.quit_hooks: list[Callable[[], bool]] = []
        #: asked before each pass whether the GPM readings are wanted (a live run)
        self.gpm_hooks: list[Callable[[], bool]] = []
        entries = SCREENS_BY_MODE if screens is None else screens
        self._modes_in_use = [e for e in entries if available(e)]
        self.MODES = {e.mode: screen_maker(e) for e in self._modes_in_use}  # type: ignore[misc]
        #: the [keys] table of config.toml, applied on mount
        self.keymap_config = keymap if keymap is not None else KeymapConfig()
        super().__init__()
        known = {e.mode for e in SCREENS_BY_MODE}
        for entry in self._modes_in_use:
            if entry.mode not in BUILTIN_MODES and entry.mode not in known:
                # A screen added at run time: a key, though not one [keys] can remap.
                self.bind(entry.key, f"switch_to('{entry.mode}')", description=entry.title)

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Every toast as plain text: messages carry run names, notes, host names and
        command lines, and a ``[`` in one must show, not be read as markup."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=False)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # A screen this dashboard runs without: its key is neither shown nor live.
        return not (action == "switch_to" and parameters and parameters[0] not in self.MODES)

    # ---- public state ------------------------------------------------------
    @property
    def simulated(self) -> bool:
        """Whether the GPUs shown are simulated ones (their PIDs are never signalled)."""
        return bool(self.latest and self.latest.simulated)

    @property
    def latest(self) -> Snapshot | None:
        """The newest snapshot, or None before the first sample."""
        return self.frame.snapshot if self.frame is not None else None

    @property
    def backend(self) -> Backend | None:
        """The open backend (None until the worker has opened it)."""
        return self.source.backend

    # ---- sampling ----------------------------------------------------------
    def on_mount(self) -> None:
        apply_keymap(self, self.keymap_config)
        self.switch_mode("dashboard")
        # A driver call that hangs must show, not freeze the picture silently.
        self.set_interval(STALE_CHECK_S, self._check_stale)
        if self._autostart:
            self.sample_now()
        if self.alert_notifier is not None:
            # apprise is imported to check the URLs: off the UI thread
            self.run_worker(
                lambda: self.post_message(NotifyProblems(notify_warnings())),
                thread=True,
                name="gpustation-notify-check",
            )

    def on_notify_problems(self, event: NotifyProblems) -> None:
        for warning in event.warnings:
            self.notify(warning, title="Notifications", severity="warning", timeout=12)

    def sample_now(self) -> None:
        """Start a sampling pass now (replaces a scheduled one)."""
        self.source.want_gpm = self.gpm_wanted()
        self._poller.run_now()

    def gpm_wanted(self) -> bool:
        """Whether the next pass reads GPM: the visible screen shows it
        (``shows_gpm``: the dashboard's full cards) or a hook says a run is live."""
        # The screen under a dialog is still on view.
        shown = next((s for s in reversed(self.screen_stack) if not s.is_modal), None)
        if getattr(shown, "shows_gpm", False):
            return True
        return any(hook() for hook in self.gpm_hooks)

    def _sample_pass(self) -> FrameReady | SampleFailed:
        # Runs on the poller's thread; the poller posts what it returns.
        try:
            return FrameReady(self.source.sample())
        except GpustationError as err:
            return SampleFailed(str(err), fatal=True)
        except Exception as err:  # a driver hiccup must not end the dashboard
            return SampleFailed(f"{type(err).__name__}: {err}", fatal=False)

    def _rearm(self, delay: float) -> None:
        if not self.paused and self.is_running:
            self.source.want_gpm = self.gpm_wanted()
            self._poller.schedule(delay)

    @property
    def next_pass_s(self) -> float | None:
        """Seconds until the next scheduled sampling pass (None: none is scheduled)."""
        return self._poller.pending_s

    def on_sample_failed(self, event: SampleFailed) -> None:
        self.error = event.message
        self.notify(event.message, title="Sampling failed", severity="error", timeout=8)
        self.update_chrome(self.screen)
        if not event.fatal:
            self._rearm(max(self.refresh_s, 2.0))

    def _check_stale(self) -> None:
        stale = self.stale_s() is not None
        if stale or self._was_stale:
            self._was_stale = stale
            self.update_chrome(self.screen)

    def stale_s(self) -> float | None:
        """Seconds since the last sample when a pass is overdue, else None."""
        if self.paused or self.error is not None:
            return None
        age = time.monotonic() - self._last_frame_at
        return age if age > max(3 * self.refresh_s, STALE_AFTER_S) else None

    def on_frame_ready(self, event: FrameReady) -> None:
        frame = event.frame
        self.passes += 1
        self._last_frame_at = time.monotonic()
        self.error = None
        self.frame = frame
        self.history.add(frame.snapshot)
        if frame.snapshot.note and self._note_timer is None:
            self._note_timer = self.set_timer(self.note_full_s, self.collapse_note)
        extra = [
            *fans_unattended(frame.unattended_fans, frame.snapshot.time),
            *limits_left(frame.limits_left, frame.snapshot.time),
        ]
        raised = self.alerts.update(frame.snapshot, extra)
        if self.alert_notifier is not None:
            # only queued here: the notifier's own thread talks to the services
            self.alert_notifier.take(raised, frame.snapshot.hostname)
        for alert in raised:
            if not self._notify_alerts:
                continue
            self.notify(
                alert.message,
                title="Alert",
                severity="error" if alert.severity == "critical" else "warning",
                timeout=6,
            )
        try:
            screen = self.screen
            # The screen under a dialog is still on view: it shows the cards as they are now.
            shown = next((s for s in reversed(self.screen_stack) if not s.is_modal), None)
            if isinstance(shown, LiveScreen):
                shown.show_frame(frame)
            self.update_chrome(screen)
        except Exception as err:  # a drawing bug must not stop the sampling
            self.notify(f"{type(err).__name__}: {err}", title="Display error", severity="error")
        finally:
            self._rearm(self.refresh_s)

    # ---- banner and status line ----------------------------------------------
    def collapse_note(self) -> None:
        """Show the backend's note on the banner's one line from now on."""
        self.note_collapsed = True
        screen = self.screen
        self.update_chrome(screen)
        if isinstance(screen, DashboardScreen):
            screen.relayout()

    def banner_text(self, width: int = 200) -> Text:
        snap = self.latest
        t = Text()
        if snap is None:
            t.append(" gpustation ", style="bold reverse")
            t.append(" " + (self.error or "starting: opening the GPU driver…"))
            return t
        if snap.simulated:
            t.append(" SIMULATED ", style="bold black on yellow")
            t.append(" ")
        else:
            t.append(" gpustation ", style="bold reverse")
            t.append(" ")
        if self.read_only:
            t.append(" READ-ONLY ", style="bold reverse")
            t.append(" ")
        t.append(snap.hostname, style="bold")
        t.append(
            f" · {len(snap.gpus)} GPU{'s' if len(snap.gpus) != 1 else ''}"
            f" · driver {snap.driver_version or 'n/a'}"
            + (f" · {snap.compute_runtime_version}" if snap.compute_runtime_version else "")
        )
        if snap.note and self.note_collapsed:
            note = Text(f" · {snap.note}", style="bold yellow")
            note.truncate(max(0, width - t.cell_len), overflow="ellipsis")
            t.append_text(note)
        elif snap.note:
            t.append(f"\n{snap.note}", style="bold yellow")
        elif snap.simulated:
            hint = "  (simulated GPUs: not your hardware)"
            if t.cell_len + len(hint) <= width:  # a hint is not worth a second line
                t.append(hint, style="dim")
        if self.error:
            t.append(f"\nsampling failed: {self.error}", style="bold red")
        if self.source.record_error:
            t.append(f"\nrecording stopped: {self.source.record_error}", style="bold red")
        return t

    def status_text(self, width: int) -> Text:
        active = self.alerts.active
        left = Text()
        if active:
            critical = any(a.severity == "critical" for a in active)
            left.append(
                f" ⚠ {len(active)} ",
                style="bold white on red" if critical else "bold black on yellow",
            )
            left.append(" " + ", ".join(a.short for a in active[:6]))
            if len(active) > 6:
                left.append(f" +{len(active) - 6}")
        else:
            left.append(" ✓ no alerts", style="green")
        right = f"{METRICS[self.metric].label} · every {self.refresh_s:g} s "
        stale = self.stale_s()
        if stale is not None:
            right = f"no sample for {stale:.0f} s: waiting for the driver · " + right
        if self.paused:
            right = "PAUSED · " + right
        left.truncate(max(10, width - len(right) - 1))
        pad = max(1, width - left.cell_len - len(right))
        left.append(" " * pad)
        loud = self.paused or stale is not None
        left.append(right, style="bold reverse" if loud else "dim")
        return left

    def update_chrome(self, screen: Screen[Any]) -> None:
        """Refresh the banner and status line of ``screen`` (if it has them)."""
        chrome = getattr(screen, "chrome", None)
        if chrome is None:
            return
        banner, status = chrome()
        if banner is not None:
            banner.wrap = True  # a long note (the NVML error) wraps, never truncates
            banner.show(self.banner_text(screen.size.width or 80), layout=True)
        if status is not None:
            status.show(self.status_text(screen.size.width or 80))

    # ---- actions -----------------------------------------------------------
    async def action_quit(self) -> None:
        """Quit, unless a quit hook asks first (runs still going)."""
        for hook in list(self.quit_hooks):
            if hook():
                return
        self.exit()

    def action_switch_to(self, mode: str) -> None:
        self.switch_mode("dashboard" if self.current_mode == mode else mode)

    def action_show_dashboard(self) -> None:
        self.switch_mode("dashboard")

    def action_show_topology(self) -> None:
        self.action_switch_to("topology")

    def action_show_alerts(self) -> None:
        self.action_switch_to("alerts")

    def action_show_help(self) -> None:
        self.action_switch_to("help")

    def set_metric(self, metric: str) -> None:
        """Graph ``metric`` (a key of :data:`~gpustation.telemetry.rings.METRICS`)."""
        if metric not in METRICS:
            return
        self.metric = metric
        for screen in self.screen_stack:
            if isinstance(screen, DashboardScreen):
                screen.set_metric(metric)
        self.update_chrome(self.screen)

    def action_cycle_metric(self) -> None:
        keys = METRIC_KEYS
        self.set_metric(keys[(keys.index(self.metric) + 1) % len(keys)])

    def set_refresh(self, seconds: float) -> None:
        """Change the refresh interval (clamped to 0.25..10 s); re-arms the worker."""
        self.refresh_s = min(MAX_REFRESH_S, max(MIN_REFRESH_S, seconds))
        if self._poller.pending_s is not None and not self.paused:
            self._poller.schedule(self.refresh_s)
        self.update_chrome(self.screen)

    def action_slower(self) -> None:
        bigger = [s for s in REFRESH_STEPS if s > self.refresh_s]
        self.set_refresh(bigger[0] if bigger else MAX_REFRESH_S)

    def action_faster(self) -> None:
        smaller = [s for s in REFRESH_STEPS if s < self.refresh_s]
        self.set_refresh(smaller[-1] if smaller else MIN_REFRESH_S)

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        if self.paused:
            self._poller.cancel()
        else:
            self.sample_now()
        self.update_chrome(self.screen)

    # ---- command palette and help ------------------------------------------------
    def all_bindings(self) -> list[Binding]:
        """The app's bindings, as remapped by [keys], without those of absent screens."""
        added = {f"app.{e.mode}" for e in SCREENS_BY_MODE if e.mode not in BUILTIN_MODES}
        in_use = {f"app.{e.mode}" for e in self._modes_in_use}
        out = [
            b
            for b in self.BINDINGS
            if isinstance(b, Binding) and (b.id not in added or b.id in in_use)
        ]
        known = {e.mode for e in SCREENS_BY_MODE}
        for entry in self._modes_in_use:
            if entry.mode not in BUILTIN_MODES and entry.mode not in known:
                out.append(Binding(entry.key, f"switch_to('{entry.mode}')", entry.title))
        return [self.remapped(b) for b in out]

    def screen_bindings(self) -> list[tuple[str, list[Binding]]]:
        """Every key of each added screen and of the views it opens over itself (its
        ``HELP_OVERLAYS``), remapped, for help: (heading, keys)."""
        out = []
        for entry in (e for e in self._modes_in_use if e.mode not in BUILTIN_MODES):
            screen = entry.screen()
            views = [(f"On the {entry.title.lower()} screen", screen)]
            views += [(f"In its {name}", cls) for name, cls in getattr(screen, "HELP_OVERLAYS", ())]
            for heading, cls in views:
                keys = [self.remapped(b) for b in cls.BINDINGS if isinstance(b, Binding)]
                out += [(heading, keys)] if keys else []
        return out

    def remapped(self, binding: Binding) -> Binding:
        """``binding`` with the keys [keys] gives it (itself when not remapped)."""
        keys = self.keymap_config.keymap.get(binding.id or "")
        return binding if keys is None else binding.with_key(keys, key_display=None)

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for entry in self._modes_in_use:
            if entry.commands is not None:
                yield from entry.commands(self, screen)
        for entry in self._modes_in_use:
            yield SystemCommand(
                f"Show {entry.title.lower()}",
                entry.help,
                lambda mode=entry.mode: self.switch_mode(mode),
            )
        for key in METRIC_KEYS:
            yield SystemCommand(
                f"Graph {METRICS[key].label}",
                "change the metric of the history graphs",
                lambda key=key: self.set_metric(key),
            )
        yield SystemCommand(
            "Refresh slower", "lengthen the refresh interval (+)", self.action_slower
        )
        yield SystemCommand(
            "Refresh faster", "shorten the refresh interval (-)", self.action_faster
        )
        yield SystemCommand(
            "Pause / resume sampling", "stop or restart sampling (p)", self.action_toggle_pause
        )
        if isinstance(screen, DashboardScreen):
            yield SystemCommand(
                "Show selected process",
                "its details and whole command line (Enter)",
                screen.action_details,
            )
            yield SystemCommand(
                "Kill selected process", "SIGTERM or SIGKILL after asking (k)", screen.action_kill
            )
            yield SystemCommand(
                "Filter processes", "filter the process table (/)", screen.action_filter
            )
            yield SystemCommand("Sort processes", "sort by the next column (s)", screen.action_sort)

    def on_unmount(self) -> None:
        self._poller.close()
        if self.alert_notifier is not None:
            self.alert_notifier.close(timeout_s=0)  # what is queued still goes out


def run_dashboard(
    gpus: Sequence[int] | None = None,
    refresh_s: float = 1.0,
    simulate: int | None = None,
    sim_card: str | None = None,
    recorder: Recorder | None = None,
    record_error: str | None = None,
    read_only: bool = False,
    source: DataSource | None = None,
    keymap: KeymapConfig | None = None,
) -> int:
    """Open the dashboard on this machine's GPUs (simulated ones when asked).

    ``recorder`` (the ``[record]`` recording) is fed every sample on the
    sampling thread. ``read_only``: show everything, change nothing.
    ``source``: one made already (its first pass started before this module
    was imported); ``gpus``, ``simulate``, ``sim_card`` and ``recorder`` are its own then.
    """
    if source is None:
        source = dashboard_source(gpus, simulate, sim_card, recorder)
    if record_error is not None:
        source.record_error = record_error
    app = DashboardApp(source, refresh_s=refresh_s, read_only=read_only, keymap=keymap)
    try:
        result = app.run()
    finally:
        source.close()
        if app.alert_notifier is not None:
            app.alert_notifier.close()  # give a last alert its chance to go out
    if source.record_error:
        print(f"gpustation: recording stopped: {source.record_error}", file=sys.stderr)
    return int(result or 0)


if TYPE_CHECKING:

    def _is_a_dashboard(app: DashboardApp) -> Dashboard:
        return app  # mypy checks the app has what its screens and controllers read
