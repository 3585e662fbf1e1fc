"""Being told: a run ended or slowed down, a GPU was lost or throttled by heat, a GPU is held idle.

``[notify]`` in config.toml::

    [notify]
    urls = ["ntfy://ntfy.sh/my-gpus", "mailto://user:pass@example.com"]  # apprise URLs
    events = ["run_finished", "run_failed", "run_oom", "gpu_lost"]        # default: all
    bell = true                                                            # terminal bell

Messages go through apprise (the optional ``notify`` extra, imported only
when URLs are configured) and, where a terminal is attached, the bell. A
failure to notify is logged and never raised: a run's outcome, the dashboard,
the exporter and the recorder never depend on a notification service.

Run ends are sent by the supervisor (:mod:`gpustation.runs.launch.notify_end`), and so
are slowdowns (:mod:`gpustation.runs.slowdown.watch`); GPU
events by :class:`AlertNotifier`, which the dashboard, ``gpustation serve``
and ``gpustation record`` feed with the alerts their alert log raises.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpustation.config import config_path, section
from gpustation.errors import UsageError
from gpustation.redact import redact_text, redact_url

if TYPE_CHECKING:
    from gpustation.telemetry.alerts import Alert

log = logging.getLogger(__name__)

EVENTS = {
    "run_finished": "a run finished",
    "run_failed": "a run failed",
    "run_oom": "a run ran out of GPU memory",
    "run_slowdown": "a run slowed down (with its cause)",
    "gpu_lost": "a GPU fell off the bus",
    "gpu_hot": "a GPU is throttled by heat",
    "gpu_idle_held": "a process holds a GPU's memory but leaves it idle",
}
#: alert rules -> the events that tell of them
ALERT_EVENTS = {
    "gpu_lost": "gpu_lost",
    "thermal_throttle": "gpu_hot",
    "gpu_idle_held": "gpu_idle_held",
}
#: how long one notification may take before it is given up (seconds)
SEND_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class NotifyConfig:
    urls: list[str] = field(default_factory=list)
    events: frozenset[str] = frozenset(EVENTS)
    bell: bool = True

    @property
    def enabled(self) -> bool:
        return bool(self.urls) or self.bell


def load_notify_config(path: Path | None = None) -> NotifyConfig:
    """``[notify]`` from config.toml, every problem reported at once (UsageError)."""
    path = path or config_path()
    table = section("notify", path)
    problems: list[str] = []
    urls = table.get("urls", [])
    if not isinstance(urls, list) or not all(isinstance(u, str) and "://" in u for u in urls):
        problems.append('urls must be a list of apprise URLs such as "ntfy://topic"')
        urls = []
    events = table.get("events", sorted(EVENTS))
    if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
        problems.append("events must be a list of event names")
        events = []
    unknown_events = sorted(set(events) - set(EVENTS))
    if unknown_events:
        problems.append(
            f"unknown event(s) {', '.join(unknown_events)}; known: {', '.join(sorted(EVENTS))}"
        )
    bell = table.get("bell", True)
    if not isinstance(bell, bool):
        problems.append("bell must be true or false")
        bell = True
    unknown = sorted(set(table) - {"urls", "events", "bell"})
    if unknown:
        problems.append(f"unknown key(s): {', '.join(unknown)}")
    if problems:
        raise UsageError(f"{path} [notify]: " + "; ".join(problems))
    return NotifyConfig(list(urls), frozenset(events) & frozenset(EVENTS), bell)


class Notifier:
    """Sends the events its config asks for; never raises."""

    def __init__(
        self,
        config: NotifyConfig,
        bell: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self._bell = bell or _terminal_bell
        self._apprise: Any = None
        #: why the last notification failed, for a status line
        self.last_error: str | None = None

    def wanted(self, event: str) -> bool:
        return event in self.config.events

    def send(self, event: str, title: str, body: str) -> bool:
        """Notify of ``event``; True when every configured URL took the message."""
        if not self.wanted(event):
            return False
        if self.config.bell:
            try:
                self._bell()
            except Exception:  # a closed terminal must not matter
                pass
        if not self.config.urls:
            return True
        ok = False
        try:
            ok = self._send_with_timeout(title, body)
        except Exception as err:  # apprise missing, a URL it cannot parse, a network error
            self.last_error = redact_text(f"{type(err).__name__}: {err}")
            log.warning("notification %r not sent: %s", event, self.last_error)
            return False
        if not ok:
            self.last_error = self.last_error or "a notification service refused the message"
            log.warning("notification %r not sent: %s", event, self.last_error)
        return ok

    def _send_with_timeout(self, title: str, body: str) -> bool:
        result: list[bool] = []
        failure: list[BaseException] = []

        def work() -> None:
            try:
                result.append(bool(self._service().notify(title=title, body=body)))
            except BaseException as err:
                failure.append(err)

        thread = threading.Thread(target=work, name="gpustation-notify", daemon=True)
        thread.start()
        thread.join(SEND_TIMEOUT_S)
        if failure:
            raise failure[0]
        if thread.is_alive():
            self.last_error = f"no answer within {SEND_TIMEOUT_S:g} s"
            return False
        return bool(result and result[0])

    def _service(self) -> Any:
        if self._apprise is None:
            try:
                # optional extra 'notify'
                import apprise
            except ImportError:
                raise RuntimeError(
                    "apprise is not installed: pip install 'gpustation[notify]'"
                ) from None
            _redact_apprise_log()
            service = apprise.Apprise()
            bad = [url for url in self.config.urls if not service.add(url)]
            if len(bad) == len(self.config.urls):
                raise ValueError(_cannot_use(bad))
            if bad:  # the others still get the message
                log.warning("%s", _cannot_use(bad))
            self._apprise = service
        return self._apprise


def _cannot_use(urls: list[str]) -> str:
    shown = ", ".join(repr(redact_url(u)) for u in urls)
    return f"apprise cannot use the URL{'s' if len(urls) > 1 else ''} {shown}"


class _RedactFilter(logging.Filter):
    """Apprise logs the URLs it is given, shortening a password only partly."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact_text(record.getMessage()), None
        return True


def _redact_apprise_log() -> None:
    logger = logging.getLogger("apprise")
    if not any(isinstance(f, _RedactFilter) for f in logger.filters):
        logger.addFilter(_RedactFilter())


def notify_problems(config: NotifyConfig, path: Path | None = None) -> list[str]:
    """Why some of ``config``'s URLs cannot be notified (apprise missing, a URL
    apprise rejects), each URL redacted; ``[]`` when all can."""
    if not config.urls:
        return []
    where = f"{path or config_path()} [notify]"
    try:
        # optional extra 'notify'
        import apprise
    except ImportError:
        return [
            f"{where}: urls are set but apprise is not installed: pip install 'gpustation[notify]'"
        ]
    _redact_apprise_log()
    logger = logging.getLogger("apprise")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # the one line below says it better
    try:
        bad = [url for url in config.urls if not apprise.Apprise().add(url)]
    finally:
        logger.setLevel(level)
    if not bad:
        return []
    return [f"{where}: {_cannot_use(bad)}; nothing is sent there"]


def notify_warnings(path: Path | None = None) -> list[str]:
    """What a command that notifies says as it starts: a bad ``[notify]`` table
    or URLs that apprise cannot use (redacted). Never raises."""
    try:
        return notify_problems(load_notify_config(path), path)
    except UsageError as err:
        return [redact_text(str(err)) + "; nothing is notified"]
    except Exception as err:  # a broken apprise must not stop the command
        return [redact_text(f"[notify] cannot be checked: {err}")]


def _terminal_bell() -> None:
    stream = sys.stderr
    if stream.isatty():
        stream.write("\a")
        stream.flush()


def notifier_from_config() -> Notifier | None:
    """The configured notifier, or None when nothing is configured or the
    config is bad (a bad ``[notify]`` table must not stop a run; it is logged)."""
    try:
        config = load_notify_config()
    except UsageError as err:
        log.warning("%s", redact_text(str(err)))
        return None
    return Notifier(config) if config.urls else None


def alert_message(alert: Alert, hostname: str | None) -> tuple[str, str, str] | None:
    """(event, title, body) for an alert that tells of an event, else None."""
    event = ALERT_EVENTS.get(alert.rule)
    if event is None or alert.cleared:
        return None
    return event, f"gpustation: {alert.short} on {hostname or 'host'}", alert.message


class AlertNotifier:
    """Sends the GPU alerts whose event ``[notify] events`` chooses, one after
    another on a thread of its own: :meth:`take` only queues, so the caller
    (the dashboard's UI thread, the exporter's or recorder's sampling loop)
    never waits on a notification service."""

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier
        self._queue: queue.Queue[tuple[str, str, str] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        #: notifications sent, and those that could not be
        self.sent = 0
        self.failed = 0

    def take(self, alerts: Iterable[Alert], hostname: str | None) -> list[str]:
        """Queue the alerts [notify] asks for; returns the events queued.

        It only queues, and whatever fails here is logged, never raised: the
        dashboard, the exporter and the recorder call it from their own loops.
        """
        queued: list[str] = []
        try:
            for alert in alerts:
                message = alert_message(alert, hostname)
                if message is None or not self.notifier.wanted(message[0]):
                    continue
                with self._lock:
                    if self._closed:
                        break
                    if self._thread is None:
                        self._thread = threading.Thread(
                            target=self._work, name="gpustation-alert-notify", daemon=True
                        )
                        self._thread.start()
                    self._queue.put(message)
                queued.append(message[0])
        except Exception as err:
            log.warning("alerts not notified: %s", err)
        return queued

    def _work(self) -> None:
        while True:
            message = self._queue.get()
            try:
                if message is None:
                    return
                try:
                    ok = self.notifier.send(*message)
                except Exception as err:  # send never raises; be sure of it here
                    log.warning("notification %r not sent: %s", message[0], err)
                    ok = False
                if ok:
                    self.sent += 1
                else:
                    self.failed += 1
            finally:
                self._queue.task_done()

    def close(self, timeout_s: float = SEND_TIMEOUT_S) -> None:
        """Send what is queued, waiting at most ``timeout_s``; take nothing more."""
        with self._lock:
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
        if thread is not None:
            thread.join(timeout_s)


def alert_notifier_from_config() -> AlertNotifier | None:
    """An :class:`AlertNotifier` when ``[notify]`` has URLs (apprise is imported
    only when the first message goes out), else None."""
    notifier = notifier_from_config()
    return AlertNotifier(notifier) if notifier is not None else None
