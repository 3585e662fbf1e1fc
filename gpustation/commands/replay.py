"""``gpustation replay``: a recording shown in the dashboard, or one moment of it printed.

``replay FILE`` opens the dashboard on the recorded snapshots (play, pause,
step, seek, speed; a timeline with run, alert and control-change marks).
``replay FILE --at TIME`` prints the snapshot recorded at that moment (the last
one at or before it) without a terminal UI; ``--json`` as a
``gpustation.snapshot/1`` document. With ``--json`` and no ``--at`` every
snapshot is printed as JSON Lines.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from gpustation import colour
from gpustation.errors import UsageError
from gpustation.telemetry.model import Snapshot
from gpustation.telemetry.recording.file import SPEEDS, Recording
from gpustation.telemetry.table import render_snapshot
from gpustation.timespec import parse_time


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a recording made by `gpustation record` (or print one moment of it)",
        description="Open the dashboard on a recording: space plays or pauses, . and , step "
        "one snapshot, left/right seek 10 s (shift: 60 s), [ and ] change the speed "
        "(0.5x to 16x), g goes to a time, n and N jump to the next or previous mark. "
        "With --at, print the snapshot recorded at TIME instead.",
    )
    p.add_argument(
        "file", type=Path, metavar="FILE", help="the recording (FILE.1 ... are read too)"
    )
    p.add_argument(
        "--at",
        metavar="TIME",
        help="print the snapshot recorded at TIME: a span into the recording (90s, 5m), "
        "a clock time (20:02:46), a date (2026-12-01T20:02, local time unless it has an "
        "offset), a time back from its end (-3s) or Unix seconds",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print JSON (with --at one document, without it every snapshot as JSON Lines)",
    )
    p.add_argument(
        "--start", metavar="TIME", help="open the dashboard at TIME, as --at (default: the start)"
    )
    p.add_argument(
        "--speed",
        type=float,
        default=1.0,
        metavar="X",
        help="playback speed, 0.5 to 16 (default 1)",
    )


def run(args: argparse.Namespace) -> int:
    speed = args.speed
    if not (math.isfinite(speed) and SPEEDS[0] <= speed <= SPEEDS[-1]):
        raise UsageError(f"--speed: between {SPEEDS[0]:g} and {SPEEDS[-1]:g}, got {speed:g}")
    recording = Recording(args.file)
    for problem in recording.problems:
        print(f"gpustation: {problem}", file=sys.stderr)
    bounds = (recording.start, recording.end)
    at = None if args.at is None else parse_time(args.at, "--at", recording.end, bounds)
    start = None if args.start is None else parse_time(args.start, "--start", recording.end, bounds)
    for option, t, text in (("--at", at, args.at), ("--start", start, args.start)):
        if t is not None and not recording.start <= t <= recording.end:
            raise UsageError(
                f"{option} {text}: outside the recording, which spans {recording.span()}"
            )
    if at is not None:
        doc = recording.doc_at(at)
        if args.json:
            json.dump(doc, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            snap = Snapshot.from_dict(doc)
            sys.stdout.write(render_snapshot(snap, color=colour.wanted(sys.stdout)))
            sys.stdout.write("\n")
        return 0
    if args.json:
        for doc in recording.iter_docs():
            sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
        return 0
    # start-up time: the TUI (textual)
    from gpustation.tui.keyids import keymap_from_config
    from gpustation.tui.replay.screen import run_replay

    return run_replay(recording, speed=speed, start=start, keymap=keymap_from_config())
