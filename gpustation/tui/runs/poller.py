"""Reading run directories off the UI thread: the poll worker's per-run state."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from gpustation.runs import rundir
from gpustation.runs.follow import FollowUpdate, RunFollower
from gpustation.tui.runs.model import ACTIVE_BITE, FINISHED_BITE, MAX_LOG_LINES, RunDelta, Series

if TYPE_CHECKING:
    pass


class _Track:
    """Worker-side state of one followed run."""

    def __init__(self, run_id: str, directory: Path, active: bool) -> None:
        self.id = run_id
        self.directory = directory
        self.follower = RunFollower(directory, max_bytes=ACTIVE_BITE if active else FINISHED_BITE)
        self.losses = Series()
        self.evals = Series()
        self.rate: deque[tuple[float, int]] = deque(maxlen=30)
        self.fresh = True

    def digest(self, update: FollowUpdate) -> RunDelta:
        delta = RunDelta(self.id, state=update.state, ended=update.ended)
        if self.fresh:
            self.fresh = False
            delta.reset = True
            delta.run = rundir.read_run(self.directory) or {}
        if update.state is not None and not update.state.active:
            # Ended: take what is left in bigger bites.
            self.follower.max_bytes = FINISHED_BITE
        if update.lines:
            lines = update.lines
            if len(lines) > MAX_LOG_LINES:
                delta.dropped = len(lines) - MAX_LOG_LINES
                lines = lines[-MAX_LOG_LINES:]
            delta.lines = FollowUpdate(lines=lines).text_lines()
        acc = self.follower.acc
        if acc.losses:
            for x, y in acc.losses:
                self.losses.add(x, y)
            acc.losses.clear()  # the accumulator keeps every point; we keep a bounded series
            delta.losses = self.losses.points()
        got_eval = False
        for event in update.events:
            step = event.get("step")
            t = event.get("t")
            if isinstance(step, int) and isinstance(t, (int, float)) and not isinstance(t, bool):
                self.rate.append((float(t), step))
            value = event.get("eval_loss")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                x = float(step) if isinstance(step, int) else float(len(self.evals) + 1)
                self.evals.add(x, float(value))
                got_eval = True
        if got_eval:
            delta.evals = self.evals.points()
        if update.events or delta.reset:
            delta.figures = {
                "step": acc.step,
                "total_steps": acc.total_steps,
                "loss": acc.final_loss,
                "best_loss": acc.best_loss,
                "eval_loss": acc.last_eval_loss,
                "throughput": acc.throughput,
                "unit": acc.unit,
                "steps_per_s": self.steps_per_s(),
            }
        return delta

    def steps_per_s(self) -> float | None:
        if len(self.rate) < 2:
            return None
        (t0, s0), (t1, s1) = self.rate[0], self.rate[-1]
        if t1 <= t0 or s1 <= s0:
            return None
        return (s1 - s0) / (t1 - t0)

    def close(self) -> None:
        self.follower.close()
