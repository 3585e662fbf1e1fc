"""``gpustation snapshot --host A --host B`` (or ``--prometheus URL``): the fleet as one
table or JSON document."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from gpustation.errors import EXIT_UNREACHABLE, UsageError
from gpustation.fleet.fleet import (
    FIRST_SNAPSHOT_TIMEOUT_S,
    Fleet,
    FleetConfig,
    FleetSource,
    fleet_document,
    fleet_table,
    load_fleet_config,
    rows_from_states,
)
from gpustation.fleet.prometheus import prometheus_fleet
from gpustation.fleet.ssh import DOWN, GARBAGE, UP, HostState, parse_host
from gpustation.telemetry.sampler import ticks


def fleet_settings(args: argparse.Namespace) -> tuple[FleetConfig, str | None]:
    config = load_fleet_config()
    ssh_config = getattr(args, "ssh_config", None) or config.ssh_config
    return config, ssh_config


def run_snapshot_fleet(args: argparse.Namespace, hosts: list[str]) -> int:
    """``gpustation snapshot --host A --host B``: the fleet as one table or JSON document.

    Exit status 0 when every host answered, 6 when any could not be read (the
    others are still printed).
    """
    for h in hosts:  # refuse a bad host before any ssh starts
        parse_host(h)
    config, ssh_config = fleet_settings(args)
    watch = getattr(args, "watch", None)
    interval = watch if watch is not None else 1.0
    fleet = Fleet(
        hosts,
        interval=interval,
        remote_command=config.remote_command,
        ssh_config=ssh_config,
        retry=watch is not None,
    )
    return _print_fleet(args, fleet)


def run_snapshot_prometheus(args: argparse.Namespace, url: str) -> int:
    """``gpustation snapshot --prometheus URL``: every host Prometheus scrapes, as ``--host`` does.

    Exit status 0 when every host is up, 6 when Prometheus cannot be read, has
    no GPU series, or some host is down (the others are still printed).
    """
    if getattr(args, "host", None):
        raise UsageError("--prometheus: give --host or --prometheus, not both")

    config = load_fleet_config()
    watch = getattr(args, "watch", None)
    fleet = prometheus_fleet(url, config, watch if watch is not None else 1.0)
    return _print_fleet(args, fleet, prometheus=fleet.error_text)


def _print_fleet(
    args: argparse.Namespace,
    fleet: FleetSource,
    prometheus: Callable[[], str | None] | None = None,
) -> int:
    watch = getattr(args, "watch", None)
    as_json = bool(getattr(args, "json", False))
    interval = watch if watch is not None else 1.0
    previous = _interrupt_on_sigterm()
    try:
        fleet.start()
        if watch is None:
            states = fleet.wait_first(FIRST_SNAPSHOT_TIMEOUT_S + 5)
            states = [_timed_out(st) for st in states]
            _emit(states, as_json, watching=False)
            problem = prometheus() if prometheus is not None else None
            if problem:
                print(f"gpustation: {problem}", file=sys.stderr)
            return 0 if states and all(st.state == UP for st in states) else EXIT_UNREACHABLE
        fleet.wait_first(min(FIRST_SNAPSHOT_TIMEOUT_S, 3 * interval + 5))
        for _ in ticks(interval):
            _emit(fleet.states(), as_json, watching=True)
        return 0  # pragma: no cover - ticks only ends by an exception
    except _Terminated:
        return 0  # SIGTERM: a stop asked for, not an interruption
    finally:
        fleet.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class _Terminated(Exception):
    """SIGTERM arrived during a watch."""


def _interrupt_on_sigterm() -> Any:
    """Make SIGTERM end a watch cleanly, so the ssh children are closed too."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def _raise(signum: int, frame: Any) -> None:
        raise _Terminated

    return signal.signal(signal.SIGTERM, _raise)


def _timed_out(st: HostState) -> HostState:
    if st.state == UP and st.snapshot is not None:
        return st
    if st.state in (DOWN, GARBAGE):
        return st

    return replace(st, state=DOWN, error=f"no snapshot within {FIRST_SNAPSHOT_TIMEOUT_S + 5:.0f} s")


_console: Any = None


def _emit(states: Sequence[HostState], as_json: bool, watching: bool) -> None:
    global _console
    if as_json:
        doc = fleet_document(states)
        if watching:
            sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
        else:
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        sys.stdout.flush()
        return
    # start-up time: rich, for terminal output only
    from rich.console import Console
    from rich.text import Text

    if _console is None:
        _console = Console(highlight=False, soft_wrap=False)
        if not _console.is_terminal:
            _console.width = max(_console.width, 160)
    if watching and _console.is_terminal:
        _console.clear()
    rows = rows_from_states(states)
    up = sum(1 for st in states if st.state == UP)
    title = Text(
        f"fleet: {up}/{len(states)} hosts up, {sum(1 for r in rows if r.gpu)} GPUs", style="bold"
    )
    if any(r.simulated for r in rows):
        title.append("  SIMULATED GPUs on some hosts", style="bold black on yellow")
    _console.print(title)
    _console.print(fleet_table(rows))
    if watching and not _console.is_terminal:
        _console.print()
    sys.stdout.flush()
