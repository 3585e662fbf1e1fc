"""Fixtures for the fleet and exporter tests: a real sshd on loopback."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet.sshd import LoopbackSshd, sshd_available
from tests.tools import missing

#: A stream command that plays a healthy host without ssh (for in-process tests).
SIM_STREAM = [sys.executable, "-m", "gpustation", "snapshot", "--json", "--watch", "0.3"]


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSshd]:
    """One sshd for the whole session; each test resets the hosts it uses."""
    if not sshd_available():
        missing("the OpenSSH server (/usr/sbin/sshd; Debian: openssh-server)")
    server = LoopbackSshd(tmp_path_factory.mktemp("sshd"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def ssh_env(sshd: LoopbackSshd, monkeypatch: pytest.MonkeyPatch) -> LoopbackSshd:
    """Point gpustation (in-process and children) at the loopback sshd; hosts start healthy."""
    for name, value in sshd.env().items():
        monkeypatch.setenv(name, value)
    for alias in sshd.aliases:
        sshd.set_mode(alias, "ok")
    return sshd


def sim_env(tmp: Path, count: int = 2) -> dict[str, str]:
    """Environment for a local simulated stream with its own state directory."""
    return {"GPUSTATION_SIMULATE": str(count), "GPUSTATION_STATE_DIR": str(tmp)}
