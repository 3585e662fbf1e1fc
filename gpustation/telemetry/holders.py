"""Who holds the GPUs' device nodes open, from ``/proc`` (Linux only).

NVML lists the processes that have a context on a GPU; a process can hold
``/dev/nvidia<minor>`` open without one (a CUDA process in another container
or PID namespace, one stuck while exiting, a tool that opened the device).
:func:`device_node_holders` finds them by reading each process's open files.
Another user's processes cannot be read without root: they are skipped
quietly, so the answer is "the holders this user may see".
"""

from __future__ import annotations

import os

_PREFIX = "/dev/nvidia"


def device_node_holders(
    proc_root: str = "/proc", skip: int | None = None
) -> dict[int, set[int]] | None:
    """minor number -> the pids holding ``/dev/nvidia<minor>`` open.

    ``skip`` is a pid to leave out (this process: NVML opens the nodes
    itself). ``None`` when ``proc_root`` cannot be listed (not Linux).
    """
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return None
    found: dict[int, set[int]] = {}
    for name in entries:
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == skip:
            continue
        fd_dir = f"{proc_root}/{name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # another user's process, or gone
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith(_PREFIX):
                minor = target[len(_PREFIX) :]
                if minor.isdigit():
                    found.setdefault(int(minor), set()).add(pid)
    return found
