"""Fixtures for the fleet and exporter tests: the loopback sshd (tests/conftest.py) set up
for the fleet."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.fleet.sshd import LoopbackSshd

#: A stream command that plays a healthy host without ssh (for in-process tests).
SIM_STREAM = [sys.executable, "-m", "gpustation", "snapshot", "--json", "--watch", "0.3"]


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
