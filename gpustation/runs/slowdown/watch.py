"""The supervisor's slowdown watch: the run's throughput and evidence in, ``slowdowns.jsonl`` out.

Once a second the supervisor hands :meth:`SlowdownWatch.tick` the snapshot
its telemetry sampler just read and the run's processes. The watch keeps a
minute of evidence (``evidence.py``), reads the metric events appended since
(by byte offset, a bite at a time), feeds their throughput, or steps a
second where a run reports only its step, to the detector (``detect.py``)
and keeps the phases the runner reported. When a slowdown is confirmed it
names the cause from the seconds before and during it (``cause.py`` and its rules; other
gpustation runs are looked for then, never on every pass), appends the
slowdown to ``slowdowns.jsonl`` (``records.py``), says it in the supervisor's
log and sends the ``run_slowdown`` notification on a thread of its own;
when the slowdown ends, or the run does, it appends its end.

Whatever goes wrong in here turns the watch off with one line in the
supervisor's log: never the run.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpustation.notify import Notifier, notifier_from_config
from gpustation.runs import rundir
from gpustation.runs.fold import finite_number
from gpustation.runs.rundir import RunState
from gpustation.runs.slowdown import records
from gpustation.runs.slowdown.cause import name_cause
from gpustation.runs.slowdown.clues import Cause, Clues, OtherRun
from gpustation.runs.slowdown.detect import Detector, DetectSettings, Span, StepRate
from gpustation.runs.slowdown.evidence import EvidenceRing, HostReader, Moment, gpu_evidence
from gpustation.runs.slowdown.run_rules import phase_seconds
from gpustation.runs.slowdown.settings import load_settings
from gpustation.runs.store.reconcile import list_active_runs
from gpustation.runs.tail import Tailer, parse_metric_line
from gpustation.telemetry.format import duration
from gpustation.telemetry.model import Snapshot

#: seconds of the steady time before a slowdown its cause is compared with, ending this
#: long before its first slow report (the cause may have come in the report's interval)
BEFORE_S = 30.0
BEFORE_GAP_S = 1.0
#: phase changes kept (the phase in effect, and the changes since a little before a drop)
MAX_PHASES = 64
#: the longest phase name kept
PHASE_CHARS = 40
#: bytes of metrics read per tick: a flood is taken in bites, the supervisor never waits on it
BITE = 1 << 20


class SlowdownWatch:
    """Watches one run for slowdowns (see the module); every method is safe to call."""

    def __init__(
        self,
        directory: Path,
        run: dict[str, Any],
        state: RunState,
        settings: DetectSettings,
        log: Callable[[str], None],
        notifier: Notifier | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.run_id = str(run.get("id") or state.id)
        self.name = str((run.get("preset") or {}).get("name") or self.run_id)
        self.gpus = tuple(int(g) for g in run.get("gpus") or ())
        self.simulated = bool((run.get("backend") or {}).get("simulated"))
        self.state = state
        self.settings = settings
        self.log = log
        self.notifier = notifier
        self.detector = Detector(settings)
        self.steps = StepRate()
        #: where the points come from: "throughput", "steps" (derived), None (not yet)
        self.source: str | None = None
        self.unit: str | None = None
        self.metrics = Tailer(self.directory / rundir.METRICS_FILE, what="metrics file")
        self.ring = EvidenceRing()
        self.host = HostReader()
        self.phases: deque[tuple[float, str]] = deque(maxlen=MAX_PHASES)
        self.pids: frozenset[int] = frozenset()
        self.off = not settings.enabled

    @classmethod
    def start(
        cls, directory: Path, run: dict[str, Any], state: RunState, log: Callable[[str], None]
    ) -> SlowdownWatch | None:
        """A watch for the run, its problems with ``[slowdown]`` logged (None: it is off)."""
        try:
            settings, problems = load_settings()
            for problem in problems:
                log(problem)
            if not settings.enabled:
                log("slowdowns are not watched ([slowdown] enabled = false)")
                return None
            return cls(directory, run, state, settings, log, notifier_from_config())
        except Exception as err:  # the watch must never stop the run
            log(f"slowdowns are not watched: {type(err).__name__}: {err}")
            return None

    # -- the supervisor's calls ---------------------------------------------------------------
    def tick(self, snapshot: Snapshot | None, pids: set[int]) -> None:
        """A second's evidence and the metric events written since the last tick."""
        if self.off:
            return
        try:
            self._tick(snapshot, pids, time.time())
        except Exception as err:
            self._stop(err)

    def close(self) -> None:
        """The run has ended: the slowdown under way (if any) ends with it."""
        if self.off:
            self.metrics.close()
            return
        try:
            span = self.detector.finish(time.time())
            if span is not None:
                self._ended(span, with_run=True)
        except Exception as err:
            self._stop(err)
        finally:
            self.metrics.close()

    def _stop(self, err: Exception) -> None:
        self.off = True
        self.log(f"slowdown watch stopped: {type(err).__name__}: {err}")

    # -- reading -------------------------------------------------------------------------------
    def _tick(self, snapshot: Snapshot | None, pids: set[int], now: float) -> None:
        self.pids = frozenset(pids)
        host = self.host.read(pids, self.state.child_pid)
        self.ring.add(Moment(now, gpu_evidence(snapshot), host))
        for line in self.metrics.read_new(max_bytes=BITE):
            event = parse_metric_line(line)
            if event is not None:
                self._event(event, now)

    def _event(self, event: dict[str, Any], now: float) -> None:
        when = finite_number(event.get("time")) or now
        phase = event.get("phase")
        if isinstance(phase, str) and phase.strip():
            self.phases.append((when, phase.strip()[:PHASE_CHARS]))
        value = finite_number(event.get("throughput"))
        if value is not None:
            if self.source == "steps":
                # The run reports its throughput now: its steps a second were another unit.
                self.detector = Detector(self.settings)
            self.source = "throughput"
            if isinstance(event.get("unit"), str):
                self.unit = event["unit"]
        elif self.source != "throughput":
            step = event.get("step")
            if isinstance(step, int) and not isinstance(step, bool):
                value = self.steps.add(when, step)
                self.source, self.unit = "steps", "steps/s"
        if value is None or value < 0:
            return
        for change in self.detector.add(when, value):
            if change.what == "started":
                self._started(change.span)
            else:
                self._ended(change.span)

    # -- a slowdown ------------------------------------------------------------------------------
    def _other_runs(self) -> tuple[OtherRun, ...]:
        found = []
        for other in list_active_runs():
            if other.id == self.run_id:
                continue
            if bool((other.run.get("backend") or {}).get("simulated")) != self.simulated:
                continue
            gpus = tuple(int(g) for g in other.run.get("gpus") or ())
            if not set(gpus) & set(self.gpus):
                continue
            pids = {other.state.child_pid, *(int(d[0]) for d in other.state.descendants)}
            found.append(
                OtherRun(other.id, gpus, other.state.started_at, frozenset(p for p in pids if p))
            )
        return tuple(found)

    def _cause(self, span: Span) -> Cause:
        since = max(span.start - BEFORE_S, self.detector.steady_since or span.start - BEFORE_S)
        # The phases from a little before the drop (an eval just ended lowers the next
        # reports' rate) to its confirmation.
        phase_from = span.start - self.settings.min_s
        clues = Clues(
            before=self.ring.between(since, span.start - BEFORE_GAP_S),
            during=self.ring.between(span.start, float("inf")),
            gpus=self.gpus,
            run_pids=self.pids,
            phases=phase_seconds(list(self.phases), phase_from, span.confirmed),
            phase_window_s=span.confirmed - phase_from,
            other_runs=self._other_runs(),
            lost_pct=span.lost_pct,
        )
        return name_cause(clues)

    def _into_run(self, t: float) -> float | None:
        started = self.state.started_at
        return None if started is None else round(max(0.0, t - started), 3)

    def _started(self, span: Span) -> None:
        cause = self._cause(span)
        start_s = self._into_run(span.start)
        record: dict[str, Any] = {
            "id": span.id,
            "state": "ongoing",
            "start_time": round(span.start, 3),
            "start_s": start_s,
            "confirmed_time": round(span.confirmed, 3),
            "steady": round(span.steady, 4),
            "throughput": round(span.mean, 4),
            "unit": self.unit,
            "lost_pct": round(span.lost_pct, 1),
            "lost": round(span.steady - span.mean, 4),
            "cause": cause.to_dict(),
        }
        records.append(self.directory, record)
        unit = self.unit or ""
        since = duration(start_s)
        self.log(
            f"slowdown {span.id}: {span.mean:.4g} {unit} against a steady {span.steady:.4g} "
            f"({span.lost_pct:.0f} % lower) since {since} into the run: {cause.words}"
        )
        self._notify(span, cause, since)

    def _ended(self, span: Span, with_run: bool = False) -> None:
        end = span.end if span.end is not None else span.last
        record = {
            "id": span.id,
            "state": "ended",
            "end_time": round(end, 3),
            "length_s": round(span.length_s(), 3),
            "throughput": round(span.mean, 4),
            "lost_pct": round(span.lost_pct, 1),
            "lost": round(span.steady - span.mean, 4),
            "ended_with_run": with_run,
        }
        records.append(self.directory, record)
        how = "with the run" if with_run else "the throughput is back"
        self.log(f"slowdown {span.id} ended after {duration(span.length_s())}: {how}")

    def _notify(self, span: Span, cause: Cause, since: str) -> None:
        notifier = self.notifier
        if notifier is None or not notifier.wanted("run_slowdown"):
            return
        title = f"gpustation: {self.name} slowed down"
        body = (
            f"run {self.run_id}: {span.lost_pct:.0f} % below its steady "
            f"{span.steady:.4g} {self.unit or ''} since {since} into the run; {cause.words}"
        )
        if self.simulated:
            body += " SIMULATED"
        # A notification service never holds the supervisor's loop up.
        threading.Thread(
            target=notifier.send,
            args=("run_slowdown", title, body),
            name="gpustation-slowdown-notify",
            daemon=True,
        ).start()
