"""Where gpustation keeps its files.

On Linux the XDG base directory rules (``XDG_CONFIG_HOME``, ``XDG_DATA_HOME``,
``XDG_STATE_HOME``, else ``~/.config``, ``~/.local/share``,
``~/.local/state``) are applied here directly, as platformdirs applies them;
elsewhere platformdirs decides. Importing platformdirs on Linux pulls in
tempfile and random, a measurable share of a one-shot ``gpustation
snapshot`` (bench/RESULTS.md). Each directory can also be set directly with
``GPUSTATION_CONFIG_DIR``, ``GPUSTATION_DATA_DIR`` and
``GPUSTATION_STATE_DIR``. Under sudo, ``~`` is the invoking user's home when
``HOME`` is root's (:func:`gpustation.privs.home`): the user's files stay theirs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpustation.errors import UsageError
from gpustation.privs import home

APP = "gpustation"

_XDG = {
    "config": ("XDG_CONFIG_HOME", "~/.config"),
    "data": ("XDG_DATA_HOME", "~/.local/share"),
    "state": ("XDG_STATE_HOME", "~/.local/state"),
}


def _user_dir(kind: str) -> Path:
    if sys.platform.startswith("linux"):
        var, default = _XDG[kind]
        base = os.environ.get(var, "").strip()
        # a relative XDG path is invalid by the specification, and ignored
        if not os.path.isabs(base):
            base = os.path.join(home(), default.removeprefix("~/"))
        return Path(base) / APP
    # platform: only off Linux
    import platformdirs

    getter = {
        "config": platformdirs.user_config_dir,
        "data": platformdirs.user_data_dir,
        "state": platformdirs.user_state_dir,
    }[kind]
    return Path(getter(APP, appauthor=False))


def config_dir() -> Path:
    override = os.environ.get("GPUSTATION_CONFIG_DIR")
    return Path(override) if override else _user_dir("config")


def data_dir() -> Path:
    override = os.environ.get("GPUSTATION_DATA_DIR")
    return Path(override) if override else _user_dir("data")


def state_dir() -> Path:
    override = os.environ.get("GPUSTATION_STATE_DIR")
    return Path(override) if override else _user_dir("state")


def runs_dir() -> Path:
    return data_dir() / "runs"


def user_run_presets_dir() -> Path:
    return config_dir() / "presets" / "runs"


def user_profiles_dir() -> Path:
    return config_dir() / "presets" / "profiles"


def package_dir() -> Path:
    return Path(__file__).resolve().parent


_EFFECTIVE = os.access in os.supports_effective_ids


def _owner_hint(path: Path) -> str:
    """How to take back a directory another user owns (root's, left by an older ``sudo``)."""
    try:
        owner = path.stat().st_uid
    except OSError:
        return ""
    me = os.geteuid()
    if owner == me:
        return ""
    # platform: POSIX only
    import pwd

    try:
        name = pwd.getpwuid(me).pw_name
    except KeyError:
        name = str(me)
    return f" (it belongs to uid {owner}; `sudo chown -R {name} {path}` gives it back)"


def writable(path: Path) -> bool:
    """True when ``path``, or the nearest directory above it that exists, can be written."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate.is_dir() and os.access(
                candidate, os.W_OK | os.X_OK, effective_ids=_EFFECTIVE
            )
    return False


def check_writable_dirs(only_read: bool = False) -> None:
    """The data and state directories are directories gpustation can write.

    Checked once as a command starts, so a directory that is a file, cannot be
    created or is read-only is one clear message naming the variable to set
    (exit 2), not a traceback from whichever writer meets it first. A command
    that ``only_read``s starts on a read-only or missing directory (and says
    itself what it cannot keep there); one that is a file is still refused.
    """

    for env, path in (("GPUSTATION_DATA_DIR", data_dir()), ("GPUSTATION_STATE_DIR", state_dir())):
        where = f"{env}={path}" if os.environ.get(env) else f"{path} (set {env} to move it)"
        if path.exists() and not path.is_dir():
            raise UsageError(f"{where}: not a directory")
        if only_read:
            continue
        try:
            # private: the run history, the journal and the runs' files are the user's alone
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as err:
            raise UsageError(f"{where}: cannot be created ({err.strerror or err})") from None
        # the effective ids: under sudo the process writes as the invoking user
        if not os.access(path, os.W_OK | os.X_OK, effective_ids=_EFFECTIVE):
            raise UsageError(f"{where}: not writable{_owner_hint(path)}")
