"""``gpustation runs list | show ID | stop ID | follow ID | compare ID ID...``: the run history.

Only ``stop`` writes (it records the run's end when no supervisor does); the
others read ``runs.db`` and the run directories and change neither. A run
whose supervisor died is shown ``lost`` from its files; the launcher records
that before its next launch (see :mod:`gpustation.runs.store.reconcile`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpustation import timefmt
from gpustation.commands.run_follow import follow
from gpustation.errors import UsageError
from gpustation.runs import rundir
from gpustation.runs.compare import (
    Comparison,
    compare,
    energy_text,
    fmt_energy,
    fmt_num,
    gpus_text,
    sim_marked,
    status_text,
)
from gpustation.runs.cost import Price, price_or_none
from gpustation.runs.forecast.model import Forecast, versus
from gpustation.runs.forecast.text import (
    actual_of,
    basis_text,
    forecast_line,
    launched_without_history,
    versus_rows,
)
from gpustation.runs.kernel_profile import profile_tables, read_top_ops
from gpustation.runs.launch.stop import stop_run
from gpustation.runs.multinode.nodes import nodes_energy
from gpustation.runs.output import console, strict_json
from gpustation.runs.phases import phases_table
from gpustation.runs.slowdown.show import slowdowns_table
from gpustation.runs.store.index import RunStore, record_from_dir
from gpustation.runs.store.reconcile import check_run
from gpustation.runs.store.tidy import (
    annotate,
    check_status,
    delete_runs,
    prune_candidates,
)
from gpustation.runs.summary import RunSummary
from gpustation.telemetry import format as fmt
from gpustation.telemetry.format import NA
from gpustation.textsafe import safe
from gpustation.timespec import parse_span

if TYPE_CHECKING:
    from rich.console import Console, JustifyMethod


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "runs",
        help="list, show, stop and compare runs",
        description="The run history: every run with its preset, GPUs, result and "
        "the energy, power and temperature of its GPUs. A run ID may be shortened "
        "to any unique part of it, or given as `last`.",
    )
    actions = p.add_subparsers(dest="runs_action", metavar="ACTION")
    lst = actions.add_parser("list", help="list runs, newest first")
    lst.add_argument(
        "--limit", type=int, default=50, metavar="N", help="at most N runs (50; 0: all of them)"
    )
    lst.add_argument("--status", help="only runs with this status (running, failed ...)")
    lst.add_argument("--preset", metavar="NAME", help="only runs of this preset")
    lst.add_argument("--tag", metavar="TAG", help="only runs with this tag (e.g. sweep:ID)")
    lst.add_argument("--json", action="store_true", help="print JSON")
    delete = actions.add_parser("delete", help="delete runs: their directories and rows")
    delete.add_argument("ids", nargs="+", metavar="ID")
    prune = actions.add_parser("prune", help="delete the runs that ended before a span ago")
    prune.add_argument("--older-than", required=True, metavar="SPAN", help="e.g. 90s, 12h, 30d, 4w")
    prune.add_argument("--status", help="only runs with this status (failed, stopped ...)")
    prune.add_argument("--dry-run", action="store_true", help="list them; delete nothing")
    note = actions.add_parser("note", help="set a run's note (an empty text clears it)")
    note.add_argument("id", metavar="ID")
    note.add_argument("text", metavar="TEXT")
    tag = actions.add_parser("tag", help="add tags to a run (--remove to take them off)")
    tag.add_argument("id", metavar="ID")
    tag.add_argument("tags", nargs="+", metavar="TAG")
    tag.add_argument("--remove", action="store_true", help="take these tags off")
    show = actions.add_parser("show", help="show one run")
    show.add_argument("id", metavar="ID")
    show.add_argument("--json", action="store_true", help="print JSON")
    stop = actions.add_parser("stop", help="stop a run: SIGINT, then SIGTERM, then SIGKILL")
    stop.add_argument("id", metavar="ID")
    stop.add_argument(
        "--grace",
        type=float,
        metavar="SECONDS",
        help="wait this long after SIGINT and after SIGTERM (default: the run's, 10)",
    )
    stop.add_argument("--json", action="store_true", help="print the final state as JSON")
    fol = actions.add_parser(
        "follow",
        help="stream a run's log (from the start) until it ends; Ctrl-C leaves it running",
    )
    fol.add_argument("id", metavar="ID")
    fol.add_argument(
        "--stop-on-ctrl-c",
        action="store_true",
        help="let Ctrl-C stop the run, as `gpustation run` does",
    )
    cmp_ = actions.add_parser("compare", help="put runs side by side, with changes from the first")
    cmp_.add_argument("ids", nargs="+", metavar="ID")
    cmp_.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "runs_action", None) or "list"
    store = RunStore()
    if action == "list":
        preset, tag = getattr(args, "preset", None), getattr(args, "tag", None)
        status = getattr(args, "status", None)
        check_status(status, "--status")
        limit = getattr(args, "limit", 50)
        if limit < 0:
            raise UsageError(f"--limit: a number of runs, 0 for all of them; got {limit}")
        filtered = preset is not None or tag is not None
        records = [
            _fresh(r)
            for r in store.list_runs(limit=None if filtered else limit or None, status=status)
            if (preset is None or r.preset == preset) and (tag is None or tag in r.tags)
        ][: limit or None]
        if getattr(args, "json", False):
            print(strict_json([r.to_dict() for r in records]))
        else:
            _print_list(records)
        return 0
    if action == "show":
        record = _get(store, args.id)
        fc = _forecast_of(record)
        if args.json:
            print(strict_json({**record.to_dict(), "forecast": _forecast_doc(fc, record)}))
        else:
            _print_show(record)
            _print_forecast(fc, record)
        return 0
    if action in ("delete", "prune", "note", "tag"):
        return _tidy(store, args)
    if action == "stop":
        run_id = store.resolve_id(args.id)
        state = stop_run(run_id, grace_s=args.grace)
        record = _get(store, run_id)
        if args.json:
            print(strict_json(record.to_dict()))
        else:
            status = state.status if state else record.status
            print(f"{run_id}: {(state.reason if state else None) or status}")
        return 0
    if action == "follow":
        run_id = store.resolve_id(args.id)
        return follow(rundir.run_dir(run_id), grace_s=None, stop_on_interrupt=args.stop_on_ctrl_c)
    if action == "compare":
        comparison = compare([_get(store, i) for i in args.ids])
        if args.json:
            print(strict_json(comparison.to_json()))
        else:
            _print_compare(comparison)
        return 0
    raise UsageError(f"unknown action {action!r}")


def _forecast_of(record: RunSummary) -> Forecast | None:
    """The forecast made when the run was launched (run.json), if it has one."""
    run = rundir.read_run(Path(record.run_dir)) if record.run_dir else None
    return Forecast.from_dict((run or {}).get("forecast"))


def _forecast_doc(fc: Forecast | None, record: RunSummary) -> dict[str, Any] | None:
    """The forecast for ``runs show --json``: as made, its line, and each figure beside
    what happened (``versus``: forecast, actual, error_pct)."""
    if fc is None:
        return None
    rows = versus(fc, actual_of(fc, record))
    return {
        **fc.to_dict(),
        "text": forecast_line(fc),
        "versus": [
            {
                "figure": v.figure,
                "forecast": v.forecast,
                "actual": v.actual,
                "error_pct": v.error_pct,
            }
            for v in rows
        ],
    }


def _print_forecast(fc: Forecast | None, record: RunSummary) -> None:
    """The forecast made at launch beside what the run did, with the error in %."""
    if fc is None:
        return
    # start-up time: rich, for terminal output only
    from rich.table import Table
    from rich.text import Text

    out = console()
    if not fc.runs:
        out.print(Text.assemble(("forecast ", "bold"), launched_without_history(fc)))
        return
    out.print(Text.assemble(("forecast ", "bold"), basis_text(fc)))
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("", "FORECAST", "ACTUAL", "ERROR"):
        table.add_column(column, justify="left" if not column else "right")
    for row in versus_rows(fc, record):
        table.add_row(row.figure, row.forecast, row.actual, row.error)
    out.print(table)
    for note in fc.notes:
        out.print(Text(f"  {note}", style="dim"))


def _print_profile(out: Console, r: RunSummary) -> None:
    """The top kernels and ops of a run recorded with ``--profile``, if it has them."""

    if not r.run_dir:
        return
    data = read_top_ops(Path(r.run_dir))
    if data is None:
        return
    for renderable in profile_tables(data, Path(r.run_dir)):
        out.print(renderable)


def _tidy(store: RunStore, args: argparse.Namespace) -> int:
    if args.runs_action == "delete":
        for run_id in delete_runs(store, [store.resolve_id(i) for i in args.ids]):
            print(f"deleted {run_id}")
        return 0
    if args.runs_action == "prune":
        span = parse_span(args.older_than, "--older-than")
        found = prune_candidates(store, span, args.status)
        if args.dry_run:
            for r in found:
                print(f"would delete {r.id} ({status_text(r)})")
            print(f"{len(found)} runs would be deleted")
            return 0
        delete_runs(store, [r.id for r in found])
        print(f"deleted {len(found)} runs ended before {args.older_than} ago")
        return 0
    run_id = store.resolve_id(args.id)
    if args.runs_action == "note":
        record = annotate(store, run_id, note=args.text)
        print(f"{run_id}: " + (f"note {safe(record.note)!r}" if record.note else "note cleared"))
        return 0
    record = annotate(
        store, run_id, add=() if args.remove else args.tags, remove=args.tags if args.remove else ()
    )
    print(f"{run_id}: tags {', '.join(record.tags) or 'none'}")
    return 0


def _fresh(record: RunSummary) -> RunSummary:
    """A running run's row, read afresh from its files (the row is written at start and end).

    Its state is checked, so a run whose supervisor died reads ``lost``.
    """
    if record.status in ("starting", "running") and record.run_dir:
        directory = Path(record.run_dir)
        return record_from_dir(directory, check_run(directory))
    return record


def _get(store: RunStore, text: str) -> RunSummary:
    run_id = store.resolve_id(text)
    record = store.get(run_id)
    if record is None:
        raise UsageError(f"no run {text!r}; see `gpustation runs list`")
    return _fresh(record)


# ---- formatting -----------------------------------------------------------------


fmt_duration = fmt.duration


def _price() -> Price | None:
    return price_or_none(lambda problem: print(f"warning: {problem}", file=sys.stderr))


def _started(record: RunSummary) -> str:
    if record.started_at is None:
        return NA
    return timefmt.stamp(record.started_at)


def _print_list(records: list[RunSummary]) -> None:
    if not records:
        print("no runs yet; start one with `gpustation run PRESET`")
        return
    # start-up time: rich, for terminal output only
    from rich.table import Table

    price = _price()
    table = Table(box=None, header_style="bold", pad_edge=False)
    columns: list[tuple[str, JustifyMethod]] = [
        ("ID", "left"),
        ("PRESET", "left"),
        ("STATUS", "left"),
        ("STARTED", "left"),
        ("TIME", "right"),
        ("GPUS", "left"),
        ("STEPS", "right"),
        ("LOSS", "right"),
        ("THROUGHPUT", "right"),
        ("ENERGY", "right"),
    ]
    if price is not None:
        columns.append(("COST", "right"))
    for column, justify in columns:
        table.add_column(column, justify=justify, no_wrap=column == "ID")
    for r in records:
        cost = [price.text(r.energy_j)] if price is not None else []
        table.add_row(
            *(
                safe(c)
                for c in (
                    r.id,
                    r.preset or NA,
                    status_text(r),
                    _started(r),
                    fmt_duration(r.duration_s),
                    gpus_text(r),
                    NA if r.steps is None else str(r.steps),
                    fmt_num(r.final_loss, 4),
                    fmt_num(r.best_throughput, 1, r.throughput_unit or ""),
                    energy_text(r),
                    *cost,
                )
            )
        )
    console().print(table)


def _resumed_text(r: RunSummary) -> str | None:
    """Which run and checkpoint step a resumed run continued (None: not resumed)."""
    found = r.resumed_from or (r.summary or {}).get("resumed_from") or {}
    if not isinstance(found, dict) or not found:
        return None
    text = f"run {found.get('run') or '?'} at step {found.get('step', '?')}"
    return text + (f" ({found['checkpoint']})" if found.get("checkpoint") else "")


def _print_show(r: RunSummary) -> None:
    # start-up time: rich, for terminal output only
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("id", r.id),
        ("preset", f"{r.preset} ({r.title})" if r.title and r.title != r.preset else r.preset),
        ("status", status_text(r)),
        ("reason", r.reason),
        ("started", _started(r)),
        ("duration", fmt_duration(r.duration_s)),
        ("gpus", gpus_text(r, none="none") + (" (no real GPU was used)" if r.simulated else "")),
        ("overrides", " ".join(f"{k}={v}" for k, v in r.overrides.items())),
        ("tags", ", ".join(r.tags)),
        ("note", r.note),
        ("resumed from", _resumed_text(r)),
        # as a shell reads it; safe() below shows a newline in an argument as ⏎
        ("command", shlex.join(r.argv)),
        ("ran as", r.ran_as),
        *_node_rows(r),
        (
            "steps",
            None
            if r.steps is None
            else f"{r.steps}" + (f"/{r.total_steps}" if r.total_steps else ""),
        ),
        ("final loss", fmt_num(r.final_loss, 4)),
        ("best loss", fmt_num(r.best_loss, 4)),
        ("eval loss", fmt_num(r.final_eval_loss, 4) if r.final_eval_loss is not None else None),
        ("best throughput", fmt_num(r.best_throughput, 1, r.throughput_unit or "")),
        ("peak VRAM", fmt_num(r.peak_vram_mib, 0, "MiB")),
        ("energy", energy_text(r)),
        (
            "cost",
            sim_marked(r, price.text(r.energy_j)) if (price := _price()) is not None else None,
        ),
        (
            f"energy per {r.work_unit}" if r.work_unit else "energy per unit",
            sim_marked(r, fmt_num(r.energy_per_unit_j, 3, "J"))
            if r.energy_per_unit_j is not None
            else None,
        ),
        (
            "power avg / peak",
            sim_marked(r, f"{fmt_num(r.avg_power_w, 0, 'W')} / {fmt_num(r.peak_power_w, 0, 'W')}")
            if r.avg_power_w is not None or r.peak_power_w is not None
            else None,
        ),
        (
            "tensor activity",
            None
            if r.tensor_active_pct is None
            else sim_marked(r, fmt_num(r.tensor_active_pct, 1, "%")),
        ),
        ("peak temperature", sim_marked(r, fmt_num(r.peak_temp_c, 0, "°C"))),
        (
            "peak memory temperature",
            None
            if r.peak_memory_temp_c is None
            else sim_marked(r, fmt_num(r.peak_memory_temp_c, 0, "°C")),
        ),
        ("throttled", sim_marked(r, fmt_num(r.throttled_s, 0, "s"))),
        ("malformed metric lines", str(r.malformed_metrics) if r.malformed_metrics else None),
        ("run directory", r.run_dir),
    ]
    for key, value in rows:
        if value not in (None, ""):
            table.add_row(key, safe(value))
    out = console()
    out.print(table)
    if r.summary:
        # start-up time: rich, for terminal output only
        from rich.text import Text

        out.print(Text.assemble(("summary ", "bold"), strict_json(r.summary, indent=None)))
    phases = phases_table(r.summary)
    if phases is not None:
        out.print(phases)
    slowdowns = slowdowns_table(r.slowdowns, r.simulated, r.active)
    if slowdowns is not None:
        out.print(slowdowns)
    _print_profile(out, r)
    if r.error_tail:
        out.print("[bold]last lines of the log[/bold]")
        for line in r.error_tail:
            out.print("  " + safe(line), markup=False)


def _node_rows(r: RunSummary) -> list[tuple[str, str | None]]:
    """A multi-node run's nodes: each one's end and GPU energy; its torchrun command."""

    directory = Path(r.run_dir) if r.run_dir else None
    energies = nodes_energy(directory) if directory is not None else []
    if directory is None or not energies:
        return []
    rows: list[tuple[str, str | None]] = []
    for e in energies:
        node = e.entry
        end = e.status
        if node.get("signal"):
            end += f" ({node['signal']})"
        elif node.get("exit_code") not in (None, 0):
            end += f" (exit {node['exit_code']})"
        if e.unknown:
            energy = f"energy unknown ({e.unknown})"
        else:
            energy = f"energy {fmt_energy(e.telemetry.energy_j)}"
        rows.append((f"node {e.host}", f"{end}, {energy}"))
    plan = (rundir.read_run(directory) or {}).get("multinode") or {}
    first = (plan.get("nodes") or [{}])[0]
    argv = (first.get("spec") or {}).get("argv") or []
    rows.append(("node command", " ".join(["torchrun", *argv]) if argv else None))
    return rows


def _print_compare(comparison: Comparison) -> None:
    console(max(100, 30 + 34 * len(comparison.records))).print(comparison.renderable())
    if sys.stdout.isatty():
        print(comparison.caption(), file=sys.stderr)
