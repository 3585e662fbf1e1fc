"""What the ``power``, ``fan`` and ``profile`` commands share."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpustation.telemetry.backend import (
    Backend,
    add_gpu_options,
    backend_from_args,
    parse_gpu_list,
    select_gpus,
)


def add_control_options(parser: argparse.ArgumentParser, dry_run: bool = True) -> None:
    """``--gpus``/``--simulate``/``--sim-card`` and, for changes, ``--dry-run``."""
    add_gpu_options(parser)
    if dry_run:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="check against the cards and print what would be set; change nothing",
        )


def add_controller_options(parser: argparse.ArgumentParser) -> None:
    """Options of the fan-curve controller loop."""
    parser.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help="poll every SECONDS instead of the profile's poll_interval_s",
    )
    parser.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="stop after SECONDS (fans go back to automatic)",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="poll once, then hand the fans back (a quick check of the whole path)",
    )


@contextmanager
def open_gpus(args: argparse.Namespace) -> Iterator[tuple[Backend, list[int]]]:
    """The backend the options ask for and the GPUs selected with ``--gpus``."""
    wanted = parse_gpu_list(getattr(args, "gpus", None))
    backend = backend_from_args(args)
    try:
        yield backend, select_gpus(backend, wanted)
    finally:
        backend.close()


def simulated_banner(backend: Backend) -> None:
    """Every output built from simulated cards says so."""
    if backend.simulated:
        print("SIMULATED GPUs (no hardware is changed)")
        if backend.note:
            print(backend.note)


def print_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")


def command_text(*parts: object) -> str:
    """How a change is attributed in the journal: the command that made it."""
    return "gpustation " + " ".join(str(p) for p in parts if p not in (None, ""))


def gpus_suffix(args: argparse.Namespace) -> str:
    gpus = getattr(args, "gpus", None)
    return f"--gpus {gpus}" if gpus else ""


def check_interval(args: argparse.Namespace) -> None:
    from gpustation.errors import UsageError

    interval = getattr(args, "interval", None)
    if interval is not None and not 0.05 <= interval <= 60:
        raise UsageError(f"--interval: between 0.05 and 60 seconds, got {interval:g}")
    duration = getattr(args, "duration", None)
    if duration is not None and duration <= 0:
        raise UsageError(f"--duration: a number of seconds above 0, got {duration:g}")
