"""``gpustation web`` as a child process on a free loopback port, for the tests."""

from __future__ import annotations

import os
import re
import resource
import socket
import subprocess
import threading
import time
from types import TracebackType

from tests.conftest import child_env, gpustation_cmd

START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WebServer:
    """``gpustation web ARGS --listen HOST:PORT``; its stderr lines are kept as they come."""

    def __init__(self, *args: str, host: str = "127.0.0.1", open_files: int | None = None) -> None:
        self.port = free_port()

        def limit_files() -> None:  # in the child, before it runs
            if open_files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

        self.proc = subprocess.Popen(
            gpustation_cmd("web", *args, "--listen", f"{host}:{self.port}"),
            env=child_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=limit_files,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        with self._changed:
            return "\n".join(self.lines)

    def wait_line(self, pattern: str, timeout: float = START_TIMEOUT_S) -> re.Match[str]:
        """The first stderr line matching ``pattern``, waiting for it to be printed."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        with self._changed:
            while True:
                for line in self.lines:
                    found = regex.search(line)
                    if found:
                        return found
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(
                        f"no line matching {pattern!r} (exit {self.proc.poll()}):\n"
                        + "\n".join(self.lines)
                    )
                self._changed.wait(min(left, 0.5))

    def wait_listening(self, timeout: float = START_TIMEOUT_S) -> None:
        """Poll the port until it accepts a connection."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self._reader.join(timeout=5)
                raise AssertionError(
                    f"gpustation web exited {self.proc.returncode}:\n{self.output}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"nothing listens on {self.port}:\n{self.output}"
                    ) from None
                time.sleep(0.05)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self) -> str:
        """The tokened URL the command printed."""
        return self.wait_line(r"the dashboard at (http://\S+)").group(1)

    def token(self) -> str:
        return self.wait_line(r"\?token=(\S+)").group(1)

    def cpu_s(self) -> float:
        """The server's CPU time so far (user + system), from /proc."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> int:
        """SIGTERM, then the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._reader.join(timeout=10)
        return self.proc.returncode

    def __enter__(self) -> WebServer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
