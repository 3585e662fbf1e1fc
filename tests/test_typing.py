"""The whole package type-checks (mypy, configured in pyproject.toml's [tool.mypy])."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    found = str(exe) if exe.exists() else shutil.which(name)
    if not found:
        message = f"{name} is not installed (it comes with the 'test' extra)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)  # CI must run the check, not skip it
        pytest.skip(message)
    return found


# raises=AssertionError: only mypy's findings are expected to fail for now; a
# missing mypy under CI=true still fails the suite.
@pytest.mark.xfail(
    strict=False,
    raises=AssertionError,
    reason="type errors remain in gpustation/telemetry and gpustation/tui; "
    "remove this mark once mypy reports none",
)
def test_package_type_checks() -> None:
    # The files to check come from [tool.mypy] in pyproject.toml: all of gpustation.
    result = subprocess.run([_tool("mypy")], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout
