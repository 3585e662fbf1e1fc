"""Fixtures for the control tests: simulated cards and the fake pynvml."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpustation.cli import main
from gpustation.commands import options as cmdutil
from gpustation.control import journal
from gpustation.control.fancurve import running_controllers
from gpustation.telemetry.backend import Control
from gpustation.telemetry.sim import SimBackend, machine_path
from tests.runs.conftest import wait_until


class RecordingControl(Control):
    """A control that remembers every set call before making it."""

    def __init__(self, inner: Control, calls: list[tuple[Any, ...]]) -> None:
        self.inner, self.calls = inner, calls

    def set_power_limit(self, index: int, watts: float) -> None:
        self.calls.append(("power", index, watts))
        self.inner.set_power_limit(index, watts)

    def fan_count(self, index: int) -> int:
        return self.inner.fan_count(index)

    def fan_speed_range(self, index: int) -> tuple[int, int]:
        return self.inner.fan_speed_range(index)

    def set_fan_speed(self, index: int, fan: int, pct: int) -> None:
        self.calls.append(("fan", index, fan, pct))
        self.inner.set_fan_speed(index, fan, pct)

    def set_fan_auto(self, index: int, fan: int) -> None:
        self.calls.append(("auto", index, fan))
        self.inner.set_fan_auto(index, fan)


class RecordingSim(SimBackend):
    """Simulated cards that also remember every control call made on them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.set_calls: list[tuple[Any, ...]] = []
        super().__init__(*args, **kwargs)
        self.control = RecordingControl(self.control, self.set_calls)


def _recording_sim(
    card: str, count: int, state: Path, monkeypatch: pytest.MonkeyPatch
) -> RecordingSim:
    backend = RecordingSim(count=count, card=card, state_path=machine_path(card, count))
    # Commands run in this process act on this very object, so its record of
    # set calls covers them; child processes share its state file instead.
    monkeypatch.setattr(cmdutil, "backend_from_args", lambda args, **kwargs: backend)
    return backend


@pytest.fixture
def sim(gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> RecordingSim:
    """Two simulated RTX 4090s in the test's state directory (shared with the CLI)."""
    return _recording_sim("rtx4090", 2, gpustation_dirs["state"], monkeypatch)


@pytest.fixture
def sim_h200(gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> RecordingSim:
    """One simulated H200: no fans, 200-700 W."""
    return _recording_sim("h200", 1, gpustation_dirs["state"], monkeypatch)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run gpustation in this process; return (exit code, stdout, stderr)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def journal_entries() -> list[journal.JournalEntry]:
    return list(journal.read_entries())


def standin(lock: Path, name: str, ignore_term: bool = False) -> subprocess.Popen[bytes]:
    """A process that holds ``lock`` as a controller does (flock, its pid inside),
    under the name ``name``; it stays until signalled."""
    script = ('trap "" TERM; ' if ignore_term else "") + (
        'exec 9<>"$1"; flock -x 9; printf %d $$ >"$1"; exec -a "$2" sleep 120'
    )
    proc = subprocess.Popen(["bash", "-c", script, "standin", str(lock), name])
    index = int(lock.stem.rsplit("gpu", 1)[1])
    simulated = "-sim-" in lock.name
    wait_until(
        lambda: (
            running_controllers([index], simulated).get(index) == proc.pid
            and name.encode() in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        ),
        what="the stand-in controller to hold its lock",
    )
    return proc


@pytest.fixture
def standins() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
