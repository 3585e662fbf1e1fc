"""``gpustation record``: a flight recording of the GPUs, for ``gpustation replay``.

Snapshots go to zstd-compressed JSON Lines (:mod:`gpustation.telemetry.recording.recorder`),
rotated to stay under ``--max-size``. Ctrl-C ends it with 130, SIGTERM with 0;
either way the open frame is finished. A failed write (a full disk) ends it
with 1 and says what the recording holds. With ``[notify]`` configured, the
alert rules run over every snapshot and the GPU events go out as they start.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from gpustation.commands.options import add_gpu_options, backend_from_args
from gpustation.errors import UsageError
from gpustation.notify import alert_notifier_from_config, notify_warnings
from gpustation.telemetry.alerts import AlertLog, idle_rule_or_default
from gpustation.telemetry.backend import parse_gpu_list
from gpustation.telemetry.recording.recorder import Recorder, RecordError, parse_size
from gpustation.telemetry.sampler import Sampler

if TYPE_CHECKING:
    from gpustation.notify import AlertNotifier
    from gpustation.telemetry.model import Snapshot

log = logging.getLogger(__name__)

#: without a terminal, a progress line this often
PROGRESS_EVERY_S = 60.0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "record",
        help="record the GPUs' telemetry to a compressed file for `gpustation replay`",
        description="Record a snapshot every --interval seconds to FILE as zstd-compressed "
        "JSON Lines (zstdcat FILE reads it). FILE is rotated to FILE.1, FILE.2 ... so that "
        "all of them stay under --max-size. A crash loses at most the last few seconds. "
        "Ctrl-C or SIGTERM ends the recording.",
    )
    add_gpu_options(p)
    p.add_argument("file", type=Path, metavar="FILE", help="the recording, e.g. gpus.jsonl.zst")
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between snapshots (0.05 to 3600, default 1)",
    )
    p.add_argument(
        "--max-size",
        default="200MB",
        metavar="SIZE",
        help="cap on FILE and its rotated files together, e.g. 50MB, 1GiB (default 200MB)",
    )
    p.add_argument("--duration", type=float, metavar="SECONDS", help="stop after SECONDS (exit 0)")


def check_file(path: Path) -> None:
    """Refuse a FILE that cannot be written, before any GPU is opened (exit 2)."""
    if path.is_dir():
        raise UsageError(f"FILE {path}: is a directory")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"FILE {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"FILE {path}: not writable (permission denied)")


def check_interval(value: float, what: str = "--interval") -> float:
    if not (math.isfinite(value) and 0.05 <= value <= 3600):
        raise UsageError(f"{what}: between 0.05 and 3600 seconds, got {value:g}")
    return value


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.1f} MiB"


def run(args: argparse.Namespace) -> int:
    interval = check_interval(args.interval)
    max_size = parse_size(args.max_size)
    if args.duration is not None and not (math.isfinite(args.duration) and args.duration > 0):
        raise UsageError(f"--duration: a number of seconds above 0, got {args.duration:g}")
    path: Path = args.file
    check_file(path)
    wanted = parse_gpu_list(getattr(args, "gpus", None))
    try:
        recorder = Recorder(path, max_size=max_size, interval_s=0.0)
    except RecordError as err:
        raise UsageError(f"FILE {err}") from None
    notify_alerts = _alert_notifying()
    stop = threading.Event()

    def _on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, _on_term)
    tty = sys.stderr.isatty()
    try:
        backend = backend_from_args(args)
    except BaseException:
        recorder.close()
        signal.signal(signal.SIGTERM, previous)
        raise
    failed = False
    try:
        sampler = Sampler(backend, gpus=wanted)
        note = " (SIMULATED GPUs)" if backend.simulated else ""
        print(
            f"gpustation: recording {len(sampler.gpus)} GPU(s){note} to {path} every "
            f"{interval:g} s, at most {args.max_size}; Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        started = time.monotonic()
        next_at = started
        last_progress = started
        while not stop.is_set():
            snap = sampler.sample()
            recorder.add(snap)
            if notify_alerts is not None:
                notify_alerts(snap)
            now = time.monotonic()
            if tty:
                line = f"\r{recorder.samples} samples, {_kib(recorder.size)}"
                sys.stderr.write(line)
                sys.stderr.flush()
            elif now - last_progress >= PROGRESS_EVERY_S:
                last_progress = now
                print(
                    f"gpustation: {recorder.samples} samples, {_kib(recorder.size)}",
                    file=sys.stderr,
                    flush=True,
                )
            if args.duration is not None and now - started >= args.duration - interval / 2:
                break
            next_at += interval
            delay = next_at - time.monotonic()
            if delay <= 0:
                next_at = time.monotonic()  # a late sample is not made up for
            elif stop.wait(delay):
                break
        return 0
    except RecordError:
        failed = True
        raise  # the message says what was kept; exit 1
    finally:
        signal.signal(signal.SIGTERM, previous)
        try:
            recorder.close()  # a last write that fails is an error too (exit 1)
        finally:
            backend.close()
            if notify_alerts is not None:
                notify_alerts.close()  # a last alert still goes out
            if tty:
                sys.stderr.write("\n")
        if not failed:
            print(
                f"gpustation: recorded {recorder.samples} samples "
                f"({_kib(recorder.size)}) to {path}",
                file=sys.stderr,
                flush=True,
            )


class _AlertsNotified:
    """The alert rules over each recorded snapshot, their GPU events sent as they start."""

    def __init__(self, notifier: AlertNotifier) -> None:
        self.notifier = notifier
        self.alerts = AlertLog(idle=idle_rule_or_default())

    def __call__(self, snap: Snapshot) -> None:
        try:  # never a reason for the recording to stop
            self.notifier.take(self.alerts.update(snap), snap.hostname)
        except Exception as err:
            log.warning("alerts not notified: %s", err)

    def close(self) -> None:
        self.notifier.close()


def _alert_notifying() -> _AlertsNotified | None:
    notifier = alert_notifier_from_config()
    for warning in notify_warnings():
        print(f"gpustation: warning: {warning}", file=sys.stderr, flush=True)
    return _AlertsNotified(notifier) if notifier is not None else None
