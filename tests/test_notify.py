"""Notifications reach a real HTTP endpoint through apprise's json://, and a
failure to notify is reported, never raised."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpustation.errors import UsageError
from gpustation.notify import Notifier, NotifyConfig, load_notify_config


class Receiver:
    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.got = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                receiver.messages.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()
                receiver.got.set()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def test_a_notification_reaches_the_endpoint(receiver: Receiver) -> None:
    rings: list[int] = []
    config = NotifyConfig(urls=[f"json://127.0.0.1:{receiver.port}"], bell=True)
    notifier = Notifier(config, bell=lambda: rings.append(1))
    assert notifier.send("run_failed", "run 3f2a failed", "loss 1.234, 12 min, 0.31 kWh")
    assert receiver.got.wait(30)
    (message,) = receiver.messages
    assert message["title"] == "run 3f2a failed" and "0.31 kWh" in message["message"]
    assert rings == [1]


def test_events_not_chosen_are_not_sent(receiver: Receiver) -> None:
    config = NotifyConfig(
        urls=[f"json://127.0.0.1:{receiver.port}"], events=frozenset({"gpu_lost"})
    )
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
