"""Reading files a user names: presets, profiles, config, state.

A path can name anything: a directory, a FIFO, ``/dev/zero``, a file of many
gigabytes. These readers take regular files only, up to a size that no real
preset, profile or config reaches, and turn every failure into a
:class:`~gpustation.errors.UsageError` that names the file, so a bad path is
exit 2 with a message, never a hang or a traceback.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpustation.errors import UsageError

#: larger than any preset, profile or config file gpustation reads
MAX_TEXT_BYTES = 1 << 20


def read_text(path: Path, what: str, max_bytes: int = MAX_TEXT_BYTES, private: bool = False) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes``; with ``private`` (a
    password, a token) only of a file no other user can read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise UsageError(f"cannot read {what} {path}: {err.strerror or err}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"cannot read {what} {path}: not a regular file")
        if private and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UsageError(
                f"{what}: {path} can be read by other users; "
                f"make it private with `chmod 600 {path}`"
            )
        if info.st_size > max_bytes:
            raise UsageError(
                f"cannot read {what} {path}: {info.st_size} bytes, more than the "
                f"{max_bytes} such a file can be"
            )
        data = os.read(fd, max_bytes + 1)
    except OSError as err:
        raise UsageError(f"cannot read {what} {path}: {err.strerror or err}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UsageError(f"cannot read {what} {path}: larger than {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"cannot read {what} {path}: not UTF-8 text (byte {err.start})") from None
