"""``gpustation snapshot``: one look at the GPUs, as a table or JSON.

Kept light on purpose: it imports neither textual nor torch, and the JSON path
does not even import rich.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from gpustation.errors import UsageError
from gpustation.telemetry.backend import (
    add_gpu_options,
    backend_from_args,
    parse_gpu_list,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "snapshot",
        help="print the GPUs' state once (or every N seconds) as a table or JSON",
        description="Print the state of the GPUs, the host and the GPU processes. "
        "Works without a terminal (pipes, ssh, cron).",
    )
    add_gpu_options(p)
    p.add_argument("--json", action="store_true", help="print one gpustation.snapshot/1 document")
    p.add_argument(
        "--watch",
        type=float,
        metavar="SECONDS",
        help="repeat every SECONDS; with --json, one document per line (JSON Lines)",
    )
    p.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="[USER@]HOST",
        help="read these hosts over ssh instead of this machine (repeatable)",
    )


def _json_line(snap_dict: dict) -> str:
    return json.dumps(snap_dict, separators=(",", ":"))


def run(args: argparse.Namespace) -> int:
    if args.watch is not None and not 0.05 <= args.watch <= 3600:
        raise UsageError(f"--watch: between 0.05 and 3600 seconds, got {args.watch:g}")
    hosts = list(getattr(args, "host", []) or [])
    if hosts:
        from gpustation.telemetry.fleet import run_snapshot_fleet

        return run_snapshot_fleet(args, hosts)

    from gpustation.telemetry.sampler import Sampler

    wanted = parse_gpu_list(getattr(args, "gpus", None))
    backend = backend_from_args(args)
    try:
        # A one-shot read takes the slow fields too; a watch reads them on their
        # own cadence, like the dashboard.
        sampler = Sampler(backend, gpus=wanted, slow_interval_s=5.0)
        if args.watch is None:
            _emit(sampler.sample(slow=True), args.json)
            return 0
        interval = args.watch
        next_at = time.monotonic()
        while True:
            _emit(sampler.sample(), args.json, watching=True)
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.monotonic()
    except KeyboardInterrupt:
        return 0
    finally:
        backend.close()


_console = None


def _emit(snap, as_json: bool, watching: bool = False) -> None:  # type: ignore[no-untyped-def]
    global _console
    if as_json:
        sys.stdout.write(
            _json_line(snap.to_dict()) if watching else json.dumps(snap.to_dict(), indent=2)
        )
        sys.stdout.write("\n")
        sys.stdout.flush()
        return
    from rich.console import Console

    from gpustation.telemetry.table import render_snapshot

    if _console is None:
        _console = Console(highlight=False, soft_wrap=False)
        if not _console.is_terminal:
            # No terminal: keep lines whole rather than wrapping at 80 columns.
            _console.width = max(_console.width, 160)
    if watching and _console.is_terminal:
        _console.clear()
    _console.print(render_snapshot(snap))
    if watching and not _console.is_terminal:
        _console.print()
    sys.stdout.flush()
