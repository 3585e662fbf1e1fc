"""The whole package type-checks (mypy, configured in pyproject.toml's [tool.mypy])."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.tools import tool

REPO = Path(__file__).resolve().parent.parent


def test_package_type_checks() -> None:
    # The files to check come from [tool.mypy] in pyproject.toml: all of gpustation.
    result = subprocess.run(
        [tool("mypy", "it comes with the 'test' extra")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout
