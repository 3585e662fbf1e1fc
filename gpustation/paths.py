"""Where gpustation keeps its files.

platformdirs decides (so ``XDG_CONFIG_HOME`` and friends apply on Linux); each
directory can also be set directly with ``GPUSTATION_CONFIG_DIR``,
``GPUSTATION_DATA_DIR`` and ``GPUSTATION_STATE_DIR``.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

APP = "gpustation"

# What platformdirs answers on Linux, where a one-shot ``gpustation snapshot``
# finds its state directory without importing it (or pathlib).
_XDG = {
    "config": ("XDG_CONFIG_HOME", "~/.config"),
    "data": ("XDG_DATA_HOME", "~/.local/share"),
    "state": ("XDG_STATE_HOME", "~/.local/state"),
}


def dir_name(env: str, kind: str) -> str:
    """The directory of ``kind`` (config, data, state) as a string."""
    override = os.environ.get(env)
    if override:
        return override
    if sys.platform.startswith("linux"):
        var, default = _XDG[kind]
        base = os.environ.get(var, "").strip() or os.path.expanduser(default)
        return os.path.join(base, APP)
    import platformdirs

    getter = {
        "config": platformdirs.user_config_dir,
        "data": platformdirs.user_data_dir,
        "state": platformdirs.user_state_dir,
    }[kind]
    return str(getter(APP, appauthor=False))


def _dir(env: str, kind: str) -> Path:
    from pathlib import Path

    return Path(dir_name(env, kind))


def config_dir() -> Path:
    return _dir("GPUSTATION_CONFIG_DIR", "config")


def data_dir() -> Path:
    return _dir("GPUSTATION_DATA_DIR", "data")


def state_dir() -> Path:
    return _dir("GPUSTATION_STATE_DIR", "state")


def state_dir_name() -> str:
    """:func:`state_dir` as a string, for the paths that must not import pathlib."""
    return dir_name("GPUSTATION_STATE_DIR", "state")


def runs_dir() -> Path:
    return data_dir() / "runs"


def user_run_presets_dir() -> Path:
    return config_dir() / "presets" / "runs"


def user_profiles_dir() -> Path:
    return config_dir() / "presets" / "profiles"


def package_dir() -> Path:
    from pathlib import Path

    return Path(__file__).resolve().parent
