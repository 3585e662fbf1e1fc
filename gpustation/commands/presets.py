"""``gpustation presets list | show NAME``: the run presets, and what is wrong with bad ones."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpustation.runs.launch.argv import build_argv, format_args
from gpustation.runs.output import console
from gpustation.runs.presets import (
    PresetProblem,
    RunPreset,
    apply_values,
    find_preset,
    load_presets,
    parse_sets,
    preset_dirs,
)
from gpustation.textsafe import safe


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "presets",
        help="list run presets or show one",
        description="List the run presets (shipped ones and those in "
        "<config dir>/presets/runs/, which win on a name clash), or show one.",
    )
    actions = p.add_subparsers(dest="presets_action", metavar="ACTION")
    lst = actions.add_parser("list", help="list the presets and any problems in preset files")
    lst.add_argument("--json", action="store_true", help="print JSON")
    show = actions.add_parser("show", help="show one preset and the command it runs")
    show.add_argument("name", metavar="NAME")
    show.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an [args] value, typed by the preset's default (repeatable)",
    )
    show.add_argument("--json", action="store_true", help="print JSON")


def _problem_dict(problem: PresetProblem) -> dict[str, Any]:
    return {
        "path": problem.path,
        "line": problem.line,
        "key": problem.key,
        "message": problem.message,
    }


def _preset_summary(preset: RunPreset) -> dict[str, Any]:
    return {
        "name": preset.name,
        "title": preset.display_title,
        "description": preset.description,
        "runner": preset.runner,
        "command": preset.command,
        "launcher": preset.launcher,
        "gpus": preset.gpus,
        "tags": preset.tags,
        "origin": preset.origin,
        "source": preset.source,
    }


def _print_problems(problems: list[PresetProblem]) -> None:
    for problem in problems:
        print(f"gpustation: bad preset: {problem}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    presets, problems = load_presets()
    action = getattr(args, "presets_action", None) or "list"
    if action == "list":
        if getattr(args, "json", False):
            doc = {
                "presets": [_preset_summary(p) for p in presets.values()],
                "problems": [_problem_dict(p) for p in problems],
                "dirs": [str(d) for _, d in preset_dirs()],
            }
            print(json.dumps(doc, indent=2))
        else:
            _print_list(presets)
        _print_problems(problems)
        return 0

    preset = find_preset(args.name, presets, problems)
    preset, _parsed, warnings = apply_values(preset, parse_sets(args.set))
    for warning in warnings:
        print(f"gpustation: warning: {warning}", file=sys.stderr)

    # The GPUs a launch would pick when the machine has enough (for nproc).
    if isinstance(preset.gpus, list):
        gpus_hint = list(preset.gpus)
    else:
        gpus_hint = list(range(preset.gpus or 1))
    argv = build_argv(preset, gpus_hint)
    if args.json:
        doc = preset.to_dict()
        doc["argv"] = argv
        print(json.dumps(doc, indent=2))
        return 0
    # start-up time: rich, for terminal output only
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    rows: list[tuple[str, str]] = [
        ("name", preset.name),
        ("title", preset.display_title),
        ("description", preset.description),
        ("runner" if preset.runner else "command", preset.runner or " ".join(preset.command or [])),
        ("launcher", preset.launcher),
        ("gpus", "all" if preset.gpus is None else str(preset.gpus)),
        ("tags", ", ".join(preset.tags)),
        ("args", " ".join(format_args(preset.args))),
        ("env", " ".join(f"{k}={v}" for k, v in preset.env.items())),
        ("file", f"{preset.source} ({preset.origin})"),
        ("runs", " ".join(argv)),
    ]
    for key in ("nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint", "master_addr"):
        value = getattr(preset, key)
        if value is not None:
            rows.insert(5, (key, str(value)))
    for key, value in rows:
        if value:
            table.add_row(key, safe(value))
    console().print(table)
    return 0


def _print_list(presets: dict[str, RunPreset]) -> None:
    if not presets:
        dirs = " or ".join(str(d) for _, d in preset_dirs())
        print(f"no run presets found (looked in {dirs})")
        return
    # start-up time: rich, for terminal output only
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("NAME", "TITLE", "RUNS", "LAUNCHER", "GPUS", "TAGS", "FROM"):
        table.add_column(column, overflow="fold")
    for preset in presets.values():
        table.add_row(
            *(
                safe(cell)
                for cell in (
                    preset.name,
                    preset.display_title,
                    preset.runner or " ".join(preset.command or []),
                    preset.launcher,
                    "all" if preset.gpus is None else str(preset.gpus),
                    ", ".join(preset.tags),
                    preset.origin,
                )
            )
        )
    console().print(table)
