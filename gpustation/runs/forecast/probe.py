"""``run --dry-run --probe``: run a preset for a few steps, so a forecast has history.

A probe is a real run, launched and supervised as any other, of the preset
as it would run (its ``--set`` values and GPUs) but for ``steps`` steps: by
default the runner's warm-up and 20 more, enough for a steady step time past
compilation. It is tagged ``probe`` and stays in the history: probe runs are
facts like any other, so the forecast that follows rests on it (and on any
past run of the preset). Ctrl-C stops it as it stops any run.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from gpustation.errors import GpustationError, UsageError
from gpustation.runs.follow import RunFollower
from gpustation.runs.forecast.plan import DEFAULT_WARMUP_STEPS, PROBE_TAG, whole
from gpustation.runs.launch.start import launch
from gpustation.runs.launch.stop import DEFAULT_GRACE_S, stop_run
from gpustation.runs.presets import RunPreset
from gpustation.runs.summary import RunSummary

#: steps a probe runs past its runner's warm-up
STEPS_PAST_WARMUP = 20
#: the most steps ``--probe N`` takes: a probe is short, a long one is a run
MAX_PROBE_STEPS = 10_000


def probe_steps(preset: RunPreset, wanted: int | None = None) -> int:
    """The steps a probe of ``preset`` runs: ``wanted``, else its warm-up and 20 more."""
    if wanted is not None:
        if not 1 <= wanted <= MAX_PROBE_STEPS:
            raise UsageError(f"from 1 to {MAX_PROBE_STEPS} steps, got {wanted}", field="probe")
        return wanted
    warmup = whole(preset.args.get("warmup_steps")) or DEFAULT_WARMUP_STEPS
    return warmup + STEPS_PAST_WARMUP


def probe_preset(preset: RunPreset) -> RunPreset:
    """``preset`` tagged ``probe``; a UsageError for a preset a probe cannot shorten."""
    if "steps" not in preset.args and preset.runner is None:
        raise UsageError(
            f"preset {preset.name!r} has no steps argument, so a probe cannot run a few "
            "steps of it; give it one ([args] steps = N) or forecast from a whole run",
            field="probe",
        )
    tags = preset.tags if PROBE_TAG in preset.tags else [*preset.tags, PROBE_TAG]
    return replace(preset, tags=tags)


def run_probe(
    preset: RunPreset,
    steps: int,
    gpus: Sequence[int] | None,
    *,
    simulate: int | None = None,
    sim_card: str | None = None,
    stop_grace_s: float = DEFAULT_GRACE_S,
    on_start: Callable[[str, Path], None] | None = None,
    on_progress: Callable[[RunSummary], None] | None = None,
    poll_s: float = 0.2,
) -> RunSummary:
    """Run ``steps`` steps of ``preset`` (its ``--set`` values applied) to the end.

    ``on_start`` is told the run's id and directory, ``on_progress`` the run as
    it goes. Returns the finished run; a probe that did not succeed raises
    GpustationError naming it. Ctrl-C (KeyboardInterrupt) stops the probe run.
    """
    probe = probe_preset(preset)
    # Ctrl-C while the run starts must stop it too, not leave it behind the command
    interrupts: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupts.append(1)) if main else None
    try:
        handle = launch(
            probe,
            {"steps": steps},
            gpus,
            simulate=simulate,
            sim_card=sim_card,
            stop_grace_s=stop_grace_s,
        )
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    if on_start is not None:
        on_start(handle.id, handle.run_dir)
    follower = RunFollower(handle.run_dir)
    try:
        if interrupts:
            raise KeyboardInterrupt
        while True:
            update = follower.poll()
            if on_progress is not None and (update.events or update.ended):
                on_progress(follower.summary())
            if update.ended:
                break
            if not update.lines and not update.events:
                time.sleep(poll_s)
    except KeyboardInterrupt:
        stop_run(handle.run_dir, grace_s=stop_grace_s, by="gpustation run --probe (Ctrl-C)")
        raise
    finally:
        follower.close()
    run = follower.summary()
    if run.status != "succeeded":
        raise GpustationError(
            f"the probe run {run.id} {run.status_text()}"
            + (f": {run.reason}" if run.reason else "")
            + f"; `gpustation runs show {run.id}` says more"
        )
    return run
