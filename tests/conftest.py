"""Every test runs with its own config, data and state directories; the fake pynvml;
one real sshd on loopback for the tests that reach hosts over ssh."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest

from gpustation.telemetry.nvml import deep
from gpustation.telemetry.nvml.query import MISSING
from tests.fleet.sshd import LoopbackSshd, sshd_available
from tests.receiver import Receiver
from tests.tools import missing

REPO = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    # A suite started in the background by a shell without job control (`cmd &`)
    # inherits SIGINT ignored, and so would every gpustation it starts: the tests
    # that send Ctrl-C would then wait for a process that cannot hear it. A handled
    # signal is reset to the default in a child, an ignored one is not.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


_T = TypeVar("_T")


def known(value: _T | None) -> _T:
    """A reading the test's cards or data always give; a missing one fails the test."""
    assert value is not None, "a reading the test relies on is missing"
    return value


@pytest.fixture(autouse=True)
def gpustation_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    dirs = {}
    for kind in ("config", "data", "state"):
        d = tmp_path / f"gs-{kind}"
        d.mkdir()
        monkeypatch.setenv(f"GPUSTATION_{kind.upper()}_DIR", str(d))
        dirs[kind] = d
    # A suite started through sudo must not make an in-process command act as its user.
    for var in ("GPUSTATION_SIMULATE", "GPUSTATION_SIM_CARD", "GPUSTATION_SIM_SEED", "SUDO_UID"):
        monkeypatch.delenv(var, raising=False)
    # Every process a test starts (a run's supervisor and its child included)
    # imports this checkout's code, never an installed copy of an older one.
    monkeypatch.setenv("PYTHONPATH", child_env()["PYTHONPATH"])
    return dirs


def gpustation_cmd(*args: str) -> list[str]:
    """argv that runs the checked-out gpustation CLI in a child process."""
    return [sys.executable, "-m", "gpustation", *args]


def run_gpustation(
    *args: str, timeout: float = 60.0, cwd: Path | None = None, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """Run the checked-out gpustation CLI in a child process to its end, its output captured."""
    return subprocess.run(
        gpustation_cmd(*args),
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=timeout,
        cwd=cwd,
        **kwargs,
    )


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


FAKE_NVML_DIR = REPO / "tests" / "fake_nvml"
#: the XID watcher's own timings, which the fake_nvml fixture shortens
XID_TIMINGS = {"XID_WAIT_MS": deep.XID_WAIT_MS, "XID_CLOSE_GRACE_S": deep.XID_CLOSE_GRACE_S}


def _load_fake() -> ModuleType:
    # Loaded from its file under its own name, so a real nvidia-ml-py imported
    # earlier in the session can never be picked up by mistake.
    name = "gpustation_tests_fake_pynvml"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, FAKE_NVML_DIR / "pynvml.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The fake pynvml, reset to its default RTX 4090 + H200 machine.

    It is also what ``import pynvml`` gives for the length of the test, so
    code that opens the backend itself (``open_backend()``, commands run
    in-process) meets the fake too, never a real GPU.
    """
    monkeypatch.delenv("FAKE_NVML_SCENARIO", raising=False)
    monkeypatch.syspath_prepend(str(FAKE_NVML_DIR))
    fake = _load_fake()
    fake.reset()
    MISSING.clear()  # what an earlier test's driver lacked
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    # Short XID waits, and closing waits for them: a backend closed by a test has
    # ended its watcher before the next test resets the fake (the defaults have
    # their own test).
    monkeypatch.setattr(deep, "XID_WAIT_MS", 50)
    monkeypatch.setattr(deep, "XID_CLOSE_GRACE_S", 10.0)
    yield fake
    fake.reset()
    MISSING.clear()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A loopback endpoint for apprise's json:// notifications."""
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSshd]:
    """One sshd for the whole session (the fleet's and multi-node runs' tests); each
    test resets the hosts it uses."""
    if not sshd_available():
        missing("the OpenSSH server (/usr/sbin/sshd; Debian: openssh-server)")
    server = LoopbackSshd(tmp_path_factory.mktemp("sshd"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
