"""Python children that start from a safe path.

``python -m gpustation ...`` and ``python -c ...`` put the working directory
first on ``sys.path``: a ``gpustation/`` (or ``torch/``, ``runpy.py``) left
there would be imported in place of the installed one, by a process that may
hold root. Every Python child gpustation starts has its argv built here:
``-P`` on Python 3.11+, which leaves the working directory (and a script's
own directory) off ``sys.path``; on 3.10 a bootstrap that takes it off before
anything else is imported.

``-P`` is not inherited by the Python processes a child starts in turn
(torchrun's workers run ``python -u -m RUNNER``): :func:`safe_path_env` sets
``PYTHONSAFEPATH`` for those, for gpustation's own runners only, since a
user's script expects its own directory on its path.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping

SAFE_PATH_ENV = "PYTHONSAFEPATH"
#: ``-P`` exists from this version on
SAFE_FLAG_VERSION = (3, 11)

# Before 3.11: drop the '' (the working directory) that -c puts first, before
# any module is looked up, then run the module as -m would (sys.argv[0]
# becomes its file).
_OFF_PATH = "import sys; sys.path[:] = [p for p in sys.path if p]"
_RUN_MODULE = (
    f"{_OFF_PATH}; import runpy; sys.argv = sys.argv[1:]; "
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)
_RUN_CODE = f"{_OFF_PATH}\n"


def has_safe_flag() -> bool:
    return sys.version_info >= SAFE_FLAG_VERSION


def python_argv(*args: str, python: str | None = None, safe_flag: bool | None = None) -> list[str]:
    """``[python, -P, *args]``: a Python child whose working directory is not on its path.

    ``args`` hold one ``-m MODULE`` or ``-c CODE`` (interpreter flags such as
    ``-u`` may come before it) and that program's arguments. ``safe_flag``
    False builds the bootstrap that also works before 3.11 (a node's Python,
    whose version is not known here); None: ``-P`` where this Python has it.
    """
    python = python or sys.executable
    if safe_flag is None:
        safe_flag = has_safe_flag()
    if safe_flag:
        return [python, "-P", *args]
    return [python, *bootstrap_args(args)]


def bootstrap_args(args: tuple[str, ...] | list[str]) -> list[str]:
    """``args`` (``[flags] -m MODULE ...`` or ``[flags] -c CODE ...``) without ``-P``."""
    for i, arg in enumerate(args):
        if arg in ("-m", "-c") and i + 1 < len(args):
            flags, target, rest = list(args[:i]), args[i + 1], list(args[i + 2 :])
            if arg == "-m":
                return [*flags, "-c", _RUN_MODULE, target, *rest]
            return [*flags, "-c", _RUN_CODE + target, *rest]
    raise ValueError(f"a Python child needs -m MODULE or -c CODE, got {list(args)!r}")


def safe_path_env(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """``env`` with ``PYTHONSAFEPATH=1``: every Python process started under it
    leaves its working directory off ``sys.path`` too (3.11+)."""
    env[SAFE_PATH_ENV] = "1"
    return env
