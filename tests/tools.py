"""The outside tools some tests use (sshd, promtool, tmux, the linters).

Where a tool is missing such a test is skipped on a developer's machine, and
fails under ``CI=true``: CI installs every tool (``.ci/run``), so a missing one
there is a broken install step, not a reason to test less.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(what: str) -> None:
    """Skip (or, under CI, fail) a test whose tool is not installed."""
    if in_ci():
        pytest.fail(f"{what} is not installed, and CI installs it (.ci/run)")
    pytest.skip(f"{what} is not installed")


def tool(name: str, hint: str = "") -> str:
    """The path of command ``name``: beside this Python first (a venv's tools), then PATH."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        missing(f"{name}" + (f" ({hint})" if hint else ""))
    assert found is not None
    return found
