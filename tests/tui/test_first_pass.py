"""The dashboard's first pass: the backend opens and the first sample is read
on a thread of its own while the UI is still being imported and built."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpustation.errors import GpustationError
from gpustation.telemetry.backend import Backend
from gpustation.telemetry.model import HostSample
from gpustation.telemetry.registry import open_backend
from gpustation.tui.source import DataSource
from tests.conftest import REPO, child_env


def until(condition: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("condition never held")


def test_the_first_pass_runs_before_it_is_asked_for_and_is_handed_over() -> None:
    opened: list[str] = []

    def factory() -> Backend:
        opened.append(threading.current_thread().name)
        return open_backend(simulate=1, sim_card="h200")

    source = DataSource(factory, host_source=HostSample, hostname="box")
    try:
        source.start_first_pass()
        until(lambda: source.backend is not None)  # nobody has asked for a sample yet
        first = source.sample()
        assert opened == ["gpustation-first-pass"]
        assert [g.index for g in first.snapshot.gpus] == [0]
        assert first.snapshot.gpus[0].temperature_c is not None
        # GPM was read in it: the first screen's full cards show it.
        assert first.snapshot.gpus[0].sm_active_pct is not None
        second = source.sample()  # later passes are the caller's own
        assert second.snapshot.time >= first.snapshot.time and opened == [opened[0]]
    finally:
        source.close()


def test_what_the_first_pass_raised_is_raised_by_the_sample_that_takes_it() -> None:
    def factory() -> Backend:
        raise GpustationError("no driver here")

    source = DataSource(factory, host_source=HostSample)
    source.start_first_pass()
    with pytest.raises(GpustationError, match="no driver here"):
        source.sample()
    with pytest.raises(GpustationError, match="no driver here"):  # and the next opens anew
        source.sample()
    source.close()


#: runs the dashboard command and reports, when its first pass starts, whether
#: the UI (Textual, the app module) has been imported yet; then stops
_PROBE = """
import sys
from gpustation.tui import source

def probe(self, *args, **kwargs):
    ui = sorted(m for m in ("textual", "textual.app", "gpustation.tui.app") if m in sys.modules)
    print("first pass; UI imported:", ui, flush=True)
    raise SystemExit(0)

source.DataSource.start_first_pass = probe
from gpustation.cli import main
main(["--simulate", "1"])
"""


def test_the_dashboard_command_starts_the_first_pass_before_importing_the_ui(
    tmp_path: Any,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=child_env(GPUSTATION_STATE_DIR=str(tmp_path)),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "first pass; UI imported: []", done.stderr


def test_closing_does_not_wait_on_a_first_pass_whose_driver_hangs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpustation.tui import source as source_module

    monkeypatch.setattr(source_module, "FIRST_PASS_CLOSE_S", 0.2)
    release = threading.Event()
    entered = threading.Event()

    def factory() -> Backend:
        entered.set()
        release.wait(30)  # a driver whose start hangs
        return open_backend(simulate=1)

    source = DataSource(factory, host_source=HostSample)
    source.start_first_pass()
    assert entered.wait(10)
    start = time.monotonic()
    source.close()
    assert time.monotonic() - start < 5
    release.set()
    backend = until(lambda: source.backend)  # the pass ends by itself later
    backend.close()
