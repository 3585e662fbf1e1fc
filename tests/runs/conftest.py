"""Fixtures for the run tests: presets in a temporary config dir, simulated GPUs,
and a clean-up that leaves no run process behind whatever a test did."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypedDict, TypeVar

import psutil
import pytest

from gpustation.runs import rundir

T = TypeVar("T")

CHILDREN = Path(__file__).resolve().parent / "children"


class RunsEnv(TypedDict):
    """What :func:`runs_env` gives a test."""

    dirs: dict[str, Path]
    preset_dir: Path
    write_preset: Callable[[str, str], Path]


def child_script(name: str) -> str:
    return str(CHILDREN / f"{name}.py")


def command_preset(name: str, script: str, *extra: str, args: str = "", more: str = "") -> str:
    """TOML for a preset that runs one of the child scripts."""
    argv = ", ".join(f'"{a}"' for a in (sys.executable, child_script(script), *extra))
    text = f'title = "{name} title"\ncommand = [{argv}]\ngpus = 1\n{more}\n'
    if args:
        text += f"[args]\n{args}\n"
    return text


def wait_until(condition: Callable[[], T], timeout: float = 30.0, what: str = "") -> T:
    """Poll ``condition`` until it is truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what or condition}")
        time.sleep(0.05)


def _kill_leftovers(runs_root: Path) -> list[str]:
    """Kill any process a run directory still names; report what was found."""
    found: list[str] = []
    for state_file in runs_root.glob(f"*/{rundir.STATE_JSON}"):
        state = rundir.read_state(state_file.parent)
        if state is None:
            continue
        for pid in rundir.group_members(state.pgid):
            found.append(f"{state.id}: group member {pid}")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if rundir.process_matches(state.supervisor_pid, state.supervisor_create_time):
            found.append(f"{state.id}: supervisor {state.supervisor_pid}")
            try:
                os.kill(state.supervisor_pid or 0, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return found


@pytest.fixture
def runs_env(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunsEnv]:
    """Simulated GPUs (so the supervisor records telemetry) and a preset dir."""
    yield from runs_environment(gpustation_dirs, monkeypatch)


def runs_environment(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunsEnv]:
    """The body of :func:`runs_env`, for test folders that define it as their own fixture."""
    monkeypatch.setenv("GPUSTATION_SIMULATE", "2")
    preset_dir = gpustation_dirs["config"] / "presets" / "runs"
    preset_dir.mkdir(parents=True)

    def write_preset(name: str, text: str) -> Path:
        path = preset_dir / f"{name}.toml"
        path.write_text(text, encoding="utf-8")
        return path

    runs_root = gpustation_dirs["data"] / "runs"
    yield {"dirs": gpustation_dirs, "preset_dir": preset_dir, "write_preset": write_preset}
    # Give supervisors that are finishing a moment, then make sure nothing is left.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = [rundir.read_state(p.parent) for p in runs_root.glob(f"*/{rundir.STATE_JSON}")]
        if not any(s is not None and s.active for s in states):
            break
        time.sleep(0.1)
    _kill_leftovers(runs_root)


def assert_no_process(pids: list[int]) -> None:
    alive = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    assert not alive, f"processes still running: {alive}"


def sweep_preset(runs_env: RunsEnv, sleep: float) -> None:
    """A two-GPU preset ``sweepy`` whose points take about ``sleep`` seconds."""
    runs_env["write_preset"](
        "sweepy",
        command_preset(
            "sweepy", "sweep_point", args=f"batch_size = 8\nsteps = 3\nsleep = {sleep}"
        ).replace("gpus = 1", "gpus = 2"),
    )


def sim_limits() -> list[float | None]:
    """The power limits of the two simulated GPUs ``--simulate 2`` opens."""
    from gpustation.telemetry.sim import SimBackend

    sim = SimBackend.open(count=2)
    return [g.power_limit_w for g in sim.read_gpus([0, 1], slow=False)]
