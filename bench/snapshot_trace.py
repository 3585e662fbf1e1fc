"""Where the time of a real `gpustation snapshot` process goes, from its spawn.

    python bench/snapshot_trace.py [--runs 15] [-- gpustation snapshot --json]

Runs the installed console script (or the command after ``--``) with a
``sitecustomize`` module put first on ``PYTHONPATH``. That module marks, with
the wall clock, the moment the interpreter reaches ``site``, the imports that
matter, NVML's start (on the early thread, ``T``, and on the main one, ``M``),
the GPU handle, the first live field, the sample, the table and the exit.
The script prints each mark's median offset in ms from the spawn, after one
run not counted, and the median wall time. The marks cost the process a few
ms themselves (the module imports threading and importlib.machinery before
gpustation does), so the offsets run a little late; their order and the
gaps between them are what they are for.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SITECUSTOMIZE = r"""
import os, sys, time, threading
import importlib.machinery as _machinery

_marks = [("site", time.time())]
_out = os.environ["GPUSTATION_TRACE_OUT"]


def mark(name):
    _marks.append((name, time.time()))


def _dump():
    with open(_out, "a") as f:
        f.write(repr(_marks) + "\n")


_real_exit = os._exit


def _exit(code):
    mark("os._exit")
    _dump()
    _real_exit(code)


os._exit = _exit
import atexit

atexit.register(lambda: (mark("interpreter exit"), _dump()))


def _wrap(owner, attr, label):
    fn = getattr(owner, attr, None)
    if fn is None:
        return

    def wrapped(*args, **kwargs):
        side = "M" if threading.current_thread() is threading.main_thread() else "T"
        mark(f"{label} > {side}")
        try:
            return fn(*args, **kwargs)
        finally:
            mark(f"{label} < {side}")

    setattr(owner, attr, wrapped)


def _lite(module):
    for name in ("start_early", "_load_library", "nvmlInit", "nvmlDeviceGetHandleByIndex",
                 "nvmlDeviceGetTemperature", "nvmlDeviceGetPcieThroughput"):
        _wrap(module, name, name)


_PATCH = {
    "gpustation.telemetry.nvml_lite": _lite,
    "gpustation.cli": lambda m: _wrap(m, "build_parser", "build_parser"),
    "gpustation.telemetry.nvml": lambda m: _wrap(m.NvmlBackend, "__init__", "NvmlBackend()"),
    "gpustation.telemetry.sampler": lambda m: _wrap(m.Sampler, "sample", "Sampler.sample"),
    "gpustation.telemetry.table": lambda m: _wrap(m, "render_snapshot", "render_snapshot"),
    "argparse": None,
    "re": None,
    "ctypes": None,
    "json": None,
}


class _Finder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in _PATCH:
            return None
        spec = _machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            mark(f"import {name} >")
            execute(module)
            mark(f"import {name} <")
            if _PATCH[name] is not None:
                _PATCH[name](module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder)
"""


def _first_times(marks: list[tuple[str, float]]) -> dict[str, float]:
    """Each mark's first time (a call made once per GPU marks once per GPU)."""
    first: dict[str, float] = {}
    for name, when in marks:
        first.setdefault(name, when)
    return first


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="default: gpustation snapshot")
    args = ap.parse_args()
    command = [a for a in args.command if a != "--"] or [
        shutil.which("gpustation") or "gpustation",
        "snapshot",
    ]
    with tempfile.TemporaryDirectory() as where:
        with open(os.path.join(where, "sitecustomize.py"), "w") as f:
            f.write(SITECUSTOMIZE)
        out = os.path.join(where, "marks.txt")
        env = dict(os.environ, GPUSTATION_TRACE_OUT=out)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (where, env.get("PYTHONPATH")) if p)
        spawns: list[float] = []
        walls: list[float] = []
        for _ in range(args.runs + 1):
            start = time.time()
            subprocess.run(command, env=env, stdout=subprocess.DEVNULL, check=True)
            walls.append((time.time() - start) * 1e3)
            spawns.append(start)
        with open(out) as f:
            runs = [_first_times(ast.literal_eval(line)) for line in f]
    spawns, walls, runs = spawns[1:], walls[1:], runs[1:]
    print(f"{' '.join(command)}: wall median {statistics.median(walls):.1f} ms")
    # in the order of the first run
    for name in runs[0]:
        offsets = [(r[name] - s) * 1e3 for s, r in zip(spawns, runs, strict=True) if name in r]
        print(f"  {name:48} {statistics.median(offsets):7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
