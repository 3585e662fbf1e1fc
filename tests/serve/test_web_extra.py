"""``gpustation web`` where the web extra is not installed: which one to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import child_env

# the child runs gpustation as if aiohttp_jinja2 were not installed
WITHOUT_JINJA = (
    "import sys; sys.modules['aiohttp_jinja2'] = None; "
    "from gpustation.cli import main; sys.exit(main(sys.argv[1:]))"
)


def test_web_without_its_extra_says_which_to_install_and_exits_2(
    gpustation_dirs: dict[str, Path],
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_JINJA, "web"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'gpustation[web]'" in done.stderr
    assert "aiohttp_jinja2" in done.stderr and "Traceback" not in done.stderr


def test_web_help_names_the_extra(gpustation_dirs: dict[str, Path]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_JINJA, "web", "--help"],
        capture_output=True,
        text=True,
        env=child_env(COLUMNS="200"),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'gpustation[web]'" in " ".join(done.stdout.split())
