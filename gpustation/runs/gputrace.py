"""The GPU telemetry of a run: recorded at 1 Hz, summed up at the end.

The supervisor appends one compact JSON line per sample to
``telemetry.jsonl``::

    {"t": 12.0, "gpus": [{"index": 0, "power_w": 301.2, "power_limit_w": 450.0,
      "temperature_c": 64, "memory_used_mib": 20480, "utilization_gpu_pct": 99,
      "energy_j": 123456.0, "throttle": ["sw_power_cap"]}]}

:func:`summarize_telemetry` turns the file into the figures the run store
keeps: energy (from the cards' energy counters when they move, else power
integrated over time), average and peak power of the run's GPUs together, peak
temperature and VRAM of any one of them, and the seconds during which any of
them was held back by a power, thermal or slowdown limit.

Two runs on one GPU: a GPU's energy counter counts every process on it, so
each run's figure would be the whole GPU's. Where the card reports its
processes (NVML does, in the sampled ``processes``), the runs on a GPU keep
one account of its energy together (:mod:`gpustation.runs.gpushare`): every
rise of the counter split between the runs, other processes and idle time by
the SM shares of all their samples, so the parts of all add up to the
counter. Each sample line carries the run's part of the entries closed since
the last one (``gpu_energy``: ``[t0, t1, rise_j, part_j, seen]``), and the
run's energy on that GPU is the sum of its parts, marked estimated
(``energy_estimated``) when other processes had some. A run alone on its GPU
has every part: its energy is the counter's, as ever.

Where there is no account (a run whose state directory is read-only, an older
run) each sample's ``run_share`` (the run's processes' SM share plus an even
part of the idle time, ``telemetry/shares.py`` says why) splits the counter
instead. Where it cannot be told (no process list, or the run's PIDs are not
in it: a container's PID namespace, simulated GPUs), nothing is split; a run
that shared a GPU with another gpustation run (the launcher notes it, in both
run directories, as ``shared-gpus``) then has its energy marked shared:
``energy_shared`` in the summary, "(shared)" beside the figure.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpustation import private
from gpustation.runs.gpushare import GpuAccount
from gpustation.runs.tail import file_lines, parse_metric_line
from gpustation.telemetry.model import LIMITING_REASONS, Snapshot
from gpustation.telemetry.registry import open_backend
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.shares import gpu_shares

#: how often a run's GPUs are sampled
SAMPLE_INTERVAL_S = 1.0
#: how often their slow fields are: energy (a cumulative counter, so every few
#: seconds is enough) and PCIe throughput (slow to read on NVML)
SLOW_INTERVAL_S = 5.0


def run_share(processes: list[Any], pids: set[int]) -> float | None:
    """The run's part of a GPU over the last interval (None: unknown).

    From the processes' SM shares where the driver gives them all, else from
    their memory. 0 when other processes are listed and none of the run's (one
    still starting, or in another PID namespace: :func:`summarize_telemetry`
    tells which by whether the run was ever seen on the GPU).
    """
    if not processes:
        return None
    if not any(proc.pid in pids for proc in processes):
        return 0.0
    if all(isinstance(getattr(proc, "sm_pct", None), (int, float)) for proc in processes):
        return round(min(1.0, gpu_shares(processes).of(pids)), 4)
    total = own = 0.0
    seen = False
    for proc in processes:
        mem = getattr(proc, "gpu_memory_mib", None)
        if not isinstance(mem, (int, float)) or mem < 0:
            continue
        total += float(mem)
        if proc.pid in pids:
            own += float(mem)
            seen = True
    if not seen or total <= 0:
        return None
    return round(min(1.0, own / total), 4)


def compact_sample(snapshot: Snapshot, t: float, pids: set[int] | None = None) -> dict[str, Any]:
    """The line recorded for one snapshot, ``t`` seconds into the run.

    ``pids``: the run's processes, for each GPU's ``run_share``.
    """
    gpus = []
    for gpu in snapshot.gpus:
        share = run_share(list(gpu.processes or ()), pids) if pids else None
        gpus.append(
            {
                "index": gpu.index,
                "power_w": gpu.power_w,
                # the limit in force, so a forecast can tell runs at other limits apart
                "power_limit_w": gpu.power_limit_w,
                "temperature_c": gpu.temperature_c,
                # HBM cards only (None on GDDR cards, which have no memory sensor)
                "memory_temperature_c": gpu.memory_temperature_c,
                "memory_used_mib": gpu.memory_used_mib,
                "utilization_gpu_pct": gpu.utilization_gpu_pct,
                "energy_j": gpu.energy_j,
                "throttle": [r for r in gpu.throttle_reasons or () if r in LIMITING_REASONS],
                # real tensor-pipe activity where the card has GPM (None elsewhere)
                "tensor_active_pct": gpu.tensor_active_pct,
                **({"run_share": share} if share is not None else {}),
            }
        )
    # ``time`` (Unix seconds) lines telemetry up with the run's metrics, whose
    # ``t`` counts from another start: a sweep leaves out the warm-up by it.
    return {"t": round(t, 3), "time": round(snapshot.time, 3), "gpus": gpus}


class TraceSampler:
    """Reads a run's GPUs into the lines of its telemetry, :func:`compact_sample`'s.

    Only the given GPUs (None: all), without host or topology figures. Opening
    the backend, and each :meth:`line`, raise what the backend raises: the
    caller turns the telemetry off, never the run. With ``run_id`` each GPU's
    energy is also kept in the account the runs on it share
    (:mod:`gpustation.runs.gpushare`), and the run's part of each entry closed
    goes in the line as ``gpu_energy``.
    """

    def __init__(
        self,
        gpus: list[int] | None,
        t0: float,
        simulate: int | None = None,
        sim_card: str | None = None,
        run_id: str | None = None,
    ) -> None:
        self.backend = open_backend(simulate=simulate, sim_card=sim_card)
        self.sampler = Sampler(
            self.backend,
            gpus=gpus,
            slow_interval_s=SLOW_INTERVAL_S,
            with_host=False,
            with_topology=False,
        )
        #: when the run started (time.monotonic()): the lines' ``t`` counts from it
        self.t0 = t0
        self.run_id = run_id
        #: why the shared energy accounts were given up (None: kept, or never asked)
        self.account_error: str | None = None
        self._accounts: dict[int, GpuAccount] = {}
        self._energy_read: dict[int, float | None] = {}
        #: the snapshot the last line was made from (the slowdown watch's evidence)
        self.last: Snapshot | None = None

    def line(self, pids: set[int] | None = None, final: bool = False) -> dict[str, Any]:
        """The GPUs now; ``final`` reads the slow fields too (the counters at the end)."""
        snap = self.last = self.sampler.sample(slow=True if final else None)
        line = compact_sample(snap, time.monotonic() - self.t0, pids)
        if self.run_id is not None and pids:
            try:
                for gpu, entry in zip(snap.gpus, line["gpus"], strict=True):
                    taken = self._account(gpu, pids, snap.time)
                    if taken:
                        entry["gpu_energy"] = taken
            except OSError as err:
                # The split falls back to the run's own shares (summarize_telemetry).
                self.account_error = f"GPU energy accounts not kept: {err}"
                self.run_id = None
        return line

    def _account(self, gpu: Any, pids: set[int], now: float) -> list[list[float]]:
        if gpu.uuid is None:
            return []
        account = self._accounts.get(gpu.index)
        if account is None:
            account = self._accounts[gpu.index] = GpuAccount(gpu.uuid, str(self.run_id))
        # Slow fields are carried between slow passes: a counter is new only when it moved.
        fresh = gpu.energy_j if gpu.energy_j != self._energy_read.get(gpu.index) else None
        self._energy_read[gpu.index] = gpu.energy_j
        return account.add(gpu, fresh, pids, now)

    def close(self) -> None:
        for account in self._accounts.values():
            account.leave()
        with contextlib.suppress(Exception):
            self.backend.close()


def write_sample(path: Path, sample: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8", opener=private.opener) as fh:
        fh.write(json.dumps(sample, separators=(",", ":")) + "\n")


@dataclass
class TelemetrySummary:
    samples: int = 0
    duration_s: float = 0.0
    energy_j: float | None = None
    avg_power_w: float | None = None
    peak_power_w: float | None = None
    peak_temp_c: float | None = None
    peak_memory_temp_c: float | None = None
    peak_vram_mib: float | None = None
    throttled_s: float | None = None
    #: some of the energy was split by the run's share of its GPU (see the module)
    split: bool = False
    #: some of it was a part of a GPU shared with other processes: an estimate
    estimated: bool = False
    #: mean tensor-pipe activity over the samples that have it (GPM cards)
    tensor_active_pct: float | None = None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _max(current: float | None, value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return current
    return float(value) if current is None else max(current, float(value))


def _account_entry(entry: Any) -> bool:
    """``[t0, t1, rise_j, part_j, seen]`` as :class:`~gpustation.runs.gpushare.GpuAccount` gives."""
    return (
        isinstance(entry, list)
        and len(entry) == 5
        and all(_number(v) and math.isfinite(v) for v in entry)
        and 0 <= entry[3] <= entry[2] * (1 + 1e-6)
    )


def summarize_telemetry(path: Path) -> TelemetrySummary:
    """Energy, power, temperature, VRAM and throttle time from ``telemetry.jsonl``."""
    summary = TelemetrySummary()
    samples: list[dict[str, Any]] = []
    try:
        for line in file_lines(path, "telemetry file"):
            event = None if line is None else parse_metric_line(line, check=False)
            if (
                event is not None
                and isinstance(event.get("gpus"), list)
                and _number(event.get("t", 0.0))
            ):
                samples.append(event)
    except OSError:
        return summary
    if not samples:
        return summary
    summary.samples = len(samples)
    first_t = float(samples[0].get("t") or 0.0)
    summary.duration_s = max(0.0, float(samples[-1].get("t") or 0.0) - first_t)

    # Per GPU: energy counter at the first and last sample; power integrated;
    # both also weighted interval by interval by the run's share of the GPU.
    counter_first: dict[int, float] = {}
    counter_last: dict[int, float] = {}
    integrated: dict[int, float] = {}
    counter_mine: dict[int, float] = {}
    integrated_mine: dict[int, float] = {}
    # power-weighted steps since each GPU's counter last moved: all, and the run's
    since_all: dict[int, float] = {}
    since_mine: dict[int, float] = {}
    # per GPU, from the account the runs on it share (runs/gpushare.py): the
    # counter's rises over the run's entries and the run's part of them
    shared_rise: dict[int, float] = {}
    shared_part: dict[int, float] = {}
    shared_seen: set[int] = set()
    prev_t: float | None = None
    prev_power: dict[int, float] = {}
    throttled = 0.0
    any_throttle_info = False
    tensor_values: list[float] = []
    # A run never seen on a GPU (its PIDs in another namespace) has no known
    # share there: its zeros say nothing.
    seen_on = {
        int(gpu["index"])
        for sample in samples
        for gpu in sample["gpus"]
        if isinstance(gpu, dict)
        and _number(gpu.get("index"))
        and _number(gpu.get("run_share"))
        and gpu["run_share"] > 0
    }
    for sample in samples:
        t = float(sample.get("t") or 0.0)
        dt = t - prev_t if prev_t is not None else 0.0
        total_power: float | None = None
        now_throttled = False
        for gpu in sample["gpus"]:
            if not isinstance(gpu, dict) or not _number(gpu.get("index", -1)):
                continue
            index = int(gpu.get("index", -1))
            share = gpu.get("run_share")
            if isinstance(share, (int, float)) and 0.0 <= share <= 1.0 and index in seen_on:
                summary.split = True
                summary.estimated = summary.estimated or share < 1.0
                weight = float(share)
            else:
                weight = 1.0
            power = gpu.get("power_w")
            if isinstance(power, (int, float)) and not isinstance(power, bool):
                total_power = (total_power or 0.0) + float(power)
                if index in prev_power and dt > 0:
                    step = dt * (prev_power[index] + float(power)) / 2.0
                    integrated[index] = integrated.get(index, 0.0) + step
                    integrated_mine[index] = integrated_mine.get(index, 0.0) + step * weight
                    since_all[index] = since_all.get(index, 0.0) + step
                    since_mine[index] = since_mine.get(index, 0.0) + step * weight
                prev_power[index] = float(power)
            energy = gpu.get("energy_j")
            if isinstance(energy, (int, float)) and not isinstance(energy, bool):
                if index in counter_last and float(energy) >= counter_last[index]:
                    rise = float(energy) - counter_last[index]
                    # The counter is read less often than the shares: its rise
                    # is the run's by the shares of the samples it spans.
                    drawn = since_all.get(index, 0.0)
                    part = since_mine.get(index, 0.0) / drawn if drawn > 0 else weight
                    counter_mine[index] = counter_mine.get(index, 0.0) + part * rise
                    if rise > 0:
                        since_all[index] = since_mine[index] = 0.0
                counter_first.setdefault(index, float(energy))
                counter_last[index] = float(energy)
            for entry in gpu.get("gpu_energy") or ():
                if _account_entry(entry):
                    shared_rise[index] = shared_rise.get(index, 0.0) + float(entry[2])
                    shared_part[index] = shared_part.get(index, 0.0) + float(entry[3])
                    if entry[4]:
                        shared_seen.add(index)
            summary.peak_temp_c = _max(summary.peak_temp_c, gpu.get("temperature_c"))
            summary.peak_memory_temp_c = _max(
                summary.peak_memory_temp_c, gpu.get("memory_temperature_c")
            )
            tensor = gpu.get("tensor_active_pct")
            if isinstance(tensor, (int, float)) and not isinstance(tensor, bool):
                tensor_values.append(float(tensor))
            summary.peak_vram_mib = _max(summary.peak_vram_mib, gpu.get("memory_used_mib"))
            if "throttle" in gpu:
                any_throttle_info = True
                now_throttled = now_throttled or bool(gpu.get("throttle"))
        summary.peak_power_w = _max(summary.peak_power_w, total_power)
        # An interval counts as throttled when it ends throttled (1 s resolution).
        if dt > 0 and now_throttled:
            throttled += dt
        prev_t = t

    indices = set(prev_power) | set(counter_last)
    if indices:
        energy = 0.0
        known = False
        for index in indices:
            moved = counter_last.get(index, 0.0) - counter_first.get(index, 0.0)
            if index in shared_seen:
                # The account's parts add up to the counter with every other run's.
                energy += shared_part[index]
                summary.split = True
                summary.estimated = summary.estimated or (
                    shared_part[index] < shared_rise[index] * (1 - 1e-6)
                )
                known = True
            elif index in counter_last and moved > 0:
                energy += counter_mine.get(index, 0.0) if summary.split else moved
                known = True
            elif index in integrated:
                energy += integrated_mine[index] if summary.split else integrated[index]
                known = True
        summary.energy_j = energy if known else None
    # Average power from the samples (time-weighted), so it never exceeds the
    # peak; energy prefers the cards' own counters, which see between samples.
    if summary.duration_s > 0 and integrated:
        summary.avg_power_w = sum(integrated.values()) / summary.duration_s
    elif summary.peak_power_w is not None and summary.samples == 1:
        summary.avg_power_w = summary.peak_power_w
    summary.throttled_s = throttled if any_throttle_info else None
    if tensor_values:
        summary.tensor_active_pct = sum(tensor_values) / len(tensor_values)
    return summary
