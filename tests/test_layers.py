"""The layering rules of the package hold (import-linter contracts in pyproject.toml)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.tools import tool

REPO = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    return tool(name, "it comes with the 'test' extra")


def test_import_contracts_are_kept() -> None:
    result = subprocess.run(
        [_tool("lint-imports")], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_code_is_lint_clean_and_formatted() -> None:
    ruff = _tool("ruff")
    paths = ["gpustation", "tests", "bench"]
    check = subprocess.run([ruff, "check", *paths], cwd=REPO, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    fmt = subprocess.run(
        [ruff, "format", "--check", *paths], cwd=REPO, capture_output=True, text=True
    )
    assert fmt.returncode == 0, fmt.stdout
