"""The dashboard driven as a person would: in a real terminal (tmux), by keys."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.tools import tool

TIMEOUT_S = 60.0


class Terminal:
    def __init__(self, tmux: str, socket: str) -> None:
        self.tmux = tmux
        self.socket = socket

    def run(self, *args: str) -> str:
        result = subprocess.run(
            [self.tmux, "-L", self.socket, *args], capture_output=True, text=True, timeout=30
        )
        return result.stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "gs")

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "gs", *keys)

    def wait_for(self, what: Callable[[str], bool], why: str) -> str:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            text = self.screen()
            if what(text):
                return text
            time.sleep(0.1)  # polling the terminal for a condition
        raise AssertionError(f"timed out waiting for {why}; the screen:\n{self.screen()}")


@pytest.fixture
def terminal(gpustation_dirs: dict[str, Path]) -> Iterator[Terminal]:
    term = Terminal(tool("tmux", "Debian: tmux"), f"gpustation-test-{uuid.uuid4().hex[:8]}")
    env = " ".join(
        f"{k}={shlex.quote(v)}"
        for k, v in os.environ.items()
        if k.startswith("GPUSTATION_") or k in ("PATH", "HOME")
    )
    command = (
        f"cd {shlex.quote(str(REPO))} && env {env} TERM=xterm-256color "
        f"PYTHONPATH={shlex.quote(str(REPO))} {shlex.quote(sys.executable)} -m gpustation "
        "--simulate 2; echo gpustation-exited-$?; sleep 60"
    )
    term.run("new-session", "-d", "-s", "gs", "-x", "160", "-y", "48", command)
    try:
        yield term
    finally:
        term.run("kill-server")


def test_the_dashboard_opens_switches_screens_by_key_and_quits(terminal: Terminal) -> None:
    first = terminal.wait_for(lambda s: s.count("RTX 4090 (sim)") == 2, "both GPUs' cards")
    assert "SIMULATED" in first.splitlines()[0]
    terminal.keys("t")
    topo = terminal.wait_for(lambda s: "GPU interconnect" in s, "the topology screen")
    assert "GPU0" in topo and "NUMA" in topo
    terminal.keys("Escape")
    terminal.wait_for(lambda s: "History" in s, "the dashboard again")
    terminal.keys("q")
    terminal.wait_for(lambda s: "gpustation-exited-0" in s, "the dashboard to exit with 0")


def test_sigterm_hands_the_dashboard_s_fan_curve_back(
    terminal: Terminal, gpustation_dirs: dict[str, Path]
) -> None:
    import json
    import signal

    import psutil

    from gpustation.telemetry.sim import machine_path

    def fan_modes() -> set[str]:
        state = json.loads(machine_path("rtx4090", 2).read_text())
        return {m for g in state["gpus"] for m in g["fan_mode"]}

    terminal.wait_for(lambda s: s.count("RTX 4090 (sim)") == 2, "both GPUs' cards")
    terminal.keys("c")
    terminal.wait_for(lambda s: "balanced" in s, "the control screen's profiles")
    terminal.keys("3")  # balanced: a power limit and a stepped fan curve
    terminal.wait_for(lambda s: "manual" in s, "the fans under the curve")
    terminal.keys("y")  # keep it
    deadline = time.monotonic() + TIMEOUT_S
    while fan_modes() != {"manual"} and time.monotonic() < deadline:
        time.sleep(0.1)  # polling the simulated cards' state file
    assert fan_modes() == {"manual"}
    dashboards = [
        p
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"]
        and p.info["cmdline"][-2:] == ["--simulate", "2"]
        and "gpustation" in " ".join(p.info["cmdline"])
    ]
    assert len(dashboards) == 1
    dashboards[0].send_signal(signal.SIGTERM)
    terminal.wait_for(lambda s: "gpustation-exited-0" in s, "the dashboard to exit with 0")
    assert fan_modes() == {"auto"}
