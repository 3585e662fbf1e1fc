"""``gpustation queue``: the runs waiting for GPUs; ``cancel``, ``move``, ``pause``, ``resume``.

Runs enter the queue with ``gpustation run ... --queue``; the scheduler
(:mod:`gpustation.runs.queue.scheduler`) starts each when its GPUs are free.
"""

from __future__ import annotations

import argparse
import json

from rich.table import Table

from gpustation import timefmt
from gpustation.runs.output import console
from gpustation.runs.queue import entries as queue
from gpustation.runs.queue.scheduler import ensure_running, running
from gpustation.textsafe import safe


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "queue",
        help="the runs waiting for GPUs (run ... --queue), in the order they start",
        description="List the GPU queue: each queued run's position, what it waits for, "
        "when it was submitted and its priority. Runs join it with `gpustation run PRESET "
        "--queue` and start when their GPUs are free; see [queue] in config.toml for what "
        "counts as free.",
    )
    p.add_argument("--json", action="store_true", help="the queue as JSON")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    cancel = verbs.add_parser("cancel", help="take a run out of the queue; it never starts")
    cancel.add_argument("run_id", metavar="ID")
    move = verbs.add_parser("move", help="move a queued run to the front or behind another")
    move.add_argument("run_id", metavar="ID")
    where = move.add_mutually_exclusive_group(required=True)
    where.add_argument("--first", action="store_true", help="to the front of the queue")
    where.add_argument("--after", metavar="ID", help="just behind queued run ID")
    verbs.add_parser("pause", help="start no queued run until `queue resume`")
    verbs.add_parser("resume", help="start queued runs again")


def run(args: argparse.Namespace) -> int:
    verb = getattr(args, "verb", None)
    if verb == "cancel":
        entry = queue.cancel(args.run_id)
        print(f"cancelled {entry.id}: it will not start")
        return 0
    if verb == "move":
        order = queue.move(args.run_id, first=args.first, after=args.after)
        _print(order)
        return 0
    if verb == "pause":
        queue.pause()
        print("queue paused: no queued run starts until `gpustation queue resume`")
        return 0
    if verb == "resume":
        queue.resume()
        started = ensure_running()
        print("queue resumed" + (" (scheduler started)" if started else ""))
        return 0
    order = queue.entries()
    if args.json:
        doc = {
            "paused": queue.paused(),
            "scheduler_running": running(),
            "runs": [e.to_json(i + 1) for i, e in enumerate(order)],
        }
        print(json.dumps(doc, indent=2))
        return 0
    if not order:
        print("the queue is empty")
        return 0
    if queue.paused():
        print("the queue is paused: `gpustation queue resume` starts it again")
    _print(order)
    return 0


def _print(order: list[queue.Entry]) -> None:

    table = Table(box=None, pad_edge=False)
    for column in ("#", "ID", "WANTS", "PRIORITY", "SUBMITTED", "WAITING FOR"):
        table.add_column(column, no_wrap=column in ("ID", "#"))
    for i, e in enumerate(order, 1):
        submitted = timefmt.full(e.submitted_at)
        table.add_row(
            str(i),
            safe(e.id),
            e.wants(),
            str(e.priority),
            submitted,
            safe(e.waiting or "the scheduler's first look"),
        )
    console().print(table)
