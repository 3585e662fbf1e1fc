"""``gpustation sweep PRESET --set KEY=A,B [--power-limit 60%,80%]``: find the cheapest setting.

Runs the grid one point at a time (each a run in the history), then prints a
table of the points, a plot of throughput against energy per unit with the
Pareto front, and a recommendation; the plot is also written as SVG in the
sweep's directory. ``--dry-run`` prints the plan and changes nothing.
"""

from __future__ import annotations

import argparse
import math
import signal
import statistics
import sys
import time
from pathlib import Path

from gpustation import colour
from gpustation.commands.options import add_gpu_options, backend_from_args
from gpustation.control import lease
from gpustation.errors import EXIT_INTERRUPTED, EXIT_OK, GpustationError, UsageError
from gpustation.notify import notify_warnings
from gpustation.runs import rundir
from gpustation.runs.launch.argv import resolve_gpus
from gpustation.runs.launch.start import launch
from gpustation.runs.launch.stop import stop_run
from gpustation.runs.output import console
from gpustation.runs.presets import RunPreset, find_preset, load_presets
from gpustation.runs.sweep.model import (
    Sweep,
    check_preset_takes,
    grid,
    new_sweep_id,
    parse_axes,
    parse_power_axis,
    plan_limits,
)
from gpustation.runs.sweep.owner import (
    holding_sweeps,
    leftovers_text,
    restore_leftovers,
    runs_on,
    runs_text,
    unrestored,
    wait_for_runs,
)
from gpustation.runs.sweep.report import (
    TEXT_COLUMNS,
    constants,
    point_columns,
    point_label,
    point_rows,
    recommendation_text,
    svg_plot,
    terminal_plot,
)
from gpustation.runs.sweep.runner import SweepRunner, require_root_for
from gpustation.telemetry.backend import Backend, parse_gpu_list
from gpustation.textsafe import safe


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a preset over a grid of settings and find the cheapest one",
        description="Run PRESET once per point of the grid of every --set list and "
        "--power-limit value, each point a run in the history; report throughput, energy "
        "per unit of work, power, temperature, throttling and VRAM per point, the Pareto "
        "front and the least energy within --within of the best throughput.",
    )
    p.add_argument("preset", metavar="PRESET")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=A,B,...",
        help="an axis of the grid: the values of one preset argument (repeatable)",
    )
    p.add_argument(
        "--power-limit",
        metavar="LIST",
        help="an axis of power limits set on every GPU of the run, e.g. 60%%,80%%,100%% or "
        "300W,350W (needs root; each card's limit is put back afterwards)",
    )
    add_gpu_options(p)
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="runs per point (noise)")
    p.add_argument(
        "--warmup-s",
        type=float,
        metavar="SECONDS",
        help="leave out this many seconds from each run's start (default: until the "
        "runner's first throughput report)",
    )
    p.add_argument(
        "--within",
        default="5%",
        metavar="PCT",
        help="the recommendation: least energy within PCT of the best throughput (default 5%%)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan; change nothing")
    p.add_argument(
        "--force",
        action="store_true",
        help="end a sweep that holds these GPUs first (it puts its limits back as it ends)",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait for runs still going on these GPUs instead of refusing to start",
    )
    p.add_argument("--grace", type=float, default=10.0, metavar="SECONDS", help=argparse.SUPPRESS)


def _within(text: str) -> float:
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise UsageError(f"--within: a percentage such as 5%, got {text!r}") from None
    if not (math.isfinite(value) and 0 <= value < 100):
        raise UsageError(f"--within: between 0 and 100 %, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    if args.repeat < 1 or args.repeat > 20:
        raise UsageError(f"--repeat: between 1 and 20, got {args.repeat}")
    if args.warmup_s is not None and not (math.isfinite(args.warmup_s) and args.warmup_s >= 0):
        raise UsageError(f"--warmup-s: 0 or more seconds, got {args.warmup_s:g}")
    within = _within(args.within)
    presets, _ = load_presets()
    preset = find_preset(args.preset, presets)
    axes = parse_axes(args.set)
    check_preset_takes(preset, axes)
    powers = parse_power_axis(args.power_limit)
    points = grid(axes, powers, args.repeat)
    backend = backend_from_args(args)
    try:
        gpus = resolve_gpus(
            preset, parse_gpu_list(getattr(args, "gpus", None)), backend.device_count()
        )
        if powers and not gpus:
            raise UsageError("--power-limit: the run has no GPU to set a limit on")
        limits = plan_limits(backend, gpus, powers) if powers else {}
        sweep = Sweep(
            id=new_sweep_id(preset.name),
            preset=preset.name,
            axes=axes,
            power_limits=powers,
            gpus=gpus,
            repeat=args.repeat,
            warmup_s=args.warmup_s,
            within_pct=within,
            created_at=time.time(),
            simulated=backend.simulated,
            points=points,
        )
        if backend.simulated:
            print("SIMULATED GPUs (no hardware is changed)")
        if args.dry_run:
            _print_plan(sweep, limits)
            leftovers = unrestored(backend, _say)
            if leftovers:
                print(
                    "First, the power limits a killed sweep left changed would be restored: "
                    + leftovers_text(leftovers, backend)
                )
            return EXIT_OK
        require_root_for(sweep, backend.simulated)
        _claim(sweep, backend, args)
        return _run(sweep, preset, backend, args)
    finally:
        backend.close()


def _claim(sweep: Sweep, backend: Backend, args: argparse.Namespace) -> None:
    """One owner at a time: a live sweep on these GPUs refuses this one (or, with
    --force, is ended first); limits killed sweeps left are put back; a run still
    on these GPUs refuses it (or, with --wait, is waited for)."""

    held = holding_sweeps(sweep.gpus, backend) if sweep.gpus else []
    if held and not args.force:
        raise lease.LeaseHeld(held, f"sweep {sweep.id}")
    if held:
        _say("ending " + "; ".join(h.describe() for h in held) + " first (--force)")
        lease.end_holders(held)
    if sweep.gpus and args.wait:
        wait_for_runs(sweep.gpus, backend.simulated, _say)
    busy = runs_on(sweep.gpus, backend.simulated) if sweep.gpus else []
    if busy:
        raise GpustationError(
            f"{runs_text(busy)} is still going: a point measured beside it would measure "
            "both. Wait for it (--wait), or stop it with `gpustation runs stop "
            f"{busy[0][0]}`. Nothing was changed."
        )
    # Limits a killed sweep left changed are put back before any sweep measures.
    restore_leftovers(unrestored(backend, _say), backend, _say)


def _print_plan(sweep: Sweep, limits: dict[str, dict[int, float]]) -> None:
    est = _estimate_s(sweep.preset)
    total = (
        f"about {est * len(sweep.points) / 60:.0f} min ({len(sweep.points)} x {est:.0f} s, "
        f"the median of {sweep.preset}'s earlier runs)"
        if est
        else f"unknown: {sweep.preset} has not run here yet "
        f"(`gpustation run {sweep.preset}` once gives the time of a point)"
    )
    print(f"Dry run: sweep of {sweep.preset}, {len(sweep.points)} points; nothing is changed.")
    print(f"GPUs: {', '.join(map(str, sweep.gpus)) or 'none'}; estimated time: {total}")

    shared = constants(sweep)
    if shared:
        print(safe("every point: " + " ".join(shared)))
    for p in sweep.points:
        line = f"  {p.index + 1:>3}. {point_label(sweep, p)}"
        if p.power is not None:
            line += "  ->  " + ", ".join(
                f"GPU {i} {w:g} W" for i, w in sorted(limits[p.power].items())
            )
        print(line)


def _estimate_s(preset: str) -> float | None:
    """The median time of this preset's earlier successful runs, if any."""
    try:
        # start-up time: the run store (sqlite3)
        from gpustation.runs.store.index import RunStore

        done = [
            r.duration_s
            for r in RunStore().list_runs(limit=200)
            if r.preset == preset and r.status == "succeeded" and r.duration_s
        ]
    except Exception:
        return None
    return statistics.median(done) if done else None


def _wait(directory: Path) -> None:
    while True:
        state = rundir.read_state(directory)
        if state is not None and not state.active:
            return
        time.sleep(0.2)  # polling the run's state file


def _run(sweep: Sweep, preset: RunPreset, backend: Backend, args: argparse.Namespace) -> int:
    for warning in notify_warnings():  # each run's end is notified by its supervisor
        print(f"gpustation: warning: {warning}", file=sys.stderr)
    runner = SweepRunner(
        sweep,
        preset,
        backend if sweep.power_limits else None,
        launch=launch,
        wait=_wait,
        stop=lambda directory: stop_run(directory, grace_s=args.grace, by="gpustation sweep"),
        say=_say,
        stop_grace_s=args.grace,
        simulate=getattr(args, "simulate", None),
        sim_card=getattr(args, "sim_card", None),
    )
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in _STOP_SIGNALS}
    try:
        runner.run()
    except KeyboardInterrupt:
        _report_quietly(sweep)
        return EXIT_INTERRUPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _report(sweep)
    return EXIT_OK


def _report_quietly(sweep: Sweep) -> None:
    try:
        _report(sweep)
    except OSError:
        pass  # the terminal is gone; sweep.json has it all


def _say(text: str) -> None:
    try:
        print(f"gpustation: {text}", file=sys.stderr, flush=True)
    except OSError:
        pass  # the terminal is gone (SIGHUP): the limits still go back


def _raise_interrupt(signum: int, frame: object) -> None:
    # Once: a second TERM or HUP must not cut the restore short.
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


#: Ctrl-C raises KeyboardInterrupt itself; these end a sweep the same way
#: (the point's run stopped, the limits put back), as for `fan run`.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _report(sweep: Sweep) -> None:

    print_points(sweep)
    plot = terminal_plot(sweep, colour=colour.wanted(sys.stdout))
    if plot:
        print(plot)
    path = sweep.directory / "plot.svg"
    try:
        path.write_text(svg_plot(sweep), encoding="utf-8")
        print(f"plot: {path}")
    except OSError as err:
        print(f"gpustation: could not write {path}: {err.strerror or err}", file=sys.stderr)
    print(recommendation_text(sweep))


def print_points(sweep: Sweep) -> None:
    # start-up time: rich, for terminal output only
    from rich.table import Table

    shared = constants(sweep)
    if shared:
        print(safe("every point: " + " ".join(shared)))
    table = Table(box=None, header_style="bold", pad_edge=False)
    rows = [[safe(cell) for cell in row] for row in point_rows(sweep, constants_apart=True)]
    for column in point_columns(sweep):
        if column in ("point", "run"):  # a run id is typed or pasted whole: never cut
            index = 1 if column == "point" else -1
            width = max((len(row[index]) for row in rows), default=len(column))
            table.add_column(column, no_wrap=True, min_width=width)
        else:
            table.add_column(column, justify="left" if column in TEXT_COLUMNS else "right")
    for row in rows:
        table.add_row(*row)
    console(240).print(table)
