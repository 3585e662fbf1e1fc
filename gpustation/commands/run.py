"""``gpustation run PRESET``: start a run and follow it from a terminal (or over ssh).

The log streams to stdout and the progress to stderr, with a line when the
run slows down (and why) and when that ends (``run_follow.py``). Ctrl-C stops
the run gracefully; a second Ctrl-C skips the waits. The exit status is 0 when
the run succeeded, 1 when it failed and 130 when it was stopped. With
``--detach`` the run id is printed and the run goes on alone. With ``--hosts``
the preset runs on those hosts through torchrun (``runs/multinode.py``), as
one run of the local history. With ``--dry-run`` nothing starts: the argv and
the run's forecast are printed (``forecast_cmd.py``).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import sys
import time
from dataclasses import replace
from typing import Any

from gpustation.commands import forecast_cmd
from gpustation.commands.options import add_gpu_options
from gpustation.commands.run_follow import follow
from gpustation.errors import EXIT_OK, UsageError
from gpustation.fleet.fleet import load_fleet_config
from gpustation.notify import notify_warnings
from gpustation.runs.launch.start import launch
from gpustation.runs.multinode.launch import (
    DEFAULT_RDZV_PORT,
    NodeOptions,
    parse_hosts,
    resolve_remote_python,
)
from gpustation.runs.multinode.nodes import DEFAULT_START_TIMEOUT_S
from gpustation.runs.presets import command_preset, find_preset, load_presets, parse_sets
from gpustation.telemetry.backend import parse_gpu_list


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="start a run from a preset and follow its log",
        description="Start a run from a preset and stream its log. Ctrl-C stops "
        "the run (SIGINT, then SIGTERM, then SIGKILL); exit status 0 when it "
        "succeeded, 1 when it failed, 130 when it was stopped.",
    )
    p.add_argument(
        "preset",
        metavar="PRESET",
        nargs="?",
        help="preset name (see `gpustation presets list`), or -- and any command to run "
        "as a supervised run (no shell): gpustation run -- python train.py --lr 3e-4",
    )
    p.add_argument("--name", help="the run's name when running a command (default: its program)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for a command run (repeatable)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an [args] value, typed by the preset's default (repeatable)",
    )
    add_gpu_options(p)  # unset defaults: `gpustation --simulate 2 run x` keeps the 2
    p.add_argument(
        "--detach", action="store_true", help="print the run id and return; the run goes on"
    )
    forecast_cmd.add_arguments(p)
    queue = p.add_argument_group(
        "the GPU queue",
        "wait for free GPUs instead of starting now (`gpustation queue` lists the queue)",
    )
    queue.add_argument(
        "--queue",
        action="store_true",
        help="put the run in the queue and print its id at once; it starts when its GPUs "
        "are free (--gpus: those; --gpus-count N: any N, the least used or best connected)",
    )
    queue.add_argument(
        "--gpus-count",
        type=int,
        metavar="N",
        help="with --queue: any N free GPUs (default: the preset's count)",
    )
    queue.add_argument(
        "--priority",
        type=int,
        default=0,
        metavar="N",
        help="with --queue: higher starts first, from -100 to 100 (default 0)",
    )
    p.add_argument(
        "--resume",
        metavar="RUN_ID",
        help="continue a LoRA run from its last complete checkpoint, as a new run with the "
        "old run's settings (PRESET may be left out); --set steps=N trains on to step N",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="record a torch.profiler trace of a few steps after warm-up (the shipped "
        "training runners); `runs show` lists the top kernels and ops",
    )
    p.add_argument(
        "--launcher",
        choices=["nsys"],
        help="run through Nsight Systems (nsys profile); its report lands in the run "
        "directory's profile/",
    )
    p.add_argument(
        "--profile-steps",
        type=int,
        default=5,
        metavar="N",
        help="steps the profile covers (default 5)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on stop, wait this long after SIGINT and after SIGTERM (default 10)",
    )
    nodes = p.add_argument_group(
        "multi-node runs",
        "run the preset on several hosts over ssh through torchrun's c10d rendezvous; "
        "the first host holds the rendezvous",
    )
    nodes.add_argument(
        "--hosts",
        metavar="HOST,HOST",
        help="the nodes, comma-separated: [USER@]HOST[:PORT] or ssh config aliases",
    )
    nodes.add_argument(
        "--nproc-per-node",
        type=int,
        metavar="N",
        help="processes on each node (default: the preset's, else one per --gpus, else 1)",
    )
    nodes.add_argument(
        "--rdzv-port",
        type=int,
        metavar="PORT",
        help="the rendezvous port on the first host (default 29400)",
    )
    nodes.add_argument(
        "--remote-python",
        metavar="COMMAND",
        help="the Python on the nodes, with gpustation and torch (default: "
        "$GPUSTATION_REMOTE_PYTHON, [fleet] remote_python, else python3)",
    )
    nodes.add_argument(
        "--node-dir",
        metavar="DIR",
        help="the working directory on every node (default: this directory where a node "
        "has it, else the remote home)",
    )
    nodes.add_argument(
        "--node-start-timeout",
        type=float,
        metavar="SECONDS",
        help="fail the run when a node's agent has not started torchrun this long after "
        "ssh was started (default 60)",
    )
    nodes.add_argument(
        "--ssh-config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="ssh client config for reaching the nodes (ssh -F FILE)",
    )


def run(args: argparse.Namespace) -> int:
    if args.grace < 0:
        raise UsageError(f"--grace: 0 or more seconds, got {args.grace:g}")
    command: list[str] = list(getattr(args, "after_dashes", None) or [])
    if command and args.preset is not None:
        raise UsageError("give a preset or a command after --, not both")
    if command and args.resume:
        raise UsageError("--resume continues a LoRA run; it takes no command after --")
    if not command and args.preset is None and not args.resume:
        raise UsageError("give a preset (`gpustation presets list`) or a command after --")
    if not command and (args.name or args.env):
        raise UsageError("--name and --env go with a command given after --")
    sets = parse_sets(args.set)  # read once: every layer below takes the values
    resumed_from = None
    resume_warnings: tuple[str, ...] = ()
    if args.resume:
        # start-up time: the run store (sqlite3)
        from gpustation.runs.launch.resume import plan_resume

        plan = plan_resume(args.resume, sets, preset_name=args.preset)
        preset, resumed_from, resume_warnings = plan.preset, plan.resumed_from(), plan.warnings
    elif command:
        preset = command_preset(command, args.name, args.env)
    else:
        presets, problems = load_presets()
        # A preset that failed to load says why, rather than "not found".
        preset = find_preset(args.preset, presets, problems)
    node_options = _node_options(args)
    wrap: list[str] = []
    if args.launcher == "nsys":
        nsys = shutil.which("nsys")
        if nsys is None:
            raise UsageError(
                "--launcher nsys: Nsight Systems (nsys) is not on PATH; install it "
                "(NVIDIA's CUDA toolkit or the nsight-systems package) or leave the option out"
            )
        wrap = [nsys, "profile", "--trace", "cuda,nvtx,osrt", "--force-overwrite", "true"]
        wrap += ["--output", "{run_dir}/profile/nsys"]
    if args.profile:
        if preset.runner is None:
            raise UsageError("--profile: only a shipped runner records a profile; give a preset")
        if not 1 <= args.profile_steps <= 100:
            raise UsageError(f"--profile-steps: between 1 and 100, got {args.profile_steps}")
        preset = replace(preset, args={**preset.args, "profile_steps": args.profile_steps})
    if args.dry_run:
        multinode, resumed = node_options is not None, resumed_from is not None
        return forecast_cmd.dry_run(args, preset, sets, wrap, multinode, resumed)
    forecast_cmd.check_unused(args)
    if args.queue:
        return _queue(args, preset, sets, wrap, node_options is not None, resumed_from is not None)
    if args.gpus_count is not None or args.priority:
        raise UsageError("--gpus-count and --priority go with --queue")
    # Catch Ctrl-C from here on: one pressed while the run starts must stop it
    # too, not leave it running behind an interrupted command.
    interrupts: list[float] = []
    previous = signal.signal(signal.SIGINT, lambda *_: interrupts.append(time.monotonic()))
    try:
        if node_options is not None:
            from gpustation.runs.multinode.launch import (
                launch_multinode,  # start-up time: only a multi-node run needs it
            )

            handle = launch_multinode(preset, sets, node_options)
        else:
            handle = launch(
                preset,
                sets,
                parse_gpu_list(getattr(args, "gpus", None)),
                simulate=getattr(args, "simulate", None),
                sim_card=getattr(args, "sim_card", None),
                stop_grace_s=args.grace,
                wrap=wrap,
                resumed_from=resumed_from,
            )
    except BaseException:
        signal.signal(signal.SIGINT, previous)
        raise

    # the run's end is notified by its supervisor, which can only log a bad URL
    for warning in (*resume_warnings, *handle.warnings, *notify_warnings()):
        print(f"gpustation: warning: {warning}", file=sys.stderr)
    if args.detach:
        signal.signal(signal.SIGINT, previous)
        print(handle.id)
        return EXIT_OK
    gpus = ",".join(map(str, handle.gpus)) or "none"
    where = f"GPUs {gpus}"
    if node_options is not None:
        where = "nodes " + ",".join(h.text for h in node_options.hosts)
    print(
        f"gpustation: run {handle.id} ({preset.display_title}) on {where}; "
        f"files in {handle.run_dir}",
        file=sys.stderr,
        flush=True,
    )
    if resumed_from:
        print(
            f"gpustation: resuming run {resumed_from['run']} from its checkpoint at step "
            f"{resumed_from['step']}",
            file=sys.stderr,
            flush=True,
        )
    return follow(
        handle.run_dir, grace_s=args.grace, interrupts=interrupts, restore_handler=previous
    )


def _queue(
    args: argparse.Namespace,
    preset: Any,
    sets: dict[str, str],
    wrap: list[str],
    multinode: bool,
    resumed: bool,
) -> int:
    """``run --queue``: check the run as a start would, queue it, print its id."""
    # start-up time: only run --queue needs these
    from gpustation.runs.launch.start import prepare
    from gpustation.runs.queue import entries as queue
    from gpustation.runs.queue.scheduler import ensure_running

    if multinode or resumed:
        raise UsageError("--queue: a multi-node or resumed run cannot wait in the queue yet")
    gpus = parse_gpu_list(getattr(args, "gpus", None))
    if gpus is not None and args.gpus_count is not None:
        raise UsageError("give --gpus (those GPUs) or --gpus-count (any N), not both")
    request, device_count = prepare(
        preset,
        sets,
        simulate=getattr(args, "simulate", None),
        sim_card=getattr(args, "sim_card", None),
        stop_grace_s=args.grace,
        wrap=wrap,
    )
    count = args.gpus_count
    if gpus is None and count is None:
        wanted = request.preset.gpus
        if isinstance(wanted, list):
            gpus = list(wanted)
        else:
            count = 1 if wanted is None else int(wanted)
    if device_count is None:
        raise UsageError("--queue: no NVIDIA driver here, so no GPU will ever be free")
    if gpus is not None:
        unknown = [g for g in gpus if not 0 <= g < device_count]
        if unknown:
            raise UsageError(
                f"--gpus: GPU {','.join(map(str, unknown))} does not exist "
                f"(this machine has {device_count}: 0-{device_count - 1})"
            )
    elif count is not None and not 0 <= count <= device_count:
        raise UsageError(f"--gpus-count: from 0 to {device_count} (the GPUs here), got {count}")
    entry = queue.submit(request, gpus=gpus, gpus_count=count, priority=args.priority)
    ensure_running()
    position = next((i for i, e in enumerate(queue.entries(), 1) if e.id == entry.id), None)
    for warning in request.warnings:
        print(f"gpustation: warning: {warning}", file=sys.stderr)
    print(
        f"gpustation: queued {entry.id} ({preset.display_title}) for {entry.wants()}"
        + (f", position {position}" if position else "")
        + "; `gpustation queue` shows what it waits for",
        file=sys.stderr,
    )
    print(entry.id)
    return EXIT_OK


def _node_options(args: argparse.Namespace) -> Any:
    """The multi-node settings (None without ``--hosts``); UsageError for what cannot go."""
    given = [
        flag
        for flag, value in (
            ("--nproc-per-node", args.nproc_per_node),
            ("--rdzv-port", args.rdzv_port),
            ("--remote-python", args.remote_python),
            ("--node-dir", args.node_dir),
            ("--node-start-timeout", args.node_start_timeout),
        )
        if value is not None
    ]
    if args.hosts is None:
        if given:
            raise UsageError(f"{', '.join(given)} go with --hosts (a multi-node run)")
        return None

    hosts = parse_hosts(args.hosts)
    for flag, value in (
        ("--simulate", getattr(args, "simulate", None)),
        ("--sim-card", getattr(args, "sim_card", None)),
        ("--profile", args.profile or None),
        ("--launcher", args.launcher),
        ("--resume", getattr(args, "resume", None)),
    ):
        if value is not None:
            raise UsageError(
                f"{flag} does not go with --hosts: a multi-node run uses the nodes' own GPUs "
                "under torchrun"
            )
    config = load_fleet_config()
    return NodeOptions(
        hosts=hosts,
        nproc_per_node=args.nproc_per_node,
        gpus=parse_gpu_list(getattr(args, "gpus", None)),
        rdzv_port=args.rdzv_port if args.rdzv_port is not None else DEFAULT_RDZV_PORT,
        remote_python=resolve_remote_python(args.remote_python, config.remote_python),
        ssh_config=getattr(args, "ssh_config", None) or config.ssh_config,
        stop_grace_s=args.grace,
        node_dir=_node_dir(args.node_dir),
        start_timeout_s=_start_timeout(args.node_start_timeout),
    )


def _start_timeout(value: float | None) -> float:
    if value is None:
        return DEFAULT_START_TIMEOUT_S
    if not (math.isfinite(value) and 1 <= value <= 3600):
        raise UsageError(f"--node-start-timeout: between 1 and 3600 seconds, got {value:g}")
    return value


def _node_dir(text: str | None) -> str | None:
    """``--node-dir``: an absolute path (the nodes' home is not this one's)."""
    if text is None:
        return None
    if not text.strip() or "\0" in text:
        raise UsageError("--node-dir: empty; give an absolute directory such as /data/run")
    if not os.path.isabs(text):
        raise UsageError(
            f"--node-dir {text!r}: an absolute path, since each node resolves it on its own "
            f"(e.g. {os.path.join('/srv', text)})"
        )
    return os.path.normpath(text)
