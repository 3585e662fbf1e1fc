"""A program under a pseudo-terminal, as a person runs it: shared by the benchmarks."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import signal
import struct
import termios
import time


def spawn(argv: list[str], env: dict[str, str], cols: int = 160, rows: int = 48) -> tuple[int, int]:
    """Start ``argv`` on a new pty of ``cols`` x ``rows``; returns (pid, pty fd)."""
    pid, fd = pty.fork()
    if pid == 0:  # child
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        os.execvpe(argv[0], argv, env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    return pid, fd


def reap(pid: int, fd: int, grace_s: float = 10.0) -> None:
    """Wait for the program to end (draining its output), kill it after ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            select.select([fd], [], [], 0.1) and os.read(fd, 65536)
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    os.close(fd)


def quit_and_reap(pid: int, fd: int, grace_s: float = 10.0) -> None:
    """Press ``q`` (every program measured here quits on it), then :func:`reap`."""
    with contextlib.suppress(OSError):
        os.write(fd, b"q")
    reap(pid, fd, grace_s)
