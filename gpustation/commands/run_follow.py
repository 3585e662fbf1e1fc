"""Following a run from a terminal: its log on stdout, its progress on stderr, its end.

The log streams to stdout; when the run reports ``total_steps`` a progress bar
with an ETA goes to stderr (plain progress lines when stderr is not a
terminal). ``gpustation run``, ``runs follow`` and a probe (``run --dry-run
--probe``) follow runs through here.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpustation.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK
from gpustation.runs import rundir
from gpustation.runs.follow import RunFollower
from gpustation.runs.launch.stop import stop_run
from gpustation.runs.slowdown.show import print_slowdowns
from gpustation.runs.summary import RunSummary
from gpustation.telemetry.format import duration


class Progress:
    """A Rich bar on a terminal; otherwise a plain line every 10 % (or minute)."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.bar: Any = None
        self.task: Any = None
        self.fancy = sys.stderr.isatty()
        self._last_decile = -1
        self._last_print = 0.0

    def start(self, total: int) -> None:
        if not self.fancy or self.bar is not None:
            return
        # start-up time: rich, for terminal output only
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            # The run's title and unit are its own text, never markup.
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}", markup=False),
            console=Console(stderr=True),
            transient=False,
        )
        self.bar.start()
        self.task = self.bar.add_task(self.title, total=total, info="")

    def write_log(self, lines: list[str]) -> None:
        if self.bar is not None and sys.stdout.isatty():
            # One terminal: print above the bar so the two do not tangle.
            for line in lines:
                self.bar.console.print(line, markup=False, highlight=False)
        else:
            sys.stdout.buffer.write(("\n".join(lines) + "\n").encode("utf-8", "replace"))
            sys.stdout.flush()

    def update(self, run: RunSummary) -> None:
        if run.steps is None or not run.total_steps:
            return
        info = []
        if run.final_loss is not None:
            info.append(f"loss {run.final_loss:.4g}")
        if run.throughput is not None:
            info.append(f"{run.throughput:.1f} {run.throughput_unit or '/s'}")
        if self.fancy:
            self.start(run.total_steps)
            self.bar.update(
                self.task, completed=run.steps, total=run.total_steps, info="  ".join(info)
            )
            return
        decile = int(10 * run.steps / run.total_steps)
        now = time.monotonic()
        if decile == self._last_decile and now - self._last_print < 60:
            return
        self._last_decile, self._last_print = decile, now
        eta = run.eta_s()
        pct = 100.0 * run.steps / run.total_steps
        line = f"gpustation: step {run.steps}/{run.total_steps} ({pct:.0f} %)"
        if eta is not None:
            line += f"  ETA {clock(eta)}"
        if info:
            line += "  " + "  ".join(info)
        print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def clock(seconds: float) -> str:
    """Whole seconds, cut down (0:59 until a full minute is up), never below 0:00."""
    return duration(int(max(0, seconds)))


def follow(
    directory: Path,
    grace_s: float | None = 10.0,
    poll_s: float = 0.1,
    stop_on_interrupt: bool = True,
    interrupts: list[float] | None = None,
    restore_handler: Any = None,
) -> int:
    """Stream a run's log and progress until it ends; return the exit status.

    With ``stop_on_interrupt`` Ctrl-C stops the run (graceful, then firm);
    without it Ctrl-C only stops following and the run goes on.
    """

    run = rundir.read_run(directory) or {}
    title = (run.get("preset") or {}).get("name") or directory.name
    follower = RunFollower(directory)
    progress = Progress(title)
    # Ctrl-C presses, newest last (some may have come before following began).
    interrupts = interrupts if interrupts is not None else []
    stopper: threading.Thread | None = None

    def on_sigint(_signum: int, _frame: object) -> None:
        interrupts.append(time.monotonic())

    previous = signal.signal(signal.SIGINT, on_sigint)
    if restore_handler is not None:
        previous = restore_handler
    try:
        while True:
            if interrupts and not stop_on_interrupt:
                print(
                    f"\ngpustation: no longer following run {directory.name}; it goes on "
                    f"(`gpustation runs stop {directory.name}` stops it)",
                    file=sys.stderr,
                    flush=True,
                )
                return EXIT_INTERRUPTED
            if interrupts and stopper is None:
                print(
                    f"\ngpustation: stopping run {directory.name} (Ctrl-C again to skip the waits)",
                    file=sys.stderr,
                    flush=True,
                )
                stopper = threading.Thread(
                    target=stop_run,
                    args=(directory,),
                    kwargs={
                        "grace_s": grace_s,
                        "by": "gpustation run (Ctrl-C)",
                        "force_now": lambda: len(interrupts) > 1,
                    },
                    daemon=True,
                )
                stopper.start()
            update = follower.poll()
            if update.lines:
                progress.write_log(update.text_lines())
            print_slowdowns(update.slowdowns, follower.slowdowns)
            if update.events or update.ended:
                progress.update(follower.summary())
            if update.ended:
                break
            if not update.lines and not update.events:
                time.sleep(poll_s)
    finally:
        progress.close()
        follower.close()
        signal.signal(signal.SIGINT, previous)
    if stopper is not None:
        stopper.join(timeout=30)
    state = rundir.read_state(directory) or follower.state
    return _report(directory, state, follower.summary())


def _report(directory: Path, state: rundir.RunState | None, run: RunSummary) -> int:
    if state is None:
        print(f"gpustation: run {directory.name}: no state recorded", file=sys.stderr)
        return EXIT_FAILURE
    parts = [f"gpustation: run {state.id} {state.status}"]
    if state.started_at and state.ended_at:
        parts.append(f"after {clock(state.ended_at - state.started_at)}")
    if state.reason and state.status != "succeeded":
        parts.append(f"- {state.reason}")
    if run.final_loss is not None:
        parts.append(f"- final loss {run.final_loss:.4g}")
    if run.best_throughput is not None:
        parts.append(f"- best {run.best_throughput:.1f} {run.throughput_unit or '/s'}")
    try:
        # start-up time: the run store (sqlite3)
        from gpustation.runs.store.index import RunStore

        record = RunStore().get(state.id)
        if record is not None and record.energy_j is not None:
            energy = f"- GPU energy {record.energy_j / 3600:.2f} Wh"
            parts.append(f"{energy} SIMULATED" if record.simulated else energy)
    except Exception:
        pass
    print(" ".join(parts), file=sys.stderr, flush=True)
    if state.status == "succeeded":
        return EXIT_OK
    if state.status == "stopped":
        return EXIT_INTERRUPTED
    return EXIT_FAILURE
