"""Root only where the card needs it: under sudo, gpustation acts as the user who ran it.

``sudo gpustation ...`` runs as root, with ``SUDO_UID``/``SUDO_GID`` naming
the invoking user. As a command starts, :func:`drop` makes that user the
process's effective identity (groups, gid, uid) and keeps root only as its
real uid: every file it writes in the user's directories (``runs.db``, run
directories, the control journal, sweeps) is the user's, and every file it
reads (presets, profiles, config) it reads with the user's rights.
:func:`as_root` takes root back for the length of one driver call (an NVML
setter: the driver checks the caller's effective uid at each call, and
starts for any user). A child starts as the user for good
(:func:`child_kwargs`): a run's supervisor and everything under it never hold
root. Plain root, with no invoking user, stays root (and its runs say so).
"""

from __future__ import annotations

import functools
import os
import pwd
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from gpustation.errors import GpustationError, UsageError


# A NamedTuple, not a dataclass: every command imports this module, and a
# snapshot on real GPUs does without dataclasses' import.
class User(NamedTuple):
    """The user gpustation acts for under sudo."""

    uid: int
    gid: int
    name: str
    home: str | None
    groups: tuple[int, ...]


def invoking_user() -> User | None:
    """The user who ran ``sudo gpustation``; None unless the real uid is root and
    ``SUDO_UID`` names someone else (UsageError when it is not a uid)."""
    if os.getuid() != 0:
        return None
    raw_uid = os.environ.get("SUDO_UID", "").strip()
    if not raw_uid:
        return None
    return _user(raw_uid, os.environ.get("SUDO_GID", "").strip(), os.environ.get("SUDO_USER", ""))


@functools.lru_cache(maxsize=8)
def _user(raw_uid: str, raw_gid: str, sudo_user: str) -> User | None:
    for var, raw in (("SUDO_UID", raw_uid), ("SUDO_GID", raw_gid)):
        if raw and not raw.isdigit():
            raise UsageError(
                f"{var}={raw!r}: not a numeric id; sudo sets it to the invoking user's. "
                f"Unset {var} to run as root, or run gpustation through sudo"
            )
    uid = int(raw_uid)
    if uid == 0:
        return None
    try:
        entry: pwd.struct_passwd | None = pwd.getpwuid(uid)
    except KeyError:
        entry = None  # a uid with no account: its own id, and no home of its own
    gid = int(raw_gid) if raw_gid else (entry.pw_gid if entry else uid)
    name = entry.pw_name if entry else (sudo_user or str(uid))
    groups: list[int] = [gid]
    if entry is not None:
        try:
            groups = os.getgrouplist(entry.pw_name, gid)
        except OSError:
            pass
    return User(uid, gid, name, entry.pw_dir if entry else None, tuple(dict.fromkeys(groups)))


def _roots_home() -> str:
    try:
        return pwd.getpwuid(0).pw_dir
    except KeyError:
        return "/root"


def home() -> str:
    """The home directory gpustation's files go under: the invoking user's when
    ``HOME`` is root's (sudo resets it unless told to keep it), else ``~``."""
    current = os.environ.get("HOME", "")
    user = invoking_user()
    roots = not current or os.path.realpath(current) == os.path.realpath(_roots_home())
    if user is not None and user.home and roots:
        return user.home
    return os.path.expanduser("~")


_lock = threading.RLock()
_state: dict[str, Any] = {"dropped": None, "depth": 0}


def drop() -> User | None:
    """Act as the invoking user from now on (root stays the real uid, for :func:`as_root`).

    Called once as a command starts; nothing happens without an invoking user.
    """
    user = invoking_user()
    if user is None or _state["dropped"] is not None:
        return user
    where = os.environ.get("HOME")
    user_home = home()
    try:
        if os.geteuid() != 0:
            os.seteuid(0)  # started by a gpustation that had already dropped
        os.setgroups(list(user.groups))
        os.setegid(user.gid)
        os.seteuid(user.uid)
    except OSError as err:
        raise GpustationError(
            f"cannot act as the invoking user {user.name} (uid {user.uid}): "
            f"{err.strerror or err}; run gpustation without sudo, or unset SUDO_UID"
        ) from None
    _state["dropped"] = user
    # The children (the user's own programs among them) find the user's home.
    if user_home != where:
        os.environ["HOME"] = user_home
    os.environ["USER"] = os.environ["LOGNAME"] = user.name
    return user


def dropped() -> User | None:
    """The user this process acts as after :func:`drop`, else None."""
    user: User | None = _state["dropped"]
    return user


@contextmanager
def as_root() -> Iterator[None]:
    """Root for the length of the block (a driver call); nothing changes unless dropped.

    The effective uid is the whole process's: the block is kept to the one call,
    and blocks on several threads take turns.
    """
    user = dropped()
    if user is None:
        yield
        return
    with _lock:
        if _state["depth"] == 0:
            os.seteuid(0)
        _state["depth"] += 1
        try:
            yield
        finally:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                os.seteuid(user.uid)


def can_be_root() -> bool:
    """Root now, or for a driver call through :func:`as_root`."""
    return os.geteuid() == 0 or dropped() is not None


def child_kwargs() -> dict[str, Any]:
    """``subprocess.Popen`` keywords that start a child as the invoking user, for good.

    Empty without one. The child sets its groups, gid and uid before it
    execs, so nothing of it, nor of what it starts, holds root.
    """
    user = invoking_user()
    if user is None:
        return {}
    kwargs: dict[str, Any] = {"user": user.uid, "group": user.gid}
    if os.geteuid() == 0:
        # once dropped the groups are the user's already, and only root may set them
        kwargs["extra_groups"] = list(user.groups)
    return kwargs


def run_user() -> dict[str, Any]:
    """Who a run started now runs as, for its ``run.json``."""
    user = invoking_user()
    if user is not None:
        return {"uid": user.uid, "gid": user.gid, "name": user.name, "sudo": True}
    uid = os.geteuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return {"uid": uid, "gid": os.getegid(), "name": name, "sudo": False}


def user_text(user: object) -> str | None:
    """``alice (uid 1000, through sudo)``; ``root (uid 0, no invoking user)``."""
    if not isinstance(user, dict) or not isinstance(user.get("uid"), int):
        return None
    uid = user["uid"]
    name = str(user.get("name") or uid)
    if user.get("sudo"):
        how = ", through sudo"
    elif uid == 0:
        how = ", no invoking user"
    else:
        how = ""
    return f"{name} (uid {uid}{how})"
