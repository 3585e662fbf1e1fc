"""What a past run says about itself: the features and outcomes a forecast rests on.

For each succeeded run of the same preset (for a command run, the same
argv), newest first, from its history row (:class:`RunSummary`) and its run
directory:

- features: steps, batch size and sequence length (its arguments in
  ``run.json``, else what its summary says it ran with), GPU count, the power
  limit in force (the ``power_limit_w`` of its telemetry; unknown for runs
  recorded before it was);
- time: the steady step time, a robust line through (step, wall time) of the
  reports after warm-up (the first report with a throughput; runners report
  none while warming up), and the rest of the duration as overhead (start,
  compile, load, save, teardown);
- energy: the steady power, the energy counters' rise over the stepping span
  divided by its time, and the rest of the run's energy as overhead energy;
- memory: the peak per GPU, and its static part: the peak less what grew
  after ``mem_static_mib`` (reported once by the shipped training runners).

Files are read through :mod:`gpustation.files` and :mod:`gpustation.runs.tail`
(regular files only, bounded). A run whose files are damaged (``run.json``
unreadable, malformed metric lines, a file that is not a regular one) is
skipped and counted, never a crash. Telemetry is read at its two ends only
(a window of stepping is enough for the steady power), so a long run costs
what a short one does.
"""

from __future__ import annotations

import os
import stat
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpustation.files import open_regular
from gpustation.runs import rundir
from gpustation.runs.fold import finite_number
from gpustation.runs.forecast.fit import theil_sen
from gpustation.runs.forecast.model import RunFacts
from gpustation.runs.forecast.plan import PROBE_TAG, features, settings
from gpustation.runs.gputrace import SLOW_INTERVAL_S
from gpustation.runs.presets import RunPreset
from gpustation.runs.store.index import RunStore
from gpustation.runs.summary import RunSummary
from gpustation.runs.tail import file_lines, parse_metric_line
from gpustation.textsafe import safe_doc

#: the newest usable runs a forecast reads
MAX_RUNS = 12
#: bytes of telemetry read at each end of the file
TELEMETRY_END_BYTES = 256 << 10


@dataclass
class History:
    """The past runs a forecast rests on (newest first) and how many were damaged."""

    facts: list[RunFacts] = field(default_factory=list)
    skipped: int = 0


def _table(value: Any) -> dict[str, Any]:
    """A JSON object read from a run file; an empty one for a value of another shape."""
    return value if isinstance(value, dict) else {}


def same_workload(run: dict[str, Any], preset: RunPreset) -> bool:
    """Whether a past run (its ``run.json``) ran ``preset``: for a command run, the same argv."""
    recorded = _table(run.get("preset"))
    if recorded.get("name") != preset.name:
        return False
    was_command = recorded.get("origin") == "command"
    if preset.origin == "command" or was_command:
        return was_command and recorded.get("command") == safe_doc(preset.command)
    return True


def history(preset: RunPreset, store: RunStore | None = None, limit: int = MAX_RUNS) -> History:
    """The facts of the newest succeeded runs of ``preset`` (its name; a command's argv)."""
    found = History()
    records = (store or RunStore()).list_runs(status="succeeded")
    for record in records:
        if len(found.facts) >= limit:
            break
        if record.preset != preset.name or record.resumed_from or not record.run_dir:
            continue
        run = rundir.read_run(Path(record.run_dir))
        if run is None:
            found.skipped += 1
            continue
        if not same_workload(run, preset):
            continue
        try:
            facts = run_facts(record, run)
        except (OSError, ValueError, TypeError, ArithmeticError):
            facts = None
        if facts is None:
            found.skipped += 1
        else:
            found.facts.append(facts)
    return found


def _damaged(path: Path) -> bool:
    """A run file that is there but not a regular file (a FIFO, a link, a device)."""
    try:
        return not stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


@dataclass
class _Metrics:
    #: (unix time or None, seconds since start or None, step, with a throughput)
    reports: list[tuple[float | None, float | None, int, bool]] = field(default_factory=list)
    static_mib: float | None = None
    peak_mib: float | None = None
    malformed: int = 0


def _read_metrics(path: Path) -> _Metrics:
    out = _Metrics()
    for line in file_lines(path, "metrics file"):
        if line is not None and not line.strip():
            continue
        event = None if line is None else parse_metric_line(line)
        if event is None:
            out.malformed += 1
            continue
        static = finite_number(event.get("mem_static_mib"))
        if static is not None and out.static_mib is None:
            out.static_mib = static
        peak = finite_number(event.get("mem_peak_mib"))
        if peak is not None:
            out.peak_mib = peak if out.peak_mib is None else max(out.peak_mib, peak)
        step = event.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            rate = finite_number(event.get("throughput")) is not None
            times = finite_number(event.get("time")), finite_number(event.get("t"))
            out.reports.append((times[0], times[1], step, rate))
    return out


def _stepping(
    reports: list[tuple[float | None, float | None, int, bool]],
) -> tuple[float | None, float | None, float | None]:
    """(step time, first and last Unix time) of the reports after warm-up."""
    first = next((n for n, r in enumerate(reports) if r[3]), None)
    if first is None:
        # no throughput said when warm-up ended: the first report (compile) is left out
        first = 1 if len(reports) >= 3 else 0
    steady = reports[first:]
    if len(steady) < 2:
        return None, None, None
    unix = all(r[0] is not None for r in steady)
    axis = 0 if unix else 1
    points = [(float(r[2]), float(r[axis] or 0.0)) for r in steady if r[axis] is not None]
    if len(points) < len(steady):
        return None, None, None
    line = theil_sen(points)
    if line is None or line[0] <= 0:
        return None, None, None
    if not unix:
        return line[0], None, None
    return line[0], steady[0][0], steady[-1][0]


def _telemetry_ends(path: Path) -> list[dict[str, Any]]:
    """The samples at the two ends of ``telemetry.jsonl`` (all of a short file)."""
    try:
        fh = open_regular(path, "telemetry file", follow=False)
    except OSError:
        return []
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size <= 2 * TELEMETRY_END_BYTES:
            chunks = [fh.read(size)]
        else:
            head = fh.read(TELEMETRY_END_BYTES)
            fh.seek(size - TELEMETRY_END_BYTES)
            tail = fh.read(TELEMETRY_END_BYTES)
            # whole lines only: the head's last and the tail's first may be cut
            chunks = [head[: head.rfind(b"\n") + 1], tail[tail.find(b"\n") + 1 :]]
    samples = []
    for chunk in chunks:
        for line in chunk.split(b"\n"):
            event = parse_metric_line(line, check=False)
            if event is not None and isinstance(event.get("gpus"), list):
                samples.append(event)
    return samples


def _gpu_values(sample: dict[str, Any], key: str) -> dict[int, float]:
    out = {}
    for gpu in sample["gpus"]:
        if isinstance(gpu, dict) and isinstance(gpu.get("index"), int):
            value = finite_number(gpu.get(key))
            if value is not None:
                out[gpu["index"]] = value
    return out


#: the energy counter is read with the slow fields: a span without two readings
#: is measured by its power readings instead
MIN_COUNTER_SPAN_S = 0.8 * SLOW_INTERVAL_S


def _steady_power(samples: list[dict[str, Any]]) -> float | None:
    """The GPUs' power together over ``samples``: their counters' rise over the time
    between the first and last sample with a reading, per GPU; where the counters
    span too short a time, the mean of the power readings; None without either."""
    first: dict[int, tuple[float, float]] = {}
    last: dict[int, tuple[float, float]] = {}
    for sample in samples:
        t = finite_number(sample.get("time"))
        if t is None:
            continue
        for index, energy in _gpu_values(sample, "energy_j").items():
            first.setdefault(index, (t, energy))
            last[index] = (t, energy)
    total: float | None = 0.0 if first else None
    for index, (t0, e0) in first.items():
        t1, e1 = last[index]
        if t1 - t0 < MIN_COUNTER_SPAN_S or e1 < e0:
            total = None
            break
        total = (total or 0.0) + (e1 - e0) / (t1 - t0)
    if total is not None:
        return total
    powers = [sum(p.values()) for s in samples if (p := _gpu_values(s, "power_w"))]
    return sum(powers) / len(powers) if powers else None


def _power_limit(samples: list[dict[str, Any]]) -> float | None:
    limits = [v for s in samples for v in _gpu_values(s, "power_limit_w").values()]
    return statistics.median(limits) if limits else None


def run_facts(record: RunSummary, run: dict[str, Any]) -> RunFacts | None:
    """A past run's facts from its row and ``run.json``; None when its files are damaged."""
    directory = Path(record.run_dir or "")
    metrics_path = directory / rundir.METRICS_FILE
    telemetry_path = directory / rundir.TELEMETRY_FILE
    if record.duration_s is None or record.duration_s <= 0:
        return None
    if record.malformed_metrics or _damaged(metrics_path) or _damaged(telemetry_path):
        return None
    args = _table(_table(run.get("preset")).get("args"))
    steps_arg, batch, seq = features(args, record.summary)
    metrics = _read_metrics(metrics_path)
    if metrics.malformed:
        return None
    steps = record.steps if record.steps and record.steps > 0 else steps_arg
    step_s, t0, t1 = _stepping(metrics.reports)
    overhead_s = None
    if step_s is not None and steps:
        overhead_s = record.duration_s - steps * step_s
    samples = _telemetry_ends(telemetry_path)
    window = [
        s
        for s in samples
        if t0 is not None
        and t1 is not None
        and (t := finite_number(s.get("time"))) is not None
        and t0 <= t <= t1
    ]
    # the energy of a GPU another run shared is the GPU's, not this run's
    energy = None if record.energy_shared else record.energy_j
    steady = _steady_power(window)
    if steady is None and energy is not None:
        steady = record.avg_power_w
    overhead_energy = None
    if energy is not None and steady is not None and step_s is not None and steps:
        overhead_energy = energy - steady * steps * step_s
    peak = record.peak_vram_mib
    static = None
    if peak is not None and metrics.static_mib is not None:
        grown = max(0.0, (metrics.peak_mib or metrics.static_mib) - metrics.static_mib)
        static = max(0.0, peak - grown)
    return RunFacts(
        run_id=record.id,
        duration_s=record.duration_s,
        started_at=record.started_at,
        steps=steps,
        batch_size=batch,
        seq_len=seq,
        gpu_count=max(1, len(record.gpus)),
        power_limit_w=_power_limit(window or samples),
        step_s=step_s,
        overhead_s=overhead_s,
        energy_j=energy,
        steady_power_w=steady,
        overhead_energy_j=overhead_energy,
        peak_mib=peak,
        static_mib=static,
        settings=settings(args),
        simulated=record.simulated,
        probe=PROBE_TAG in record.tags,
    )
