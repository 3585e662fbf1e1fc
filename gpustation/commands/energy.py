"""``gpustation energy [--since 30d] [--by day|preset]``: the runs' GPU energy and cost."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from typing import Any

from gpustation import timefmt
from gpustation.runs.cost import J_PER_KWH, load_price
from gpustation.runs.store.index import RunStore
from gpustation.telemetry.format import NA
from gpustation.textsafe import safe
from gpustation.timespec import parse_since


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "energy",
        help="the GPU energy and cost of the runs, per day or per preset",
        description="Sum the GPU energy of the runs in the history over a period, per day "
        "or per preset, with its cost when [energy] price_per_kwh is set in config.toml.",
    )
    p.add_argument(
        "--since",
        default="30d",
        metavar="WHEN",
        help="a span back from now (12h, 7d, 4w), a date (2026-12-01) or a relative time "
        "(-5m) (default 30d)",
    )
    p.add_argument("--by", choices=["day", "preset"], default="day")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    since = parse_since(args.since, "--since")
    price = load_price()
    # Runs on simulated GPUs are summed apart: their energy is no energy anyone paid for.
    groups: dict[tuple[str, bool], dict[str, Any]] = defaultdict(
        lambda: {"runs": 0, "energy_j": 0.0, "gpu_hours": 0.0, "unmeasured": 0}
    )
    for r in RunStore().list_runs():
        if r.started_at is None or r.started_at < since:
            continue
        key = timefmt.day(r.started_at) if args.by == "day" else (r.preset or NA)
        g = groups[(key, r.simulated)]
        g["runs"] += 1
        if r.energy_j is None:
            g["unmeasured"] += 1
        else:
            g["energy_j"] += r.energy_j
        g["gpu_hours"] += (r.duration_s or 0.0) * max(1, len(r.gpus)) / 3600
    rows = []
    for key, simulated in sorted(groups):
        g = groups[(key, simulated)]
        row = {args.by: key, "simulated": simulated, **g, "kwh": g["energy_j"] / J_PER_KWH}
        if price is not None:
            row["cost"] = price.cost(g["energy_j"])
            row["currency"] = price.currency
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2, allow_nan=False))
        return 0
    if not rows:
        print(f"no runs since {timefmt.full(since)}")
        return 0
    head = f"{args.by:<24} {'runs':>5} {'GPU h':>8} {'kWh':>9}"
    print(head + (f" {'cost':>12}" if price else ""))
    for row in rows:
        name = safe(row[args.by]) + (" SIMULATED" if row["simulated"] else "")
        line = f"{name:<24} {row['runs']:>5} {row['gpu_hours']:>8.2f} {row['kwh']:>9.3f}"
        if price is not None:
            line += f" {price.text(row['energy_j']):>12}"
        if row["unmeasured"]:
            line += f"  ({row['unmeasured']} without energy)"
        print(line)
    for simulated in (False, True):
        mine = [r for r in rows if r["simulated"] is simulated]
        if not mine:
            continue
        total_j = sum(r["energy_j"] for r in mine)
        name = "total SIMULATED" if simulated else "total"
        total = f"{name:<24} {sum(r['runs'] for r in mine):>5} "
        total += f"{sum(r['gpu_hours'] for r in mine):>8.2f} {total_j / J_PER_KWH:>9.3f}"
        print(total + (f" {price.text(total_j):>12}" if price else ""))
    if price is None:
        print("(set [energy] price_per_kwh and currency in config.toml for the cost)")
    return 0
