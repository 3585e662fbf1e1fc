"""Reading other hosts over ssh: host validation, the ssh command, one stream per host.

A remote host is read with the system ``ssh`` client running
``gpustation snapshot --json --watch INTERVAL`` there: one
``gpustation.snapshot/1`` document per line. The user's ssh config, keys and
agent apply; gpustation adds only BatchMode (never prompt), a connect timeout
and keepalives, so a dead host is noticed within seconds. A host that sends
no complete line for :data:`SILENCE_RESTART_S` (or ten intervals) is
restarted, a line is capped at :data:`MAX_LINE_BYTES`, and each line is
parsed by :func:`gpustation.jsondoc.loads` and checked as a snapshot.

Safety: a host string is validated before ssh ever sees it (no leading ``-``,
no whitespace, no shell metacharacters), ``--`` ends ssh's options before the
host, and ssh is started from an argv list, never through a local shell.

Settings a test or a user may change without touching code:

- ``GPUSTATION_REMOTE_COMMAND`` / ``[fleet] remote_command``: how to start
  gpustation on the remote side (default ``gpustation``), e.g.
  ``~/.venv/bin/gpustation`` or ``/opt/venv/bin/python -m gpustation``. It is run
  by the remote user's shell, followed by ``snapshot --json --watch INTERVAL``.
- ``GPUSTATION_SSH_CONFIG`` / ``--ssh-config`` / ``[fleet] ssh_config``: an ssh
  client config file, passed as ``ssh -F FILE``.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shlex
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpustation import jsondoc, privs
from gpustation.errors import UsageError
from gpustation.telemetry.model import Snapshot
from gpustation.textsafe import safe, safe_doc

DEFAULT_REMOTE_COMMAND = "gpustation"
CONNECT_TIMEOUT_S = 5
# A stream that says nothing for this long (beyond a few intervals) is
# restarted even if ssh still believes the connection is alive.
SILENCE_RESTART_S = 20.0
MAX_LINE_BYTES = 16 * 1024 * 1024

# [user@]host[:port]; host is a name/alias/IPv4 or an IPv6 address in brackets.
_USER = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
_NAME = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
_V6 = r"\[[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?\]"
_HOST_RE = re.compile(
    rf"^(?:(?P<user>{_USER})@)?(?P<host>{_NAME}|{_V6})(?::(?P<port>[0-9]{{1,5}}))?$"
)


@dataclass(frozen=True)
class HostSpec:
    """A validated host: what the user typed, and what ssh is given."""

    text: str
    user: str | None
    host: str
    port: int | None

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host


def parse_host(text: str) -> HostSpec:
    """Validate ``[user@]host[:port]``; UsageError for anything else.

    Refuses a leading ``-`` (it would be read as an ssh option), whitespace and
    shell metacharacters, so a host string can only ever name a host.
    """
    if not isinstance(text, str) or not text:
        raise UsageError("empty host name", field="host")
    if text.startswith("-"):
        raise UsageError(
            f"{text!r} starts with '-'; a host name cannot be an ssh option", field="host"
        )
    bad = sorted({c for c in text if c.isspace() or c in "\"'`$;&|<>(){}*?!\\#~^,=\n"})
    if bad:
        shown = " ".join(repr(c) for c in bad)
        raise UsageError(
            f"{text!r} contains characters a host name cannot hold ({shown}); "
            "expected [USER@]HOST[:PORT]",
            field="host",
        )
    m = _HOST_RE.match(text)
    if not m:
        raise UsageError(
            f"{text!r} is not [USER@]HOST[:PORT] (an IPv6 address goes in brackets: [::1]:22)",
            field="host",
        )
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"port must be 1-65535 in {text!r}", field="host")
    host = m["host"]
    if host.startswith("["):
        host = host[1:-1]
    return HostSpec(text=text, user=m["user"], host=host, port=port)


def remote_command() -> str:
    """The remote command prefix: env ``GPUSTATION_REMOTE_COMMAND`` or ``gpustation``."""
    return os.environ.get("GPUSTATION_REMOTE_COMMAND") or DEFAULT_REMOTE_COMMAND


def ssh_argv(
    host: str | HostSpec,
    interval: float,
    command: str | None = None,
    ssh_config: str | None = None,
) -> list[str]:
    """The ssh argv that streams snapshots from ``host`` every ``interval`` seconds."""
    spec = host if isinstance(host, HostSpec) else parse_host(host)
    command = command or remote_command()
    try:
        if not shlex.split(command):
            raise ValueError("empty")
    except ValueError as err:
        raise UsageError(f"remote command {command!r} is not a command line ({err})") from None
    # The remote side runs "<command> snapshot ..." through the remote user's
    # shell; only fixed words and a number follow the user's own command.
    return [
        *ssh_options(spec, ssh_config),
        "--",
        spec.destination,
        command,
        *("snapshot", "--json", "--watch", f"{interval:g}"),
    ]


def ssh_options(spec: HostSpec, ssh_config: str | None = None) -> list[str]:
    """``ssh`` and the options every connection of gpustation uses, up to the host.

    The caller adds ``--``, ``spec.destination`` and the remote command.
    ``ssh_config`` None: ``GPUSTATION_SSH_CONFIG``, else the user's own config.
    """
    if ssh_config is None:
        ssh_config = os.environ.get("GPUSTATION_SSH_CONFIG") or None
    argv = ["ssh"]
    if ssh_config:
        argv += ["-F", ssh_config]
    argv += [
        "-T",
        "-o", "BatchMode=yes",
        "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
        "-o", "ServerAliveInterval=5",
        "-o", "ServerAliveCountMax=2",
        # "Permanently added ... to known hosts" would otherwise be the last stderr line.
        "-o", "LogLevel=ERROR",
    ]  # fmt: skip
    if spec.port is not None:
        argv += ["-p", str(spec.port)]
    return argv


# ---- one host's stream ------------------------------------------------------

CONNECTING = "connecting"
UP = "up"
DOWN = "down"
GARBAGE = "garbage"
STOPPED = "stopped"


@dataclass(frozen=True)
class HostState:
    """A consistent view of one host, safe to read from any thread."""

    name: str
    state: str
    snapshot: Snapshot | None
    error: str | None
    received_at: float | None  # time.time() of the last good snapshot
    connected_at: float | None
    retry_at: float | None  # when the next connection attempt is due (down hosts)
    attempts: int
    interval: float

    def age_s(self, now: float | None = None) -> float | None:
        if self.received_at is None:
            return None
        return (now if now is not None else time.time()) - self.received_at

    def stale(self, now: float | None = None) -> bool:
        """No snapshot for more than three intervals while the stream is up."""
        age = self.age_s(now)
        return self.state == UP and age is not None and age > 3 * self.interval + 0.5


class HostStream:
    """Runs one command (normally ssh) and parses its JSON Lines into Snapshots.

    A thread owns the subprocess: it reads stdout and stderr without blocking
    (one ``selectors`` loop, no extra threads), publishes each good snapshot,
    and restarts the command with exponential backoff when it ends or
    misbehaves. Readers only ever look at :meth:`state`, an immutable value.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        interval: float = 1.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        retry: bool = True,
        on_update: Callable[[HostStream, HostState], None] | None = None,
        env: dict[str, str] | None = None,
        silence_s: float | None = None,
    ) -> None:
        self.name = name
        #: no complete line for this long restarts the stream (None: see SILENCE_RESTART_S)
        self.silence_s = silence_s
        self.argv = list(argv)
        self.interval = interval
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.retry = retry
        self.on_update = on_update
        self.env = env
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._proc_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._changed = threading.Condition()
        self._state = HostState(name, CONNECTING, None, None, None, None, None, 0, interval)

    # -- reading ---------------------------------------------------------
    def state(self) -> HostState:
        return self._state

    def wait(self, predicate: Callable[[HostState], bool], timeout: float) -> HostState:
        """Block until ``predicate(state)`` holds or ``timeout`` passes; return the state."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self._state):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            return self._state

    # -- lifecycle -------------------------------------------------------
    def start(self) -> HostStream:
        self._thread = threading.Thread(
            target=self._run, name=f"gpustation-host-{self.name}", daemon=True
        )
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop the stream and end its subprocess (no orphans)."""
        self._stop.set()
        self._kill()
        if self._thread is not None:
            self._thread.join(timeout)
        self._publish(state=STOPPED)

    # -- internals -------------------------------------------------------
    def _publish(self, **changes: Any) -> None:
        with self._changed:
            self._state = new = replace(self._state, **changes)
            self._changed.notify_all()
        if self.on_update is not None:
            with contextlib.suppress(Exception):
                self.on_update(self, new)

    def _kill(self) -> None:
        with self._proc_lock:
            proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        # ssh runs in its own session; end the whole group it may have made.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)

    def _run(self) -> None:
        delay = self.backoff_initial_s
        attempts = 0
        while not self._stop.is_set():
            attempts += 1
            self._publish(state=CONNECTING, attempts=attempts, retry_at=None, connected_at=None)
            got_any, error = self._stream_once()
            if self._stop.is_set():
                break
            if got_any:
                delay = self.backoff_initial_s  # it worked for a while: retry promptly
            retry_at = time.time() + delay if self.retry else None
            state = GARBAGE if error.startswith("garbage:") else DOWN
            self._publish(state=state, error=error, retry_at=retry_at)
            if not self.retry or self._stop.wait(delay):
                break
            delay = min(self.backoff_max_s, delay * 2)

    def _stream_once(self) -> tuple[bool, str]:
        """Run the command once; return (whether a snapshot arrived, why it ended)."""
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                env=self.env,
                **privs.child_kwargs(),  # the user's keys and known hosts, under sudo too
            )
        except OSError as err:
            return False, f"cannot run {self.argv[0]}: {err.strerror or err}"
        with self._proc_lock:
            self._proc = proc
        assert proc.stdout is not None and proc.stderr is not None
        self._publish(connected_at=time.time())
        stderr_tail: deque[str] = deque(maxlen=5)
        got_any = False
        garbage: str | None = None
        buffers = {"out": b"", "err": b""}
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, "out")
        sel.register(proc.stderr, selectors.EVENT_READ, "err")
        # Only a whole line counts as output: a host that trickles a byte now and then
        # never completes one, and is restarted like a silent one.
        last_line = time.monotonic()
        silence_limit = self.silence_s or max(SILENCE_RESTART_S, 10 * self.interval)
        open_streams = 2
        try:
            while open_streams and not self._stop.is_set():
                events = sel.select(timeout=min(0.5, silence_limit / 4))
                if time.monotonic() - last_line > silence_limit:
                    return got_any, f"no complete snapshot for {silence_limit:g} s; reconnecting"
                for key, _ in events:
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        open_streams -= 1
                        continue
                    which = key.data
                    buffers[which] += chunk
                    *lines, buffers[which] = buffers[which].split(b"\n")
                    if which == "err":
                        stderr_tail.extend(
                            s for s in (x.decode(errors="replace").strip() for x in lines) if s
                        )
                        buffers["err"] = buffers["err"][-4096:]
                        continue
                    if lines:
                        last_line = time.monotonic()
                    for raw in lines:
                        if not raw.strip():
                            continue
                        snap, problem = _parse_line(raw)
                        if snap is not None:
                            got_any = True
                            garbage = None
                            self._publish(
                                state=UP,
                                snapshot=snap,
                                error=None,
                                received_at=time.time(),
                                retry_at=None,
                            )
                        else:
                            garbage = problem
                            self._publish(state=GARBAGE, error=problem)
                    if len(buffers["out"]) > MAX_LINE_BYTES:
                        return got_any, "garbage: a line longer than 16 MiB; reconnecting"
        finally:
            sel.close()
            self._kill()
            code = proc.poll()
            proc.stdout.close()
            proc.stderr.close()
            with self._proc_lock:
                self._proc = None
        if self._stop.is_set():
            return got_any, "stopped"
        reason = stderr_tail[-1] if stderr_tail else None
        if garbage is not None:
            return got_any, garbage
        if reason is None:
            reason = f"connection ended (exit status {code})"
        elif code == 255:
            reason = f"ssh: {reason}" if not reason.startswith("ssh") else reason
        return got_any, reason


def _parse_line(raw: bytes) -> tuple[Snapshot | None, str]:
    """A Snapshot from one line, or None and a message quoting the offending text.

    Whatever the line holds (deep nesting, huge numbers, escape sequences),
    the answer is a snapshot whose text is safe for a terminal, or a message:
    one absurd line never ends the host's stream.
    """
    text = raw.decode(errors="replace").strip()
    shown = safe(text if len(text) <= 60 else text[:57] + "...")
    try:
        data = jsondoc.loads(raw, MAX_LINE_BYTES)
    except jsondoc.DocumentError as err:
        return None, f"garbage: {err}: {shown!r}"
    if not isinstance(data, dict):
        return None, f"garbage: not a snapshot: {shown!r}"
    try:
        return Snapshot.from_dict(safe_doc(data)), ""
    except ValueError as err:
        return None, f"garbage: {safe(err)}"
    except Exception as err:  # wrong shapes inside a document with the right schema
        return None, f"garbage: malformed snapshot ({type(err).__name__}: {safe(err)})"
