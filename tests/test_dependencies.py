"""The dependency floors leave out the releases with published advisories, and
what is installed here stands above them."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

#: package -> (the last release with a published advisory, the first without)
ADVISORIES = {
    "aiohttp": ("3.14.2", "3.14.3"),  # GHSA-cq5v-8q36-5273: C response parser heap read
    "torch": ("2.5.1", "2.6.0"),  # CVE-2025-32434: torch.load(weights_only=True) runs code
}


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines += extra
    found = {}
    for line in lines:
        req = Requirement(line)
        if req.name != "gpustation":
            found[req.name] = req
    return found


@pytest.mark.parametrize("name", sorted(ADVISORIES))
def test_the_floor_leaves_out_the_releases_with_advisories(name: str) -> None:
    req = _requirements()[name]
    last_bad, first_good = ADVISORIES[name]
    assert not req.specifier.contains(Version(last_bad), prereleases=True), req
    assert req.specifier.contains(Version(first_good)), req


@pytest.mark.parametrize("name", sorted(ADVISORIES))
def test_the_installed_release_is_above_the_floor(name: str) -> None:
    try:
        installed = version(name)
    except PackageNotFoundError:
        pytest.skip(f"{name} is not installed")
    # a local build tag (+cpu) is not part of the release
    assert _requirements()[name].specifier.contains(Version(installed).public, prereleases=True)
