"""``gpustation sweeps list | show ID | restore ID``: the sweeps run so far."""

from __future__ import annotations

import argparse
import json
import time

from gpustation.commands.options import add_gpu_options, backend_from_args
from gpustation.runs.sweep import list_sweeps, load_sweep, restore_limits


def add_parser(sub: argparse._SubParsersAction) -> None:
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
        sweeps = list_sweeps()
        if args.json:
            print(json.dumps([s.to_dict() for s in sweeps], indent=2, allow_nan=False))
            return 0
        if not sweeps:
            print("no sweeps yet; start one with `gpustation sweep PRESET --set KEY=A,B`")
            return 0
        for s in sweeps:
            done = sum(p.status != "pending" for p in s.points)
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.created_at))
            sim = "  [SIMULATED]" if s.simulated else ""
            print(f"{s.id}  {s.preset}  {done}/{len(s.points)} points  {s.status}  {when}{sim}")
        return 0
    sweep = load_sweep(args.id)
    if args.verb == "show":
        if args.json:
            print(json.dumps(sweep.to_dict(), indent=2, allow_nan=False))
            return 0
        from gpustation.commands.sweep import _report

        _report(sweep)
        return 0
    backend = backend_from_args(args)
    try:
        restore_limits(sweep, backend)
    finally:
        backend.close()
    print(
        f"sweep {sweep.id}: power limits restored"
        if sweep.original_limits_w
        else f"sweep {sweep.id} changed no power limit"
    )
    return 0
