"""``gpustation power show | set VALUE | reset | journal``."""

from __future__ import annotations

import argparse
import json
import sys

from gpustation import timefmt
from gpustation.commands.options import (
    add_control_options,
    add_gpu_options,
    command_text,
    gpus_suffix,
    open_gpus,
    print_json,
    simulated_banner,
)
from gpustation.control import journal, lease
from gpustation.control.drift import applied_now, find_drift
from gpustation.control.power import NOT_PERSISTENT, PowerChange, apply_power, plan_power
from gpustation.control.profiles import PowerValue, parse_power_value
from gpustation.errors import GpustationError, UsageError
from gpustation.telemetry.backend import Backend
from gpustation.textsafe import safe

_FORCE_HELP = "end a sweep that owns these GPUs' limits first (it puts its limits back as it ends)"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "power",
        help="show, set or reset the GPUs' power limits",
        description="Show, set or reset power limits. Each change is checked against the "
        "card's own range and written to the control journal before it is made. " + NOT_PERSISTENT,
    )
    actions = p.add_subparsers(dest="power_action", metavar="ACTION", required=True)

    show = actions.add_parser("show", help="current, default, min and max limit per GPU")
    add_gpu_options(show)
    show.add_argument("--json", action="store_true", help="print JSON")

    set_ = actions.add_parser(
        "set",
        help="set the power limit: watts (350, 350W) or %% of the default (80%%)",
        description="Set the power limit of the selected GPUs. VALUE is watts (350, 350W) or "
        "a percentage of each card's default limit (80%%), so one value fits different cards. "
        "A value outside a card's range is refused and nothing is changed.",
    )
    set_.add_argument("value", metavar="VALUE", help="watts (350, 350W) or %% of default (80%%)")
    add_control_options(set_)
    set_.add_argument("--force", action="store_true", help=_FORCE_HELP)

    reset = actions.add_parser("reset", help="put every selected card back on its default limit")
    add_control_options(reset)
    reset.add_argument("--force", action="store_true", help=_FORCE_HELP)

    log = actions.add_parser("journal", help="print the control journal (every change made)")
    log.add_argument("--json", action="store_true", help="print JSON Lines, one entry a line")
    log.add_argument("--last", type=int, metavar="N", help="only the last N entries")


def run(args: argparse.Namespace) -> int:
    action = args.power_action
    if action == "journal":
        return print_journal(args)
    if action == "set":
        try:
            value = parse_power_value(args.value)
        except ValueError as err:
            raise UsageError(f"power set: {err}") from None
        if value.kind == "default":
            return _change(args, value, command_text("power reset", gpus_suffix(args)))
        return _change(args, value, command_text("power set", args.value, gpus_suffix(args)))
    if action == "reset":
        return _change(args, PowerValue("default"), command_text("power reset", gpus_suffix(args)))
    return _show(args)


def _fmt(watts: float | None) -> str:
    return "n/a" if watts is None else f"{watts:g} W"


def _show(args: argparse.Namespace) -> int:
    with open_gpus(args) as (backend, indices):
        samples = backend.read_gpus(indices, slow=False)
        left = lease.left_notes([(s.index, s.uuid) for s in samples], backend.simulated)
        drifted = find_drift(samples, applied_now(backend.simulated))
        if args.json:
            print_json(
                {
                    "simulated": backend.simulated,
                    "persistent": False,
                    "note": NOT_PERSISTENT,
                    "gpus": [
                        {
                            "index": s.index,
                            "uuid": s.uuid,
                            "name": s.name,
                            "power_w": s.power_w,
                            "power_limit_w": s.power_limit_w,
                            "power_default_w": s.power_default_w,
                            "power_min_w": s.power_min_w,
                            "power_max_w": s.power_max_w,
                            "limit_note": left.get(s.index),
                            "limit_drift": d.text() if (d := drifted.get(s.index)) else None,
                        }
                        for s in samples
                    ],
                }
            )
            return 0
        simulated_banner(backend)
        rows = [("GPU", "Name", "Limit", "Default", "Range", "Draw")]
        for s in samples:
            rng = (
                f"{s.power_min_w:g}-{s.power_max_w:g} W"
                if s.power_min_w is not None and s.power_max_w is not None
                else "n/a"
            )
            limit = _fmt(s.power_limit_w)
            if (
                s.power_limit_w is not None
                and s.power_default_w is not None
                and abs(s.power_limit_w - s.power_default_w) >= 0.5
            ):
                limit += f" ({100 * s.power_limit_w / s.power_default_w:.0f}%)"
            rows.append(
                (
                    str(s.index),
                    s.name or "n/a",
                    limit,
                    _fmt(s.power_default_w),
                    rng,
                    _fmt(s.power_w),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip())
        for index, note in sorted(left.items()):
            print(safe(f"WARNING: GPU {index}: {note}"))
        for index, drift in sorted(drifted.items()):
            print(safe(f"WARNING: GPU {index}: {drift.text()}"))
        print(NOT_PERSISTENT)
    return 0


def _change(args: argparse.Namespace, value: PowerValue, command: str) -> int:
    with open_gpus(args) as (backend, indices):
        samples = backend.read_gpus(indices, slow=False)
        changes = plan_power(samples, value)
        simulated_banner(backend)
        if args.dry_run:
            print("Dry run: nothing is changed.")
            print_planned(changes)
            return 0

        if getattr(args, "force", False):
            held = lease.holders([(c.gpu, c.uuid) for c in changes], backend.simulated)
            if held:
                print("ending " + "; ".join(h.describe() for h in held) + " first (--force)")
                lease.end_holders(held)
        # Said once every card has its limit: a later card's failure puts the
        # earlier ones back, and nothing may read as set that was undone.
        made: list[PowerChange] = []
        try:
            done = apply_power(backend, changes, command, on_change=made.append)
        except GpustationError as err:
            if made:
                err.args = (f"{err} ({_after_undo(backend, made)})",)
            raise
        for change in done:
            print(f"set {change.describe()}")
        for change in changes:
            if change.unchanged:
                print(f"GPU {change.gpu}: already at {change.new_w:g} W, unchanged")
        if done:
            print(NOT_PERSISTENT)
    return 0


def _after_undo(backend: Backend, made: list[PowerChange]) -> str:
    """What became of the cards set before a later one failed, read from the cards."""
    parts = []
    for c in made:
        try:
            now = backend.read_gpus([c.gpu], slow=False)[0].power_limit_w
        except Exception:
            now = None
        if now is not None and c.current_w is not None and abs(now - c.current_w) < 0.5:
            parts.append(f"GPU {c.gpu} was put back to {now:g} W")
        else:
            parts.append(f"GPU {c.gpu} could not be put back: it reads {_fmt(now)}")
    return "; ".join(parts)


def print_planned(changes: list[PowerChange]) -> None:
    """What a dry run would set on each card."""
    for change in changes:
        print(f"would set {change.describe()}" + (" (unchanged)" if change.unchanged else ""))


def print_journal(args: argparse.Namespace) -> int:
    """Print the control journal, oldest first; lines that cannot be read are
    reported on stderr and skipped."""
    read = journal.read_journal()
    entries = read.entries
    if args.last is not None:
        if args.last < 1:
            raise UsageError(f"--last: a number of entries above 0, got {args.last}")
        entries = entries[-args.last :]
    for problem in read.problems:
        print(f"gpustation: {journal.journal_path()}: {problem} (skipped)", file=sys.stderr)
    if args.json:
        for e in entries:
            print(json.dumps(e.to_dict(), separators=(",", ":"), default=str))
        return 0
    if not entries:
        print(f"The control journal is empty ({journal.journal_path()}).")
        return 0
    for e in entries:
        stamp = timefmt.full(e.time)
        fan = f" fan {e.fan}" if e.fan is not None else ""
        sim = " [SIMULATED]" if e.simulated else ""
        outcome = "" if e.outcome == journal.MADE else f"  [{e.outcome.upper()}]"
        if e.error:
            outcome += f" {e.error}"
        print(
            safe(
                f"{stamp}  {e.host}  GPU {e.gpu}{fan}  {e.what}: "
                f"{journal.describe_value(e.what, e.previous)} -> "
                f"{journal.describe_value(e.what, e.new)}  ({e.command}){sim}{outcome}"
            )
        )
    return 0
