"""Where gpustation keeps its files.

platformdirs decides (so ``XDG_CONFIG_HOME`` and friends apply on Linux); each
directory can also be set directly with ``GPUSTATION_CONFIG_DIR``,
``GPUSTATION_DATA_DIR`` and ``GPUSTATION_STATE_DIR``.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "gpustation"


def config_dir() -> Path:
    override = os.environ.get("GPUSTATION_CONFIG_DIR")
    return Path(override or platformdirs.user_config_dir(APP, appauthor=False))


def data_dir() -> Path:
    override = os.environ.get("GPUSTATION_DATA_DIR")
    return Path(override or platformdirs.user_data_dir(APP, appauthor=False))


def state_dir() -> Path:
    override = os.environ.get("GPUSTATION_STATE_DIR")
    return Path(override or platformdirs.user_state_dir(APP, appauthor=False))


def runs_dir() -> Path:
    return data_dir() / "runs"


def user_run_presets_dir() -> Path:
    return config_dir() / "presets" / "runs"


def user_profiles_dir() -> Path:
    return config_dir() / "presets" / "profiles"


def package_dir() -> Path:
    return Path(__file__).resolve().parent
