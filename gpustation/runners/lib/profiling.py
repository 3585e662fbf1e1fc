"""The training runners' step profiler: ``--profile-steps N`` records N steps
after warm-up with torch.profiler, leaves a Chrome trace and the top CUDA
kernels and CPU ops by self time in the run's ``profile/`` directory, and
sums them up for the run's summary.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gpustation.runners.lib import common

PROFILE_DIR = "profile"
TOP_OPS = 15


def add_profile_arg(parser: argparse.ArgumentParser) -> None:
    """``--profile-steps N``, shared by the training runners."""
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="after warm-up, record a torch.profiler trace of N steps to "
        "OUTPUT_DIR/profile/trace.json (Chrome trace: Perfetto, TensorBoard) and the top "
        "kernels and CPU ops by self time to OUTPUT_DIR/profile/top_ops.json; those steps "
        "are not timed (0: off)",
    )


class StepProfiler:
    """Records ``steps`` training steps with torch.profiler right after warm-up.

    Call :meth:`before_step` and :meth:`after_step` around every step; the
    profiled steps are the ``steps`` after ``warmup``. :attr:`timer_warmup`
    is the warm-up to give :class:`common.StepTimer` so profiled steps are not timed.
    """

    def __init__(
        self,
        steps: int,
        warmup: int,
        total_steps: int,
        device: torch.device,
        out_dir: Callable[[], Path],
        enabled: bool = True,
    ) -> None:
        wanted = max(0, min(steps, total_steps - warmup))
        self.steps = wanted if enabled else 0
        self.first = warmup + 1
        self.last = warmup + self.steps
        self.device = device
        self._out_dir = out_dir
        self._prof: Any = None
        self._t0 = 0.0
        self.result: dict[str, Any] | None = None
        # The same on every rank, whether or not this rank records.
        self.timer_warmup = min(warmup + wanted, max(0, total_steps - 1)) if wanted else warmup

    def before_step(self, step: int) -> None:
        if not self.steps or step != self.first:
            return
        # start-up time: torch.profiler, only where it is used
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        common.sync(self.device)
        self._prof = profile(activities=activities, record_shapes=False)
        self._prof.start()
        self._t0 = time.perf_counter()

    def after_step(self, step: int) -> None:
        if self._prof is None or step != self.last:
            return
        common.sync(self.device)
        wall_us = (time.perf_counter() - self._t0) * 1e6
        self._prof.stop()
        directory = self._out_dir() / PROFILE_DIR
        directory.mkdir(parents=True, exist_ok=True)
        trace = directory / "trace.json"
        self._prof.export_chrome_trace(str(trace))
        self.result = summarize_profile(self._prof, wall_us, self.steps, self.device)
        self.result["trace"] = str(trace)
        (directory / "top_ops.json").write_text(
            json.dumps(self.result, indent=2) + "\n", encoding="utf-8"
        )
        self._prof = None

    def summary(self) -> dict[str, Any]:
        """What goes into the run's summary (nothing when profiling was off)."""
        if not self.result:
            return {}
        r = self.result
        out = {
            "profile_trace": r["trace"],
            "profile_steps": r["profiled_steps"],
            "profile_step_ms": r["step_ms"],
            "profile_gpu_idle_pct": r.get("gpu_idle_pct"),
        }
        top = r.get("cuda_kernels") or r.get("cpu_ops") or []
        out["profile_top_op"] = top[0]["name"] if top else None
        return out


def profiler_and_timer(
    args: argparse.Namespace, warmup: int, device: torch.device, dist: common.Dist
) -> tuple[StepProfiler, common.StepTimer]:
    """A training run's ``--profile-steps`` profiler (rank 0 records) and its step timer.

    The timer's warm-up runs past the profiled steps, so they are not timed:
    read the run's timed steps from the timer's ``warmup_steps``.
    """
    prof = StepProfiler(
        args.profile_steps, warmup, args.steps, device, lambda: common.output_dir(args),
        enabled=dist.is_main,
    )  # fmt: skip
    return prof, common.StepTimer(device, prof.timer_warmup)


def summarize_profile(
    prof: Any, wall_us: float, steps: int, device: torch.device
) -> dict[str, Any]:
    """Top CUDA kernels and CPU ops by self time, their share of the profiled steps,
    and on CUDA the time the GPU sat idle between kernels."""
    # start-up time: torch.profiler, only where it is used
    from torch.profiler import DeviceType

    total_us = max(wall_us, 1e-9)
    cpu_ops = []
    for evt in prof.key_averages():
        if evt.device_type != DeviceType.CPU or evt.self_cpu_time_total <= 0:
            continue
        cpu_ops.append(
            {
                "name": evt.key,
                "self_ms": evt.self_cpu_time_total / 1e3,
                "calls": evt.count,
                "share": evt.self_cpu_time_total / total_us,
            }
        )
    cpu_ops.sort(key=lambda r: -r["self_ms"])
    result: dict[str, Any] = {
        "profiled_steps": steps,
        "step_ms": round(wall_us / 1e3 / max(1, steps), 3),
        "profiled_ms": round(wall_us / 1e3, 3),
        "device": str(device),
        "cpu_ops": [_round_row(r) for r in cpu_ops[:TOP_OPS]],
    }
    if device.type == "cuda":
        kernels: dict[str, dict[str, float]] = {}
        spans: list[tuple[float, float]] = []
        for evt in prof.events():
            if evt.device_type != DeviceType.CUDA:
                continue
            start, end = float(evt.time_range.start), float(evt.time_range.end)
            if end <= start:
                continue
            spans.append((start, end))
            k = kernels.setdefault(evt.name, {"self_ms": 0.0, "calls": 0})
            k["self_ms"] += (end - start) / 1e3
            k["calls"] += 1
        rows: list[dict[str, Any]] = [
            {"name": n, "self_ms": v["self_ms"], "calls": int(v["calls"]),
             "share": v["self_ms"] * 1e3 / total_us}
            for n, v in kernels.items()
        ]  # fmt: skip
        rows.sort(key=lambda r: -float(r["self_ms"]))
        result["cuda_kernels"] = [_round_row(r) for r in rows[:TOP_OPS]]
        busy, idle = _busy_and_gaps(spans)
        result["gpu_busy_ms"] = round(busy / 1e3, 3)
        result["gpu_idle_between_kernels_ms"] = round(idle / 1e3, 3)
        result["gpu_idle_pct"] = round(100 * (1 - busy / total_us), 2)
    return result


def _busy_and_gaps(spans: list[tuple[float, float]]) -> tuple[float, float]:
    """(time covered by at least one kernel, gaps between the first and last kernel), in µs."""
    if not spans:
        return 0.0, 0.0
    spans.sort()
    busy = 0.0
    cur_s, cur_e = spans[0]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    return busy, (cur_e - spans[0][0]) - busy


def _round_row(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": row["name"],
        "self_ms": round(row["self_ms"], 4),
        "calls": row["calls"],
        "share": round(row["share"], 4),
    }
