"""Recordings made from simulated GPUs on a clock the test moves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpustation.telemetry.recording.recorder import Recorder
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.sim import SimBackend

START = 1_000_000.0


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_recording(
    path: Path,
    n: int = 120,
    interval: float = 1.0,
    start: float = START,
    gpus: int = 2,
    events: dict[int, Callable[[SimBackend], None]] | None = None,
    frame_s: float = 10.0,
    flush_s: float = 0.0,
    **kwargs: Any,
) -> list[float]:
    """Record ``n`` snapshots ``interval`` apart from ``start``; their times.

    A zstd frame every ``frame_s`` seconds; ``events[i]`` runs before sample i.
    """
    clk = Clock(start)
    backend = SimBackend(count=gpus, seed=0, state_path=None, clock=clk)
    sampler = Sampler(backend, clock=clk, with_host=False)
    mono = Clock(0.0)
    times = []
    with Recorder(path, clock=mono, flush_s=flush_s, frame_s=frame_s, **kwargs) as rec:
        for i in range(n):
            if events and i in events:
                events[i](backend)
            snap = sampler.sample()
            rec.add(snap)
            times.append(snap.time)
            clk.t += interval
            mono.t += interval
    return times
