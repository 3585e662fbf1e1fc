"""Reading files a user or a run can replace: presets, profiles, config, state, a run's files.

A path can name anything: a directory, a FIFO, ``/dev/zero``, a file of many
gigabytes. These readers are the one door to such files: they take regular
files only (opened non-blocking, so a FIFO is refused rather than waited on),
read at most a bounded number of bytes, and turn every failure into a
:class:`~gpustation.errors.UsageError` that names the file, so a bad path is
exit 2 with a message, never a hang or a traceback.

:func:`open_regular` is for readers that follow a file by byte offset (a
tailer, a fold of a whole ``metrics.jsonl``); :func:`read_bytes` reads a
bounded head or tail; :func:`read_text` a whole small file. A file refused
for what it is raises :class:`NotRegularFile`; a reader that goes on without
it says so once with :func:`say_skipped`.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path
from typing import BinaryIO

from gpustation.errors import UsageError

#: larger than any preset, profile or config file gpustation reads
MAX_TEXT_BYTES = 1 << 20


class NotRegularFile(UsageError, OSError):
    """The path is a FIFO, a device, a directory, a socket (or a link where none belongs).

    An OSError too, so a reader that skips unreadable files skips these as well.
    """

    def __init__(self, message: str, path: Path, kind: str, detail: str | None = None) -> None:
        UsageError.__init__(self, message)
        self.path = path
        #: what it is instead: "a FIFO", "a symbolic link" ...
        self.kind = kind
        #: the file and what it is, without what was being done with it
        self.detail = detail or message

    def __str__(self) -> str:
        return str(self.args[0])


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a special file"


def _open_fd(path: Path, what: str, follow: bool) -> int:
    """A descriptor of the regular file ``path``.

    Raises FileNotFoundError, NotRegularFile or another OSError.
    """
    # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer;
    # O_NOFOLLOW: a file that is never a link is not followed to a device.
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow:
            kind = "a symbolic link"
            raise NotRegularFile(f"{what} {path}: {kind}, not a regular file", path, kind) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = _kind(mode)
        raise NotRegularFile(f"{what} {path}: {kind}, not a regular file", path, kind)
    return fd


def open_regular(path: str | os.PathLike[str], what: str, follow: bool = True) -> BinaryIO:
    """Open a regular file for reading by byte offset (a tailer keeps it open).

    Raises FileNotFoundError when it is missing, :class:`NotRegularFile` when it
    is anything but a regular file (with ``follow=False``: a link too), OSError
    otherwise. Reads never block: only regular files get this far.
    """
    fd = _open_fd(Path(path), what, follow)
    return os.fdopen(fd, "rb")


def read_bytes(
    path: str | os.PathLike[str], what: str, max_bytes: int, tail: bool = False, follow: bool = True
) -> bytes:
    """At most ``max_bytes`` of a regular file: its head, or with ``tail`` its end.

    Raises as :func:`open_regular` does.
    """
    with open_regular(path, what, follow=follow) as fh:
        if tail:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - max_bytes))
        return fh.read(max_bytes)


def read_text(
    path: Path,
    what: str,
    max_bytes: int = MAX_TEXT_BYTES,
    private: bool = False,
    follow: bool = True,
) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes``; with ``private`` (a
    password, a token) only of a file no other user can read. A file that is not a
    regular one raises :class:`NotRegularFile`, every other failure UsageError."""
    try:
        fd = _open_fd(path, what, follow)
    except NotRegularFile as err:
        raise NotRegularFile(f"cannot read {err}", path, err.kind, err.detail) from None
    except OSError as err:
        raise UsageError(f"cannot read {what} {path}: {err.strerror or err}") from None
    try:
        info = os.fstat(fd)
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


_SAID: set[str] = set()


def say_skipped(err: NotRegularFile) -> None:
    """Say on stderr, once a process, that a file was left out and why (a dashboard
    reads the same files every few seconds)."""
    message = f"gpustation: skipped {err.detail}"
    if message in _SAID:
        return
    _SAID.add(message)
    try:
        print(message, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # stderr may be gone (a detached supervisor's disk is full)
