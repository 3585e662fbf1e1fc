"""Where the dashboard's data comes from; everything here runs in the worker.

:class:`DataSource` opens the backend (NVML init can take a while, so never
on the UI thread), builds a :class:`Sampler` and adds what the process table
needs beyond the model: CPU % and RSS of each GPU process, read through
psutil for GPU processes only. Tests inject a backend factory, a fixed host
sample, a hostname and a clock so screenshots are deterministic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psutil

from gpustation.telemetry.backend import Backend, open_backend
from gpustation.telemetry.model import HostSample, Snapshot
from gpustation.telemetry.sampler import Sampler


@dataclass(slots=True)
class ProcStat:
    cpu_pct: float | None = None
    rss_bytes: int | None = None


@dataclass(slots=True)
class Frame:
    """One sampling pass: the snapshot and what the worker measured around it."""

    snapshot: Snapshot
    procs: dict[int, ProcStat] = field(default_factory=dict)
    sample_s: float = 0.0


class DataSource:
    """Opens the backend lazily and samples it (call only from the worker)."""

    def __init__(
        self,
        backend_factory: Callable[[], Backend] | None = None,
        gpus: Sequence[int] | None = None,
        host_source: Callable[[], HostSample] | None = None,
        hostname: str | None = None,
        clock: Callable[[], float] = time.time,
        slow_interval_s: float = 5.0,
    ) -> None:
        self._factory = backend_factory or (lambda: open_backend(fallback_to_sim=True))
        self._gpus = gpus
        self._host_source = host_source
        self._hostname = hostname
        self._clock = clock
        self._slow_interval_s = slow_interval_s
        self.backend: Backend | None = None
        self.sampler: Sampler | None = None
        self._procs: dict[int, psutil.Process] = {}

    def open(self) -> Backend:
        if self.backend is None:
            backend = self._factory()
            backend.read_energy = False  # the dashboard does not show it
            try:
                self.sampler = Sampler(
                    backend,
                    self._gpus,
                    slow_interval_s=self._slow_interval_s,
                    with_host=self._host_source is None,
                    clock=self._clock,
                )
            except BaseException:
                backend.close()
                raise
            self.backend = backend
        return self.backend

    def sample(self) -> Frame:
        """One pass: GPUs, host, process CPU/RSS. Raises what the backend raises."""
        self.open()
        assert self.sampler is not None and self.backend is not None
        t0 = time.perf_counter()
        snap = self.sampler.sample()
        if self._host_source is not None:
            snap.host = self._host_source()
        if self._hostname is not None:
            snap.hostname = self._hostname
        procs = {} if self.backend.simulated else self._proc_stats(snap)
        return Frame(snap, procs, time.perf_counter() - t0)

    def _proc_stats(self, snap: Snapshot) -> dict[int, ProcStat]:
        # Only the GPU processes: walking every process on the host each tick
        # is what makes some monitors expensive.
        pids = {p.pid for g in snap.gpus for p in g.processes}
        out: dict[int, ProcStat] = {}
        for pid in pids:
            proc = self._procs.get(pid)
            try:
                fresh = proc is None
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                with proc.oneshot():
                    cpu = proc.cpu_percent(None)
                    # The first reading only sets the baseline: show n/a, not 0.
                    out[pid] = ProcStat(None if fresh else cpu, proc.memory_info().rss)
            except (psutil.Error, OSError):
                out[pid] = ProcStat()
        for pid in set(self._procs) - pids:
            del self._procs[pid]
        return out

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None


class Poller:
    """Runs sampling passes on one long-lived thread, when scheduled.

    The dashboard used a Textual thread worker and a one-shot timer per pass;
    on a 1 s refresh that machinery (a worker object and its state messages, a
    timer task, a callback wrapped for the event loop) cost the UI thread about
    as much as drawing the frame. This thread sleeps on a condition until its
    next pass is due, runs ``work`` (which posts its result to the UI itself)
    and waits to be scheduled again, so passes never overlap and the UI thread
    pays only for the frame it is handed.
    """

    def __init__(self, work: Callable[[], None], name: str = "gpustation-sampler") -> None:
        self._work = work
        self._name = name
        self._cond = threading.Condition()
        self._due: float | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def schedule(self, delay_s: float) -> None:
        """Run the next pass ``delay_s`` from now (replaces a pass already scheduled)."""
        with self._cond:
            if self._closed:
                return
            self._due = time.monotonic() + max(0.0, delay_s)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def run_now(self) -> None:
        """Run a pass as soon as the thread is free."""
        self.schedule(0.0)

    def cancel(self) -> None:
        """Forget the scheduled pass (one that is running finishes)."""
        with self._cond:
            self._due = None

    @property
    def pending_s(self) -> float | None:
        """Seconds until the scheduled pass, or None when none is scheduled."""
        due = self._due
        return None if due is None else max(0.0, due - time.monotonic())

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop the thread; waits up to ``timeout_s`` for a pass in progress."""
        with self._cond:
            self._closed = True
            self._due = None
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if self._due is not None:
                        wait = self._due - time.monotonic()
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait()
                if self._closed:
                    return
                self._due = None
            self._work()  # catches its own errors: a failed pass must not end the thread
