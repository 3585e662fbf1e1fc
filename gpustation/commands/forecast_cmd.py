"""``gpustation run ... --dry-run [--probe [N]] [--json]``: a run's forecast, before it starts.

The preset, the ``--set`` values and the GPUs are resolved as a launch
resolves them (``runs/launch/start.py``'s ``prepare``); the argv that would
run and the forecast (``runs/forecast/``) are printed and nothing starts.
``--probe`` first runs the preset for a few steps, as a real run tagged
``probe``, so a preset that never ran here has history to forecast from.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from gpustation.commands.run_follow import Progress
from gpustation.errors import EXIT_OK, UsageError
from gpustation.runs.cost import price_or_none
from gpustation.runs.forecast.probe import probe_steps, run_probe
from gpustation.runs.launch.argv import build_argv, resolve_gpus
from gpustation.runs.launch.start import prepare
from gpustation.runs.output import strict_json
from gpustation.runs.presets import RunPreset
from gpustation.telemetry.backend import parse_gpu_list
from gpustation.textsafe import safe

#: ``--probe`` given without a number: the runner's warm-up and 20 more steps
DEFAULT_PROBE = -1


def add_arguments(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group(
        "forecast", "what a run would take, from the history of the same preset or command"
    )
    group.add_argument(
        "--dry-run",
        action="store_true",
        help="start nothing: print the argv the run would get and its forecast (time, GPU "
        "energy and cost, peak GPU memory against each GPU's free memory)",
    )
    group.add_argument(
        "--probe",
        nargs="?",
        type=int,
        const=DEFAULT_PROBE,
        default=None,
        metavar="N",
        help="with --dry-run: first run the preset for N steps (default: its warm-up and 20 "
        "more) as a run tagged probe, then forecast from the history it joins",
    )
    group.add_argument(
        "--json", action="store_true", help="with --dry-run: the argv and the forecast as JSON"
    )


def check_unused(args: argparse.Namespace) -> None:
    """A UsageError for the forecast's options given without ``--dry-run``."""
    if args.probe is not None or args.json:
        raise UsageError("--probe and --json go with --dry-run (a run's forecast)")


def _warn(problem: str) -> None:
    print(f"gpustation: warning: {problem}", file=sys.stderr)


def dry_run(
    args: argparse.Namespace,
    preset: RunPreset,
    sets: dict[str, str],
    wrap: list[str],
    multinode: bool,
    resumed: bool,
) -> int:
    """Print what ``gpustation run`` would start and its forecast; start nothing
    (but a probe, with ``--probe``)."""
    # start-up time: the run history (sqlite3) and rich, which only a dry run reads
    from gpustation.runs.forecast.make import forecast_for
    from gpustation.runs.forecast.text import forecast_line

    for flag, given in (
        ("--queue", args.queue),
        ("--detach", args.detach),
        ("--hosts", multinode),
        ("--resume", resumed),
    ):
        if given:
            raise UsageError(f"--dry-run starts nothing, so {flag} does not go with it")
    gpus = parse_gpu_list(getattr(args, "gpus", None))
    simulate, sim_card = getattr(args, "simulate", None), getattr(args, "sim_card", None)
    request, device_count = prepare(
        preset, sets, simulate=simulate, sim_card=sim_card, stop_grace_s=args.grace, wrap=wrap
    )
    chosen = resolve_gpus(request.preset, gpus, device_count)
    for warning in request.warnings:
        _warn(warning)
    probe_id = None
    if args.probe is not None:
        probe_id = _probe(args, request.preset, gpus, simulate, sim_card)
        # the GPUs' room as the probe left it
        request, device_count = prepare(
            preset, sets, simulate=simulate, sim_card=sim_card, stop_grace_s=args.grace
        )
    simulated = bool(request.backend.get("simulated"))
    fc = forecast_for(
        request.preset,
        chosen,
        request.rooms or [],
        simulated=simulated,
        price=price_or_none(_warn),
    )
    argv = [*wrap, *build_argv(request.preset, chosen)]
    line = forecast_line(fc)
    if args.json:
        doc: dict[str, Any] = {
            "preset": request.preset.name,
            "title": request.preset.display_title,
            "argv": argv,
            "gpus": chosen,
            "simulated": simulated,
            "warnings": list(request.warnings),
            "probe_run": probe_id,
            "forecast": {**fc.to_dict(), "text": line},
        }
        print(strict_json(doc))
        return EXIT_OK
    where = ",".join(map(str, chosen)) or "none"
    print(
        f"gpustation: dry run of {request.preset.display_title} on GPUs {where}"
        + (" SIMULATED" if simulated else "")
        + "; nothing started",
        file=sys.stderr,
    )
    env = f"CUDA_VISIBLE_DEVICES={where if chosen else ''} " if device_count else ""
    print(f"command: {safe(env + shlex.join(argv))}")
    print(f"forecast: {line}")
    return EXIT_OK


def _probe(
    args: argparse.Namespace,
    preset: RunPreset,
    gpus: list[int] | None,
    simulate: int | None,
    sim_card: str | None,
) -> str:
    """Run the probe, its progress on stderr; its run id."""
    steps = probe_steps(preset, None if args.probe == DEFAULT_PROBE else args.probe)
    progress = Progress(f"probe of {preset.display_title}")

    def started(run_id: str, _directory: object) -> None:
        print(
            f"gpustation: probing {preset.display_title}: run {run_id}, {steps} steps",
            file=sys.stderr,
            flush=True,
        )

    try:
        run = run_probe(
            preset,
            steps,
            gpus,
            simulate=simulate,
            sim_card=sim_card,
            stop_grace_s=args.grace,
            on_start=started,
            on_progress=progress.update,
        )
    finally:
        progress.close()
    print(f"gpustation: probe run {run.id} succeeded", file=sys.stderr, flush=True)
    return run.id
