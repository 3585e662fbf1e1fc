"""A program in a real pseudo-terminal, and what it sends to the terminal.

:class:`PtyProgram` keeps every byte the program writes to its terminal (for
assertions on the raw stream, escape sequences and all) and feeds the same
bytes to pyte, a terminal emulator, so a test can wait until something is on
the screen. :func:`assert_harmless` states what text planted in a recording,
a run or a preset (:data:`HOSTILE`) may never do once it reaches a terminal.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import os
import pty
import re
import select
import signal
import struct
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyte

TIMEOUT_S = 60.0

#: what a hostile run, recording or preset plants in its text
PWNED = "pwned"
CLIPBOARD = "cHduZWQ="  # base64 of "pwned": what an OSC 52 would put on the clipboard
HOSTILE = (
    f"\x1b]52;c;{CLIPBOARD}\x07"  # OSC 52: write the clipboard
    f"\x1b]0;{PWNED}\x07"  # OSC 0: retitle the window
    f"\x9d0;{PWNED}\x07"  # the same OSC in its 8-bit C1 form
    "\u202e"  # RIGHT-TO-LEFT OVERRIDE: the rest of the line drawn backwards
)
#: how the override must arrive: written out, not obeyed
BIDI_SHOWN = b"\\u202e"


class PtyProgram:
    """``argv`` on a new pseudo-terminal of ``cols`` x ``rows``, its output kept."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path | None = None,
        cols: int = 160,
        rows: int = 48,
    ) -> None:
        env = {**env, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)}
        pid, fd = pty.fork()
        if pid == 0:  # the child: the pty is its controlling terminal
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
                if cwd is not None:
                    os.chdir(cwd)
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.pid, self.fd = pid, fd
        self.raw = bytearray()
        self.exit_code: int | None = None
        self._screen = pyte.Screen(cols, rows)
        self._stream = pyte.ByteStream(self._screen)
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.2)
                if not ready:
                    continue
                chunk = os.read(self.fd, 65536)
            except OSError:  # the program has gone and closed the terminal
                return
            if not chunk:
                return
            with self._lock:
                self.raw += chunk
                self._stream.feed(chunk)

    def bytes(self) -> bytes:
        with self._lock:
            return bytes(self.raw)

    def screen(self) -> str:
        with self._lock:
            return "\n".join(self._screen.display)

    def send(self, keys: builtins.bytes) -> None:
        os.write(self.fd, keys)

    def wait_for(self, condition: Callable[[str], bool], what: str) -> str:
        """Poll the screen until ``condition`` holds; fail naming ``what`` after the timeout."""
        self._wait(lambda: condition(self.screen()), what)
        return self.screen()

    def wait_for_bytes(
        self, condition: Callable[[builtins.bytes], bool], what: str
    ) -> builtins.bytes:
        """Poll what the terminal received until ``condition`` holds (whatever the
        screen made of it)."""
        self._wait(lambda: condition(self.bytes()), what)
        return self.bytes()

    def _wait(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            if condition():
                return
            if self.poll() is not None:
                self._reader.join(timeout=10)  # its last output
                if condition():
                    return
                break
            time.sleep(0.05)  # polling the terminal for a condition
        raise AssertionError(
            f"timed out waiting for {what} (exit {self.exit_code}); the screen:\n{self.screen()}"
        )

    def poll(self) -> int | None:
        """The exit code once the program has ended, else None."""
        if self.exit_code is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.exit_code = os.waitstatus_to_exitcode(status)
        return self.exit_code

    def wait_exit(self, timeout: float = TIMEOUT_S) -> int:
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"the program did not end; the screen:\n{self.screen()}")
            time.sleep(0.05)  # polling for the program's end
        self._reader.join(timeout=10)  # take the last of its output
        return code

    def close(self) -> None:
        """End the program (SIGTERM, then SIGKILL) and release the terminal."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.wait_exit(15)
            except AssertionError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
        self._reader.join(timeout=10)
        with contextlib.suppress(OSError):
            os.close(self.fd)


# An OSC's introducer (7-bit, or the 8-bit one as UTF-8) and its string up to
# whatever ends it: BEL, ST, or the next escape.
_OSC = re.compile(rb"(?:\x1b\]|\xc2\x9d)([^\x07\x1b\x9c]*)")
# C1 control characters as they reach a UTF-8 terminal
_C1 = re.compile(rb"\xc2[\x80-\x9f]")


def osc_strings(raw: bytes) -> list[bytes]:
    """The string of every OSC in ``raw`` (the program's own titles among them)."""
    return _OSC.findall(raw)


def assert_harmless(raw: bytes) -> None:
    """Nothing planted with :data:`HOSTILE` acted on the terminal that received ``raw``.

    The program may send OSCs of its own; none may carry the planted payload.
    No C1 control reaches the terminal; the bidirectional override arrives
    written out (proof that the planted text was drawn at all).
    """
    for string in osc_strings(raw):
        assert PWNED.encode() not in string and CLIPBOARD.encode() not in string, string
    found = _C1.search(raw)
    assert found is None, raw[max(0, found.start() - 40) : found.end() + 40]
    assert "\u202e".encode() not in raw
    assert BIDI_SHOWN in raw
