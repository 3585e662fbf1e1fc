"""Where gpustation keeps its files.

platformdirs decides (so ``XDG_CONFIG_HOME`` and friends apply on Linux); each
directory can also be set directly with ``GPUSTATION_CONFIG_DIR``,
``GPUSTATION_DATA_DIR`` and ``GPUSTATION_STATE_DIR``.
"""

from __future__ import annotations

import os
from pathlib import Path

APP = "gpustation"


def _dir(env: str, kind: str) -> Path:
    override = os.environ.get(env)
    if override:
        return Path(override)
    import platformdirs

    getter = {
        "config": platformdirs.user_config_dir,
        "data": platformdirs.user_data_dir,
        "state": platformdirs.user_state_dir,
    }[kind]
    return Path(getter(APP, appauthor=False))


def config_dir() -> Path:
    return _dir("GPUSTATION_CONFIG_DIR", "config")


def data_dir() -> Path:
    return _dir("GPUSTATION_DATA_DIR", "data")


def state_dir() -> Path:
    return _dir("GPUSTATION_STATE_DIR", "state")


def runs_dir() -> Path:
    return data_dir() / "runs"


def user_run_presets_dir() -> Path:
    return config_dir() / "presets" / "runs"


def user_profiles_dir() -> Path:
    return config_dir() / "presets" / "profiles"


def package_dir() -> Path:
    return Path(__file__).resolve().parent
