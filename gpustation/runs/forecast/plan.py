"""The run about to start, as a forecast sees it: its features and its GPUs' room.

A run's features are read from its preset's arguments (``--set`` applied):
``steps``, ``batch_size`` and ``seq_len`` (work per step per GPU is batch x
sequence for token runners, the batch for image runners); the other
arguments are its settings, which a past run must share to count as like it
(less those that change neither time nor memory: the seed, the learning
rate, how often it logs). Its GPUs' room (memory free, power limit) is read
from the backend, or from the dashboard's last sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpustation.runs.forecast.model import GpuRoom, Plan
from gpustation.runs.presets import RunPreset
from gpustation.telemetry.backend import Backend
from gpustation.telemetry.model import GpuSample

#: the arguments that are features of a run (scaled by the forecast), not settings
FEATURE_KEYS = ("steps", "batch_size", "seq_len")
#: arguments that change neither a run's time nor its memory
NEUTRAL_KEYS = ("seed", "lr", "log_every", "warmup_steps", "output_dir")
#: the warm-up a runner without a ``warmup_steps`` argument is taken to have
DEFAULT_WARMUP_STEPS = 10
#: the tag of a probe run (``run --dry-run --probe``)
PROBE_TAG = "probe"


def whole(value: Any) -> int | None:
    """A positive whole number from an argument or a summary (None for anything else)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def features(
    args: Mapping[str, Any], summary: Mapping[str, Any] | None = None
) -> tuple[int | None, int | None, int | None]:
    """(steps, batch size, sequence length) from a run's arguments, else from what
    its summary says it ran with (a runner's default the preset did not set)."""
    summary = summary or {}
    found = []
    for key in FEATURE_KEYS:
        value = whole(args.get(key))
        found.append(value if value is not None else whole(summary.get(key)))
    return found[0], found[1], found[2]


def settings(args: Mapping[str, Any]) -> dict[str, Any]:
    """A run's other arguments: what a past run must share to count as like it."""
    return {k: v for k, v in args.items() if k not in FEATURE_KEYS and k not in NEUTRAL_KEYS}


def room_of(sample: GpuSample) -> GpuRoom:
    return GpuRoom(
        index=sample.index,
        total_mib=sample.memory_total_mib,
        used_mib=sample.memory_used_mib,
        power_limit_w=sample.power_limit_w,
    )


def read_rooms(backend: Backend, indices: Sequence[int]) -> list[GpuRoom]:
    """The memory and power limit of ``indices`` now; none where the backend cannot say."""
    if not indices:
        return []
    try:
        samples = backend.read_gpus(list(indices), slow=False)
    except Exception:  # a forecast never stops a launch: no room read, no verdict
        return []
    return [room_of(s) for s in samples if not s.lost]


def plan_of(
    preset: RunPreset, gpus: Sequence[int], rooms: Sequence[GpuRoom] = (), simulated: bool = False
) -> Plan:
    """The plan of ``preset`` (its ``--set`` values applied) on ``gpus``."""
    steps, batch, seq = features(preset.args)
    chosen = tuple(gpus)
    mine = tuple(r for r in rooms if r.index in chosen)
    limits = sorted(r.power_limit_w for r in mine if r.power_limit_w is not None)
    return Plan(
        preset=preset.name,
        steps=steps,
        batch_size=batch,
        seq_len=seq,
        gpus=chosen,
        power_limit_w=limits[len(limits) // 2] if limits else None,
        settings=settings(preset.args),
        simulated=simulated,
        rooms=mine,
    )
