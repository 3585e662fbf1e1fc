"""Files and directories only their user can read.

A run's directory holds what it was launched with and everything it said
(``run.json``, ``supervisor.log``, ``output.log``); the state directory holds
the run history, the control journal, locks and the simulated machines. None
of it is for the other users of a shared machine, so gpustation creates its
directories ``0700`` and its files ``0600``, whatever the umask. Files that
already exist keep the mode they have; the runs directory, which holds every
run, is made private when an older version left it open.
"""

from __future__ import annotations

import os
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def opener(path: str | os.PathLike[str], flags: int) -> int:
    """For ``open(path, mode, opener=opener)``: a file it creates is ``0600``."""
    return os.open(path, flags, FILE_MODE)


def open_fd(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open`` whose new file is ``0600`` (``O_CLOEXEC`` always)."""
    return os.open(path, flags | os.O_CLOEXEC, FILE_MODE)


def make_dir(path: Path, parents: bool = True) -> None:
    """Create ``path`` when missing; the directory created for it is ``0700``
    (parents made on the way get the umask's mode, like ``mkdir -p -m``)."""
    path.mkdir(parents=parents, exist_ok=True, mode=DIR_MODE)


def tighten(path: Path) -> None:
    """Take the group's and others' access off a directory of ours that an older
    version made with the umask's mode (errors ignored: the directory still works)."""
    try:
        info = path.stat()
        if info.st_uid == os.geteuid() and info.st_mode & 0o077:
            path.chmod(info.st_mode & DIR_MODE)
    except OSError:
        pass


def create(path: str | os.PathLike[str]) -> None:
    """Create an empty ``0600`` file at ``path`` unless one is there (a file
    that a library such as SQLite opens and then keeps the mode of)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE))
    except FileExistsError:
        pass


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (``0600`` when new), as ``Path.write_text`` would."""
    with open(path, "w", encoding="utf-8", opener=opener) as fh:
        fh.write(text)
