"""``gpustation serve`` tells of GPU events without the dashboard: a simulated GPU
pushed hot reaches a loopback endpoint through apprise's json://, an event
``[notify] events`` leaves out does not, and a notification service that
cannot be reached never stops the exporter."""

from __future__ import annotations

import subprocess
import urllib.request
from pathlib import Path

import pytest

from gpustation.notify import AlertNotifier, Notifier, NotifyConfig
from gpustation.serve.exporter import Exporter
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend
from tests.conftest import child_env, gpustation_cmd
from tests.fleet.sshd import free_port
from tests.receiver import Receiver
from tests.runs.conftest import wait_until

TIMEOUT = 60.0


def _config(config_dir: Path, receiver: Receiver, events: str | None = None) -> None:
    chosen = f"events = {events}\n" if events is not None else ""
    (config_dir / "config.toml").write_text(
        f'[notify]\nurls = ["{receiver.url}"]\nbell = false\n{chosen}'
    )


def _cool_and_idle() -> SimBackend:
    """The machine ``--simulate 2`` opens, both GPUs idle and cool: no alert yet."""
    sim = SimBackend.open(count=2)
    for i in (0, 1):
        sim.poke(i, load=0.0, ambient_c=30.0, temperature_c=35.0)
    return sim


def _push_hot(sim: SimBackend, index: int) -> None:
    # a hot room and full load keep the card past its slowdown margin
    sim.poke(index, load=1.0, ambient_c=85.0, temperature_c=95.0)


def _metrics(port: int, proc: subprocess.Popen[str]) -> str | None:
    if proc.poll() is not None:
        pytest.fail(f"serve exited with {proc.returncode}: {proc.stderr and proc.stderr.read()}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text: str = resp.read().decode()
            return text
    except OSError:
        return None


def _serve(port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        gpustation_cmd(
            "serve", "--simulate", "2", "--interval", "0.2", "--listen", f"127.0.0.1:{port}"
        ),
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=TIMEOUT)
    return err or ""


def _hot_alert_served(port: int, proc: subprocess.Popen[str]) -> bool:
    text = _metrics(port, proc) or ""
    return any(
        line.startswith("gpustation_alert{")
        and 'rule="thermal_throttle"' in line
        and 'gpu="1"' in line
        for line in text.splitlines()
    )


def test_serve_notifies_a_gpu_that_runs_hot(
    receiver: Receiver, gpustation_dirs: dict[str, Path]
) -> None:
    _config(gpustation_dirs["config"], receiver)
    sim = _cool_and_idle()
    port = free_port()
    proc = _serve(port)
    try:
        wait_until(lambda: _metrics(port, proc), TIMEOUT, "the first scrape")
        assert receiver.messages == []  # nothing to tell of yet
        _push_hot(sim, 1)
        assert receiver.got.wait(TIMEOUT), "no notification reached the endpoint"
    finally:
        stderr = _stop(proc)
    assert proc.returncode == 0, stderr
    hot = [m for m in receiver.messages if "thermal throttle" in m["title"]]
    assert len(hot) == 1, receiver.messages
    assert hot[0]["title"].startswith("gpustation: GPU1 thermal throttle on ")
    assert hot[0]["message"] == "GPU 1 is slowing its clocks: too hot"
    assert all("GPU1" in m["title"] for m in receiver.messages)  # GPU 0 stayed cool


def test_serve_leaves_out_an_event_not_chosen(
    receiver: Receiver, gpustation_dirs: dict[str, Path]
) -> None:
    _config(gpustation_dirs["config"], receiver, events='["gpu_lost", "run_failed"]')
    sim = _cool_and_idle()
    port = free_port()
    proc = _serve(port)
    try:
        wait_until(lambda: _metrics(port, proc), TIMEOUT, "the first scrape")
        _push_hot(sim, 1)
        # the alert is raised (and would have been queued) before it is served
        wait_until(lambda: _hot_alert_served(port, proc), TIMEOUT, "the thermal alert in /metrics")
    finally:
        stderr = _stop(proc)  # serve sends what it has queued before it exits
    assert proc.returncode == 0, stderr
    assert receiver.messages == []


def test_a_notification_service_that_cannot_be_reached_never_stops_the_exporter() -> None:
    backend = SimBackend(count=2, state_path=None, clock=lambda: 1e6)
    _push_hot(backend, 0)
    alerts = AlertNotifier(Notifier(NotifyConfig(urls=["json://127.0.0.1:1"]), bell=lambda: None))
    exporter = Exporter(
        Sampler(backend, with_host=False).sample, with_extras=False, alert_notifier=alerts
    )
    exporter.sample_once()
    exporter.sample_once()
    alerts.close()
    latest = exporter.latest()
    assert exporter.samples_taken == 2 and latest.error is None
    assert any(a.rule == "thermal_throttle" and a.gpu == 0 for a in latest.alerts or [])
    assert alerts.failed == 1 and alerts.sent == 0  # raised once, tried once, logged
