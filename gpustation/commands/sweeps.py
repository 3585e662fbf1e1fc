"""``gpustation sweeps list | show ID | restore ID``: the sweeps run so far."""

from __future__ import annotations

import argparse
import json
import sys

from gpustation import timefmt
from gpustation.commands.options import add_gpu_options, backend_from_args
from gpustation.commands.sweep import _report
from gpustation.errors import GpustationError
from gpustation.runs.sweep.model import load_sweep, scan_sweeps
from gpustation.runs.sweep.owner import restore_limits
from gpustation.textsafe import safe


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sweeps", help="the sweeps run so far, their points and findings")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    ls = verbs.add_parser("list", help="every sweep, newest last")
    ls.add_argument("--json", action="store_true")
    show = verbs.add_parser("show", help="one sweep's points, plot and recommendation")
    show.add_argument("id", metavar="ID", help="a sweep id, a unique part of one, or last")
    show.add_argument("--json", action="store_true")
    restore = verbs.add_parser(
        "restore", help="put back the power limits a sweep that was killed left changed"
    )
    restore.add_argument("id", metavar="ID")
    add_gpu_options(restore)


def run(args: argparse.Namespace) -> int:
    if args.verb == "list":
        sweeps, damaged = scan_sweeps()
        for line in damaged:
            print(f"gpustation: skipped: {line}", file=sys.stderr)
        if args.json:
            docs = [{**s.to_dict(), "state": s.state_text()} for s in sweeps]
            print(json.dumps(docs, indent=2, allow_nan=False))
            return 0
        if not sweeps:
            print("no sweeps yet; start one with `gpustation sweep PRESET --set KEY=A,B`")
            return 0
        for s in sweeps:
            done = sum(p.status != "pending" for p in s.points)
            when = timefmt.stamp(s.created_at)
            sim = "  [SIMULATED]" if s.simulated else ""
            print(
                safe(f"{s.id}  {s.preset}  {done}/{len(s.points)} points  {s.state_text()}  {when}")
                + sim
            )
        return 0
    sweep = load_sweep(args.id)
    if args.verb == "show":
        if args.json:
            doc = {**sweep.to_dict(), "state": sweep.state_text()}
            print(json.dumps(doc, indent=2, allow_nan=False))
            return 0

        print(safe(f"sweep {sweep.id}: {sweep.state_text()}"))
        _report(sweep)
        return 0
    if sweep.alive and not sweep.restored:
        raise GpustationError(
            f"sweep {sweep.id} is still running (pid {sweep.pid}): it owns its GPUs' limits "
            "and puts them back itself as it ends. Stop it (Ctrl-C where it runs, or "
            f"kill -TERM {sweep.pid}) instead; nothing was changed."
        )
    backend = backend_from_args(args)
    try:
        for line in restore_limits(sweep, backend):
            print(f"gpustation: {line}", file=sys.stderr)
    finally:
        backend.close()
    print(
        f"sweep {sweep.id}: power limits restored"
        if sweep.original_limits_w
        else f"sweep {sweep.id} changed no power limit"
    )
    return 0
