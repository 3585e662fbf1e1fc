"""ENOSPC on demand, for the full-disk test where no tmpfs can be mounted.

On this directory's PYTHONPATH, every Python process (the supervisor among
them) refuses to create or extend files under ``$GPUSTATION_TEST_ENOSPC_DIR``
while the file ``$GPUSTATION_TEST_ENOSPC_FLAG`` exists, as a full disk does.
Overwriting an existing file in place (``os.open`` without ``O_CREAT``, then
``os.pwrite``) still works, as it does on a full disk.
"""

import builtins
import errno
import io
import os

_DIR = os.environ.get("GPUSTATION_TEST_ENOSPC_DIR")
_FLAG = os.environ.get("GPUSTATION_TEST_ENOSPC_FLAG")


def _full(path: object) -> bool:
    if not _DIR or not _FLAG or not os.path.exists(_FLAG):
        return False
    if not isinstance(path, (str, bytes, os.PathLike)):
        return False  # a file descriptor
    target = os.path.abspath(os.fsdecode(path))
    return target.startswith(os.path.abspath(_DIR) + os.sep)


def _refuse(path: object) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


if _DIR and _FLAG:
    _open = builtins.open
    _os_open = os.open
    _replace = os.replace

    def open(file, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        if any(c in mode for c in "wax+") and _full(file):
            raise _refuse(file)
        return _open(file, mode, *args, **kwargs)

    def os_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if flags & (os.O_CREAT | os.O_APPEND | os.O_TRUNC) and _full(path):
            raise _refuse(path)
        return _os_open(path, flags, *args, **kwargs)

    def replace(src, dst, *args, **kwargs):  # type: ignore[no-untyped-def]
        if _full(dst):
            raise _refuse(dst)
        return _replace(src, dst, *args, **kwargs)

    builtins.open = open
    io.open = open
    os.open = os_open
    os.replace = replace
