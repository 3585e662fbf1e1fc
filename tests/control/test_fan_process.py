"""`gpustation fan run` as a real process on simulated GPUs, stopped by signals."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpustation.errors import EXIT_INTERRUPTED
from tests.conftest import child_env, gpustation_cmd
from tests.control.conftest import RecordingSim, cli, journal_entries

TIMEOUT_S = 60.0


def wait_for(condition: Callable[[], bool], what: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"controller exited ({proc.returncode}) before {what}:\n{out}\n{err}")
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def start_controller(
    gpustation_dirs: dict[str, Path],
) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []

    def start(*extra: str) -> subprocess.Popen[str]:
        env = child_env(
            GPUSTATION_STATE_DIR=str(gpustation_dirs["state"]),
            GPUSTATION_CONFIG_DIR=str(gpustation_dirs["config"]),
            GPUSTATION_DATA_DIR=str(gpustation_dirs["data"]),
        )
        proc = subprocess.Popen(
            gpustation_cmd("fan", "run", "balanced", "--simulate", "--interval", "0.1", *extra),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT_S)


def all_manual(sim: RecordingSim) -> bool:
    return all(m == "manual" for g in sim.read_gpus([0, 1], slow=False) for m in g.fan_control)


def all_auto(sim: RecordingSim) -> bool:
    return all(m == "auto" for g in sim.read_gpus([0, 1], slow=False) for m in g.fan_control)


@pytest.mark.parametrize(
    ("sig", "expected_code"),
    [(signal.SIGINT, EXIT_INTERRUPTED), (signal.SIGTERM, 0), (signal.SIGHUP, 0)],
)
def test_signal_hands_every_fan_back(
    sim: RecordingSim,
    start_controller: Callable[..., subprocess.Popen[str]],
    sig: signal.Signals,
    expected_code: int,
) -> None:
    proc = start_controller()
    wait_for(lambda: all_manual(sim), "the fans to be under manual control", proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == expected_code, err
    assert all_auto(sim)
    assert f"stopped by {sig.name}" in out
    assert "-> fans" in out  # speed changes are logged with temperature and speed
    restores = [e for e in journal_entries() if e.what == "fan_auto"]
    assert sorted((e.gpu, e.fan) for e in restores) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_failed_temperature_read_in_a_running_controller(
    sim: RecordingSim, start_controller: Callable[..., subprocess.Popen[str]]
) -> None:
    sim.poke(1, load=0.0, temperature_c=40.0)
    proc = start_controller()
    wait_for(lambda: all_manual(sim), "the fans to be under manual control", proc)
    sim.poke(1, temperature_fails=True)
    wait_for(
        lambda: sim.read_gpus([1], slow=False)[0].fans_pct == [100, 100],
        "GPU 1's fans at maximum",
        proc,
    )
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 0
    assert "GPU 1: temperature read failed: fans to maximum" in out
    assert all_auto(sim)


def test_fan_auto_stops_a_running_controller(
    capsys: pytest.CaptureFixture[str],
    sim: RecordingSim,
    start_controller: Callable[..., subprocess.Popen[str]],
) -> None:
    proc = start_controller()
    wait_for(lambda: all_manual(sim), "the fans to be under manual control", proc)
    code, out, _ = cli(capsys, "fan", "show", "--simulate")
    assert f"driven by fan controller pid {proc.pid}" in out
    code, out, _ = cli(capsys, "fan", "auto", "--simulate")
    assert code == 0
    assert proc.wait(timeout=TIMEOUT_S) == 0
    assert all_auto(sim)


def test_profile_apply_stock_restores_everything(
    capsys: pytest.CaptureFixture[str],
    sim: RecordingSim,
    start_controller: Callable[..., subprocess.Popen[str]],
) -> None:
    cli(capsys, "power", "set", "250", "--simulate")
    proc = start_controller()
    wait_for(lambda: all_manual(sim), "the fans to be under manual control", proc)
    code, out, err = cli(capsys, "profile", "apply", "stock", "--simulate")
    assert code == 0, err
    assert "GPU 0: 2 fans on automatic control" in out
    assert proc.wait(timeout=TIMEOUT_S) == 0
    assert all_auto(sim)
    assert [g.power_limit_w for g in sim.read_gpus([0, 1], slow=False)] == [450.0, 450.0]
