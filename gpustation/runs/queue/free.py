"""Whether a GPU is free for a queued run, and in words why not.

Free means: no gpustation run holds it, no other process holds more than
``[queue] busy_mib`` of its memory, and its utilisation over the last
``[queue] settle_s`` seconds, counted only while no gpustation run held it,
stayed at or below ``[queue] busy_util_pct``. A run that just ended frees its
GPU at once (its own load is not held against the next run); someone else's
job that just ended frees it once its load has been gone for the settle time.

The defaults: 2 GiB is more than a CUDA context and a desktop session hold
(0.3-0.6 GiB) and less than any training job; 10 % lets a monitor or a display
through but not a job between its batches; 10 s covers a job's pause to save
a checkpoint or evaluate.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpustation.config import section
from gpustation.errors import UsageError
from gpustation.telemetry.model import GpuSample, ProcessInfo


@dataclass(frozen=True)
class QueueSettings:
    busy_mib: float = 2048.0
    busy_util_pct: float = 10.0
    settle_s: float = 10.0


def load_settings() -> QueueSettings:
    """``[queue]`` of config.toml over the defaults; a UsageError naming a bad value."""
    table = section("queue")
    defaults = QueueSettings()
    values: dict[str, float] = {}
    for key in ("busy_mib", "busy_util_pct", "settle_s"):
        if key not in table:
            continue
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise UsageError(f"config.toml [queue] {key}: a number of 0 or more, got {value!r}")
        values[key] = float(value)
    unknown = set(table) - {"busy_mib", "busy_util_pct", "settle_s"}
    if unknown:
        raise UsageError(
            f"config.toml [queue]: unknown key(s) {', '.join(sorted(unknown))}; "
            "known: busy_mib, busy_util_pct, settle_s"
        )
    return QueueSettings(**{**defaults.__dict__, **values})


def gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


def who(proc: ProcessInfo) -> str:
    """``pid 4242 (alice, python serve.py)``."""
    parts = [p for p in (proc.user, proc.command or proc.name) if p]
    return f"pid {proc.pid}" + (f" ({', '.join(parts)})" if parts else "")


class GpuWatch:
    """What each GPU did over the last settle time; :meth:`busy` says why one is not free."""

    def __init__(
        self, settings: QueueSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.clock = clock
        #: per GPU: (time, utilisation %) while no gpustation run held it
        self._load: dict[int, deque[tuple[float, float]]] = {}
        self._latest: dict[int, GpuSample] = {}
        self._held: dict[int, str] = {}
        self._run_pids: set[int] = set()

    def add(
        self, samples: Iterable[GpuSample], held: dict[int, str], run_pids: Iterable[int]
    ) -> None:
        """A pass: each GPU's sample, the GPUs gpustation runs hold (GPU -> run id) and
        the pids of those runs' processes."""
        now = self.clock()
        self._held = dict(held)
        self._run_pids = set(run_pids)
        for sample in samples:
            self._latest[sample.index] = sample
            window = self._load.setdefault(sample.index, deque())
            if sample.index in held:
                window.clear()  # a run's own load is not held against the next one
            elif sample.utilization_gpu_pct is not None:
                window.append((now, float(sample.utilization_gpu_pct)))
            while window and window[0][0] < now - self.settings.settle_s:
                window.popleft()

    def busy(self, index: int) -> str | None:
        """Why GPU ``index`` is not free, in words; None when it is free."""
        if index in self._held:
            return f"GPU {index}: run {self._held[index]} holds it"
        sample = self._latest.get(index)
        if sample is None:
            return f"GPU {index}: not read yet"
        if sample.lost:
            return f"GPU {index}: lost (fell off the bus)"
        foreign = [p for p in sample.processes if p.pid not in self._run_pids]
        heavy = [p for p in foreign if (p.gpu_memory_mib or 0.0) > self.settings.busy_mib]
        if heavy:
            top = max(heavy, key=lambda p: p.gpu_memory_mib or 0.0)
            return f"GPU {index}: {who(top)} holds {gib(top.gpu_memory_mib or 0.0)}"
        window = self._load.get(index) or ()
        if window:
            mean = sum(u for _, u in window) / len(window)
            if mean > self.settings.busy_util_pct:
                busiest = max(foreign, key=lambda p: p.sm_pct or 0.0, default=None)
                by = f" ({who(busiest)})" if busiest is not None else ""
                return (
                    f"GPU {index}: {mean:.0f} % busy over the last {self.settings.settle_s:g} s{by}"
                )
        return None

    def used(self, index: int) -> tuple[float, float]:
        """(memory used MiB, utilisation %) now: how used a free GPU is, to pick the least."""
        sample = self._latest.get(index)
        if sample is None:
            return (float("inf"), float("inf"))
        return (sample.memory_used_mib or 0.0, sample.utilization_gpu_pct or 0.0)
