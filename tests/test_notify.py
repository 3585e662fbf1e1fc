"""Notifications reach a real HTTP endpoint through apprise's json://, and a
failure to notify is reported, never raised."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpustation.errors import UsageError
from gpustation.notify import (
    AlertNotifier,
    Notifier,
    NotifyConfig,
    alert_notifier_from_config,
    load_notify_config,
)
from gpustation.telemetry.alerts import Alert
from tests.receiver import Receiver


def test_a_notification_reaches_the_endpoint(receiver: Receiver) -> None:
    rings: list[int] = []
    config = NotifyConfig(urls=[receiver.url], bell=True)
    notifier = Notifier(config, bell=lambda: rings.append(1))
    assert notifier.send("run_failed", "run 3f2a failed", "loss 1.234, 12 min, 0.31 kWh")
    assert receiver.got.wait(30)
    (message,) = receiver.messages
    assert message["title"] == "run 3f2a failed" and "0.31 kWh" in message["message"]
    assert rings == [1]


def test_events_not_chosen_are_not_sent(receiver: Receiver) -> None:
    config = NotifyConfig(urls=[receiver.url], events=frozenset({"gpu_lost"}))
    notifier = Notifier(config, bell=lambda: None)
    assert not notifier.send("run_finished", "t", "b")
    assert notifier.send("gpu_lost", "GPU 1 lost", "b")
    assert receiver.got.wait(30) and len(receiver.messages) == 1


def test_a_failure_to_notify_is_reported_never_raised() -> None:
    # nothing listens on port 1 of loopback
    notifier = Notifier(NotifyConfig(urls=["json://127.0.0.1:1"]), bell=lambda: None)
    assert notifier.send("run_finished", "t", "b") is False
    assert notifier.last_error
    bad = Notifier(NotifyConfig(urls=["notascheme://x"]), bell=lambda: None)
    assert bad.send("run_finished", "t", "b") is False and "cannot use the URL" in (
        bad.last_error or ""
    )


def test_a_bad_notify_table_names_every_problem(gpustation_dirs: dict[str, Path]) -> None:
    (gpustation_dirs["config"] / "config.toml").write_text(
        '[notify]\nurls = "ntfy://x"\nevents = ["run_done"]\nbell = "yes"\nextra = 1\n'
    )
    with pytest.raises(UsageError) as err:
        load_notify_config()
    text = str(err.value)
    assert all(w in text for w in ("urls", "run_done", "bell", "extra"))


def test_a_run_that_ends_notifies_with_its_loss_duration_energy_and_cost(
    receiver: Receiver, gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    from tests.conftest import child_env, gpustation_cmd

    (gpustation_dirs["config"] / "config.toml").write_text(
        f'[notify]\nurls = ["json://127.0.0.1:{receiver.port}"]\nbell = false\n'
        '[energy]\nprice_per_kwh = 0.30\ncurrency = "EUR"\n'
    )
    code = (
        "from gpustation.runs.metrics import MetricsWriter\n"
        "import sys\n"
        "with MetricsWriter.from_env() as m:\n"
        "    m.log(step=1, loss=1.25)\n"
        "sys.exit(3)\n"
    )
    result = subprocess.run(
        gpustation_cmd("run", "--name", "noisy", "--", sys.executable, "-c", code),
        env=child_env(GPUSTATION_SIMULATE="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert receiver.got.wait(60)
    (message,) = receiver.messages
    assert message["title"] == "gpustation: noisy failed"
    assert "exited with code 3" in message["message"] and "final loss 1.25" in message["message"]


def test_a_notification_that_cannot_be_sent_leaves_the_run_alone(
    gpustation_dirs: dict[str, Path],
) -> None:
    import subprocess
    import sys

    from tests.conftest import child_env, gpustation_cmd

    (gpustation_dirs["config"] / "config.toml").write_text(
        '[notify]\nurls = ["json://127.0.0.1:1"]\nbell = false\n'
    )
    result = subprocess.run(
        gpustation_cmd("run", "--", sys.executable, "-c", "print('ok')"),
        env=child_env(GPUSTATION_SIMULATE="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


# ---- GPU events: one AlertNotifier for the dashboard, serve and record --------------


def _alerts() -> list[Alert]:
    return [
        Alert("thermal_throttle", 0, "GPU 0 is slowing its clocks: too hot", 1.0),
        Alert("power_cap", 0, "GPU 0 is held back by its power limit", 1.0),  # no event
        Alert("gpu_lost", 1, "GPU 1 is lost", 1.0),
        Alert("thermal_throttle", 2, "GPU 2: thermal throttling cleared", 1.0, cleared=True),
    ]


def test_the_alert_notifier_sends_the_chosen_gpu_events(receiver: Receiver) -> None:
    config = NotifyConfig(urls=[receiver.url], events=frozenset({"gpu_hot"}), bell=False)
    alerts = AlertNotifier(Notifier(config))
    assert alerts.take(_alerts(), "box") == ["gpu_hot"]
    alerts.close()
    (message,) = receiver.messages
    assert message["title"] == "gpustation: GPU0 thermal throttle on box"
    assert message["message"] == "GPU 0 is slowing its clocks: too hot"
    assert alerts.sent == 1 and alerts.failed == 0
    assert alerts.take(_alerts(), "box") == []  # closed: nothing more is taken


def test_the_alert_notifier_never_makes_its_caller_wait() -> None:
    release = threading.Event()
    sent: list[str] = []

    class Stuck(Notifier):
        def send(self, event: str, title: str, body: str) -> bool:
            release.wait(60)  # a notification service that does not answer
            sent.append(title)
            return True

    alerts = AlertNotifier(Stuck(NotifyConfig(urls=["json://127.0.0.1:1"])))
    caller = threading.Thread(target=lambda: alerts.take(_alerts(), "box"))
    caller.start()
    caller.join(10)
    assert not caller.is_alive()  # returned while the first message still hangs
    assert sent == []
    release.set()
    alerts.close()
    assert sent == ["gpustation: GPU0 thermal throttle on box", "gpustation: GPU1 LOST on box"]


def test_a_failed_gpu_notification_is_counted_never_raised() -> None:
    alerts = AlertNotifier(Notifier(NotifyConfig(urls=["json://127.0.0.1:1"]), bell=lambda: None))
    assert alerts.take(_alerts()[:1], "box") == ["gpu_hot"]
    alerts.close()
    assert alerts.failed == 1 and alerts.sent == 0 and alerts.notifier.last_error


def test_no_alert_notifier_without_urls(gpustation_dirs: dict[str, Path]) -> None:
    assert alert_notifier_from_config() is None
    (gpustation_dirs["config"] / "config.toml").write_text("[notify]\nbell = true\n")
    assert alert_notifier_from_config() is None
    (gpustation_dirs["config"] / "config.toml").write_text('[notify]\nurls = ["json://x"]\n')
    made = alert_notifier_from_config()
    assert made is not None and made.notifier.config.urls == ["json://x"]


def test_a_url_apprise_cannot_use_leaves_the_others_working_and_is_logged_redacted(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    bad = "mailto://alice:hunter2-horse@"
    notifier = Notifier(NotifyConfig(urls=[bad, receiver.url]), bell=lambda: None)
    with caplog.at_level("WARNING"):
        assert notifier.send("run_failed", "run 3f2a failed", "b")
    assert receiver.got.wait(30) and len(receiver.messages) == 1
    assert "mailto://alice:***@" in caplog.text and "hunter2" not in caplog.text
