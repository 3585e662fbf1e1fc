from __future__ import annotations

from pathlib import Path

import platformdirs
import pytest

from gpustation import paths


@pytest.mark.parametrize("xdg", [None, "", "   ", "/srv/xdg", "relative/xdg"])
def test_linux_directories_are_what_platformdirs_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, xdg: str | None
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("GPUSTATION_CONFIG_DIR", "GPUSTATION_DATA_DIR", "GPUSTATION_STATE_DIR"):
        monkeypatch.delenv(var, raising=False)
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        if xdg is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, xdg + var.lower() if xdg.strip() else xdg)
    assert str(paths.config_dir()) == platformdirs.user_config_dir("gpustation", appauthor=False)
    assert str(paths.data_dir()) == platformdirs.user_data_dir("gpustation", appauthor=False)
    assert str(paths.state_dir()) == platformdirs.user_state_dir("gpustation", appauthor=False)


def test_environment_overrides_win(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUSTATION_STATE_DIR", str(tmp_path / "s"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "x"))
    assert paths.state_dir() == tmp_path / "s"
