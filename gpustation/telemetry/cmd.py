"""``gpustation snapshot``: one look at the GPUs, as a table or JSON.

Kept light on purpose, since nvidia-smi is what it is compared with: it
imports neither textual, torch, rich nor psutil, and leaves out even the
standard modules it can do without (typing, socket, concurrent.futures,
dataclasses, and argparse for its plain command lines);
``bench/snapshot_trace.py`` shows where its time goes.
"""

from __future__ import annotations

import os
import sys

from gpustation.errors import UsageError
from gpustation.telemetry.backend import (
    add_gpu_options,
    backend_from_args,
    parse_gpu_list,
)

TYPE_CHECKING = False  # typing stays out of a one-shot snapshot
if TYPE_CHECKING:
    import argparse

    from gpustation.telemetry.model import Snapshot


def add_parser(sub: argparse._SubParsersAction) -> None:
    import argparse

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
        default=argparse.SUPPRESS,  # so `gpustation --host A snapshot` keeps A
        metavar="[USER@]HOST",
        help="read these hosts over ssh instead of this machine (repeatable)",
    )
    from gpustation.telemetry.fleet_cli import add_fleet_options

    add_fleet_options(p)


def run(args: argparse.Namespace) -> int:
    if args.watch is not None and not 0.05 <= args.watch <= 3600:
        raise UsageError(f"--watch: between 0.05 and 3600 seconds, got {args.watch:g}")
    hosts = list(getattr(args, "host", []) or [])
    if hosts:
        from gpustation.telemetry.fleet import run_snapshot_fleet

        return run_snapshot_fleet(args, hosts)

    from gpustation.telemetry.sampler import Sampler, ticks

    wanted = parse_gpu_list(getattr(args, "gpus", None))
    one_shot = args.watch is None
    # The table shows neither the slow fields (PCIe throughput, energy, replay
    # counter) nor the topology, so it does not read them: the PCIe throughput
    # alone is a 21 ms driver call. JSON has every field of the model.
    full = bool(args.json)
    if one_shot:
        # The module that prints the snapshot loads while this thread waits
        # for the driver (json brings re: ~2 ms on an H200 machine).
        _import_beside("json" if full else "gpustation.telemetry.table")
    backend = backend_from_args(args, one_shot=one_shot, slow_fields=full)
    backend.read_ecc = full  # nor the ECC counter (~2 ms on its first read)
    try:
        sampler = Sampler(backend, gpus=wanted, slow_interval_s=5.0, with_topology=full)
        if one_shot:
            # JSON reads the slow fields now; a watch reads them on their own
            # cadence, like the dashboard.
            _emit(sampler.sample(slow=full), args.json)
            return 0
        for _ in ticks(args.watch):
            _emit(sampler.sample(slow=None if full else False), args.json, watching=True)
        return 0  # pragma: no cover - ticks only ends by an exception
    except KeyboardInterrupt:
        return 0
    finally:
        backend.close()


def _import_beside(name: str) -> None:
    """Import module ``name`` on a thread of its own; a later import waits for it."""
    import _thread
    import importlib

    _thread.start_new_thread(importlib.import_module, (name,))


def _emit(snap: Snapshot, as_json: bool, watching: bool = False) -> None:
    out = sys.stdout
    if as_json:
        import json

        doc = snap.to_dict()
        out.write(json.dumps(doc, separators=(",", ":")) if watching else json.dumps(doc, indent=2))
        out.write("\n")
        out.flush()
        return
    from gpustation.telemetry.table import render_snapshot

    tty = out.isatty()
    color = tty and not os.environ.get("NO_COLOR")
    if watching and tty:
        out.write("\x1b[H\x1b[2J")  # clear the screen, like watch(1)
    out.write(render_snapshot(snap, color=color))
    out.write("\n\n" if watching and not tty else "\n")
    out.flush()
