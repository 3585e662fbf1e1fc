"""Where the dashboard's data comes from; everything here runs in the worker.

:class:`DataSource` opens the backend (NVML init can take a while, so never
on the UI thread), builds a :class:`Sampler` and adds what the process table
needs beyond the model: CPU % and RSS of each GPU process, read through
psutil for GPU processes only (and the device nodes' holders). Tests inject
a backend factory, a fixed host sample, a hostname, a clock and a ``/proc``
so screenshots are deterministic.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psutil

from gpustation.control.drift import mark_drift
from gpustation.control.fans import unattended_manual_fans
from gpustation.control.lease import left_notes
from gpustation.errors import GpustationError
from gpustation.telemetry.backend import Backend
from gpustation.telemetry.model import HostSample, Snapshot
from gpustation.telemetry.registry import open_backend
from gpustation.telemetry.sampler import Sampler

if TYPE_CHECKING:
    from gpustation.telemetry.recording.recorder import Recorder


@dataclass(slots=True)
class ProcStat:
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    #: when the process started (seconds since the epoch)
    started: float | None = None


@dataclass(slots=True)
class Frame:
    """One sampling pass: the snapshot and what the worker measured around it."""

    snapshot: Snapshot
    procs: dict[int, ProcStat] = field(default_factory=dict)
    sample_s: float = 0.0
    #: GPU -> its fans on manual control with no fan controller driving them
    unattended_fans: dict[int, list[int]] = field(default_factory=dict)
    #: GPU -> "limit left by sweep ID; ..." where a killed sweep left its limit
    limits_left: dict[int, str] = field(default_factory=dict)


#: how long closing waits for a first pass still in progress
FIRST_PASS_CLOSE_S = 1.0


def dashboard_source(
    gpus: Sequence[int] | None = None,
    simulate: int | None = None,
    sim_card: str | None = None,
    recorder: Recorder | None = None,
) -> DataSource:
    """The dashboard's source: this machine's GPUs (simulated ones when asked,
    or when there is no driver)."""

    return DataSource(lambda: dashboard_backend(simulate, sim_card), gpus, recorder=recorder)


def dashboard_backend(simulate: int | None, sim_card: str | None) -> Backend:
    """The dashboard's backend: simulated GPUs when no real ones open; what it
    reused from last time is on the banner, so a flag's default never surprises."""
    backend = open_backend(simulate=simulate, sim_card=sim_card, fallback_to_sim=True)
    if backend.kept:
        backend.note = " ".join(filter(None, (backend.note, backend.kept)))
    return backend


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
        recorder: Recorder | None = None,
        proc_root: str = "/proc",
    ) -> None:
        self._factory = backend_factory or (lambda: open_backend(fallback_to_sim=True))
        self._gpus = gpus
        self._host_source = host_source
        self._hostname = hostname
        self._clock = clock
        self._slow_interval_s = slow_interval_s
        #: where the device nodes' holders are looked up
        self._proc_root = proc_root
        self.backend: Backend | None = None
        self.sampler: Sampler | None = None
        self._procs: dict[int, psutil.Process] = {}
        #: the [record] recording, written on this thread; None once a write failed
        self.recorder = recorder
        #: why the recording stopped (a full disk), for the banner
        self.record_error: str | None = None
        #: read the profiling metrics (GPM) in the next pass: the app sets it
        #: while something on screen shows them or a run is live; the pass
        #: hands it to the backend (on this thread, never the UI's)
        self.want_gpm = False
        self._first: threading.Thread | None = None
        self._first_result: Frame | BaseException | None = None

    def start_first_pass(self, want_gpm: bool = True) -> None:
        """Open the backend and take the first sample on a thread of its own, now.

        Called before the UI is imported, so that the driver's start-up and the
        first reads overlap the UI's; the first :meth:`sample` hands over this
        pass. ``want_gpm``: the dashboard's first screen shows GPM (full cards).
        """
        if self._first is not None or self.backend is not None:
            return
        self.want_gpm = want_gpm

        def first() -> None:
            try:
                self._first_result = self._sample()
            except BaseException as err:  # raised again by the sample() that takes it
                self._first_result = err

        self._first = threading.Thread(target=first, name="gpustation-first-pass", daemon=True)
        self._first.start()

    def _take_first(self) -> Frame | None:
        thread, self._first = self._first, None
        if thread is None:
            return None
        thread.join()
        result, self._first_result = self._first_result, None
        if isinstance(result, BaseException):
            raise result
        return result

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
                    proc_root=self._proc_root,
                )
            except BaseException:
                backend.close()
                raise
            self.backend = backend
        return self.backend

    def sample(self) -> Frame:
        """One pass: GPUs, host, process CPU/RSS. Raises what the backend raises.

        The first call hands over the pass :meth:`start_first_pass` took, if any."""
        first = self._take_first()
        if first is not None:
            return first
        return self._sample()

    def _sample(self) -> Frame:
        self.open()
        assert self.sampler is not None and self.backend is not None
        # GPM takes driver time and a sample buffer per GPU: only while shown.
        self.sampler.read_gpm = self.want_gpm
        t0 = time.perf_counter()
        snap = self.sampler.sample()
        if self._host_source is not None:
            snap.host = self._host_source()
        if self._hostname is not None:
            snap.hostname = self._hostname
        procs = {} if self.backend.simulated else self._proc_stats(snap)
        if self.recorder is not None:
            self._record(snap)
        unattended: dict[int, list[int]] = {}
        if any("manual" in g.fan_control for g in snap.gpus):
            unattended = unattended_manual_fans(snap.gpus, self.backend.simulated)

        mark_drift(snap)

        left = left_notes([(g.index, g.uuid) for g in snap.gpus], self.backend.simulated)
        return Frame(snap, procs, time.perf_counter() - t0, unattended, left)

    def _record(self, snap: Snapshot) -> None:
        assert self.recorder is not None
        try:
            self.recorder.add(snap)
        except GpustationError as err:  # a full disk stops the recording, not the dashboard
            self.record_error = str(err)
            self.recorder = None

    def _proc_stats(self, snap: Snapshot) -> dict[int, ProcStat]:
        # Only the GPU processes: walking every process on the host each tick
        # is what makes some monitors expensive.
        pids = {p.pid for g in snap.gpus for p in [*g.processes, *(g.device_holders or ())]}
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
                    out[pid] = ProcStat(
                        None if fresh else cpu, proc.memory_info().rss, proc.create_time()
                    )
            except (psutil.Error, OSError):
                out[pid] = ProcStat()
        for pid in set(self._procs) - pids:
            del self._procs[pid]
        return out

    def close(self) -> None:
        first = self._first
        if first is not None:  # never close a backend while it is being opened ...
            first.join(timeout=FIRST_PASS_CLOSE_S)
            if first.is_alive():  # ... nor wait on a driver that hangs: the process ends
                return
        if self.recorder is not None:
            recorder, self.recorder = self.recorder, None
            try:
                recorder.close()
            except GpustationError as err:
                self.record_error = str(err)
        if self.backend is not None:
            self.backend.close()
            self.backend = None
