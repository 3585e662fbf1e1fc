"""Every test runs with its own config, data and state directories."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def gpustation_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    dirs = {}
    for kind in ("config", "data", "state"):
        d = tmp_path / f"gs-{kind}"
        d.mkdir()
        monkeypatch.setenv(f"GPUSTATION_{kind.upper()}_DIR", str(d))
        dirs[kind] = d
    for var in ("GPUSTATION_SIMULATE", "GPUSTATION_SIM_CARD", "GPUSTATION_SIM_SEED"):
        monkeypatch.delenv(var, raising=False)
    # Every process a test starts (a run's supervisor and its child included)
    # imports this checkout's code, never an installed copy of an older one.
    monkeypatch.setenv("PYTHONPATH", child_env()["PYTHONPATH"])
    return dirs


def gpustation_cmd(*args: str) -> list[str]:
    """argv that runs the checked-out gpustation CLI in a child process."""
    return [sys.executable, "-m", "gpustation", *args]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env
