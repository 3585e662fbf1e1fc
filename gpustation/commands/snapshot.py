"""``gpustation snapshot``: one look at the GPUs, as a table or JSON.

What the one-shot snapshot does for speed lives here alone: it asks the
backend for a one-shot read (static values from the cache of the last run,
the slow fields only for JSON) and it imports neither textual, torch, rich nor
psutil; ``tests/commands/test_snapshot_imports.py`` states that budget.
"""

from __future__ import annotations

import argparse
import json
import sys

from gpustation import colour, paths
from gpustation.commands import options
from gpustation.commands.options import add_fleet_options, add_gpu_options
from gpustation.errors import UsageError
from gpustation.telemetry.backend import parse_gpu_list
from gpustation.telemetry.host import HostSampler
from gpustation.telemetry.model import Snapshot
from gpustation.telemetry.sampler import Sampler, ticks
from gpustation.telemetry.table import render_snapshot
from gpustation.textsafe import safe


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument(
        "--group",
        choices=["container"],
        help="sum the GPU processes' VRAM and power per container, systemd unit or Slurm job",
    )
    add_fleet_options(p)


def run(args: argparse.Namespace) -> int:
    if args.watch is not None and not 0.05 <= args.watch <= 3600:
        raise UsageError(f"--watch: between 0.05 and 3600 seconds, got {args.watch:g}")
    group = getattr(args, "group", None)
    if group and args.json:
        raise UsageError(
            "--group goes with the table: the JSON names each process's container "
            "(gpus[].processes[].container); leave out --group or --json"
        )
    hosts = list(getattr(args, "host", []) or [])
    prometheus = getattr(args, "prometheus", None)
    if group and (hosts or prometheus):
        raise UsageError("--group sums this machine's processes: leave out --host/--prometheus")
    if prometheus:
        # start-up time: the fleet, only with --prometheus
        from gpustation.commands.fleet import run_snapshot_prometheus

        return run_snapshot_prometheus(args, prometheus)
    if hosts:
        # start-up time: the fleet, only with --host
        from gpustation.commands.fleet import run_snapshot_fleet

        return run_snapshot_fleet(args, hosts)

    # The host's CPU use is measured from here to the end of the first sample:
    # over the time opening the backend and reading the GPUs take anyway.
    host = HostSampler()
    host.prime()

    wanted = parse_gpu_list(getattr(args, "gpus", None))
    one_shot = args.watch is None
    # The table shows neither the slow fields (PCIe throughput, energy, replay
    # counter) nor the topology, so it does not read them: the PCIe throughput
    # is a slow driver call. JSON has every field of the model.
    full = bool(args.json)
    backend = options.backend_from_args(args, one_shot=one_shot)
    if one_shot and not backend.simulated:
        _say_if_cache_read_only()
    backend.read_ecc = full  # nor the ECC counter, whose first read is slow
    # nor the profiling metrics (GPM), which take two samples a moment apart
    backend.read_gpm = full
    try:
        sampler = Sampler(backend, gpus=wanted, slow_interval_s=5.0, with_topology=full, host=host)
        if one_shot:
            # JSON reads the slow fields now; a watch reads them on their own
            # cadence, like the dashboard.
            _emit(sampler.sample(slow=full), args.json, group=group)
            return 0
        for _ in ticks(args.watch):
            snap = sampler.sample(slow=None if full else False)
            _emit(snap, args.json, watching=True, group=group)
        return 0  # pragma: no cover - ticks only ends by an exception
    finally:
        backend.close()


def _say_if_cache_read_only() -> None:
    """A read-only state directory (ProtectHome=read-only, a read-only container)
    cannot keep the static values between snapshots: say so, and read on."""

    state = paths.state_dir()
    if not paths.writable(state):
        print(
            f"gpustation: {state} is read-only: the static values (power limit range, "
            "maximum clocks, thresholds) are not kept between snapshots; each snapshot "
            "reads what is not cached there from the driver",
            file=sys.stderr,
        )


def _emit(snap: Snapshot, as_json: bool, watching: bool = False, group: str | None = None) -> None:
    # start-up time: the journal and lease readers only once a snapshot is printed
    from gpustation.control.drift import mark_drift
    from gpustation.control.lease import left_notes

    mark_drift(snap)  # each GPU's limit_drift, from the control journal
    out = sys.stdout
    # Limits a killed sweep left changed (the control layer's leases; telemetry
    # knows nothing of them).
    left = left_notes([(g.index, g.uuid) for g in snap.gpus], snap.simulated)
    if as_json:
        doc = snap.to_dict()
        for gpu in doc.get("gpus", []):
            if gpu.get("index") in left:
                gpu["limit_note"] = left[gpu["index"]]
        out.write(json.dumps(doc, separators=(",", ":")) if watching else json.dumps(doc, indent=2))
        out.write("\n")
        out.flush()
        return

    tty = out.isatty()
    color = colour.wanted(out)
    if watching and tty:
        out.write("\x1b[H\x1b[2J")  # clear the screen, like watch(1)
    out.write(render_snapshot(snap, color=color, group=group))
    out.write("\n")
    if any("manual" in g.fan_control for g in snap.gpus):
        # start-up time: the fan control (dataclasses), only for the table
        from gpustation.control.fans import UNATTENDED_HINT, unattended_manual_fans

        for index, fans in unattended_manual_fans(snap.gpus, snap.simulated).items():
            which = ", ".join(map(str, fans))
            out.write(
                f"WARNING: GPU {index} fan {which} on manual control with no fan controller "
                f"running: they will not follow the temperature ({UNATTENDED_HINT})\n"
            )
    for gpu in snap.gpus:
        if gpu.limit_drift:
            out.write(safe(f"WARNING: GPU {gpu.index}: {gpu.limit_drift}") + "\n")
    for index, note in sorted(left.items()):
        out.write(safe(f"WARNING: GPU {index}: {note}") + "\n")
    out.write("\n" if watching and not tty else "")
    out.flush()
