"""The options and helpers the subcommands share.

``--gpus``/``--simulate``/``--sim-card`` for every command that reads or
changes GPUs, ``--fleet``/``--ssh-config`` for those that read other hosts,
and what the ``power``, ``fan`` and ``profile`` commands share.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpustation import paths
from gpustation.errors import UsageError
from gpustation.telemetry.backend import Backend, parse_gpu_list, select_gpus
from gpustation.telemetry.registry import open_backend
from gpustation.telemetry.sim_last import CARD_KEYS, DEFAULT_CARD, DEFAULT_COUNT, last_machine


def add_gpu_options(parser: argparse.ArgumentParser) -> None:
    """The options every command that reads or changes GPUs accepts.

    Their defaults are left unset so that ``gpustation --simulate 2 snapshot``
    and ``gpustation snapshot --simulate 2`` mean the same; read them with
    ``getattr(args, name, None)``. The defaults said are those a command
    would open now: the simulated machine last opened, when there is one.
    """
    count, card = last_machine()
    count_default = f"{count}, as last simulated" if count else str(DEFAULT_COUNT)
    card_default = f"{card}, as last simulated" if card else DEFAULT_CARD
    env_card = os.environ.get("GPUSTATION_SIM_CARD")
    if env_card in CARD_KEYS:
        card_default = f"{env_card}, from GPUSTATION_SIM_CARD"
    parser.add_argument(
        "--gpus",
        metavar="LIST",
        default=argparse.SUPPRESS,
        help="GPU indices to use, e.g. 0,2 or 0-3 (default: all)",
    )
    parser.add_argument(
        "--simulate",
        nargs="?",
        type=int,
        const=-1,
        default=argparse.SUPPRESS,
        metavar="N",
        help=f"use N simulated GPUs instead of NVML (default N: {count_default})",
    )
    parser.add_argument(
        "--sim-card",
        choices=list(CARD_KEYS),
        default=argparse.SUPPRESS,
        help=f"card the simulated GPUs model (default {card_default})",
    )


def backend_from_args(
    args: argparse.Namespace,
    fallback_to_sim: bool = False,
    one_shot: bool = False,
) -> Backend:
    """The backend the options ask for; what it reused from last time is said on stderr."""
    backend = open_backend(
        simulate=getattr(args, "simulate", None),
        sim_card=getattr(args, "sim_card", None),
        fallback_to_sim=fallback_to_sim,
        one_shot=one_shot,
    )
    if backend.kept:
        print(f"gpustation: {backend.kept}", file=sys.stderr)
    return backend


class _FleetAction(argparse.Action):
    """``--fleet``: add the ``[fleet]`` hosts of config.toml to ``--host``.

    Done while parsing so that every consumer of ``args.host`` (the dashboard,
    ``snapshot``) sees the configured hosts without knowing about the config.
    """

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        # start-up time: the fleet config, only with --host
        from gpustation.fleet.fleet import load_fleet_config

        try:
            config = load_fleet_config()
        except UsageError as err:
            parser.error(str(err))
        if not config.hosts and config.prometheus and not getattr(namespace, "prometheus", None):
            namespace.prometheus = config.prometheus
            namespace.fleet = True
            return
        if not config.hosts:
            parser.error(
                "--fleet: no hosts listed; add [fleet] hosts = [...] or prometheus = URL to "
                f"{paths.config_dir() / 'config.toml'}, or name hosts with --host"
            )
        hosts = list(getattr(namespace, "host", None) or [])
        namespace.host = hosts + [h for h in config.hosts if h not in hosts]
        namespace.fleet = True


def _prometheus_url(text: str) -> str:
    # start-up time: the fleet, only with --prometheus
    from gpustation.fleet.promapi import check_url

    try:
        return check_url(text)
    except UsageError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--prometheus: ")) from None


def add_fleet_options(parser: argparse.ArgumentParser) -> None:
    """``--fleet``, ``--ssh-config`` and ``--prometheus`` (unset defaults, read with getattr)."""
    parser.add_argument(
        "--fleet",
        action=_FleetAction,
        default=argparse.SUPPRESS,
        help="also read the hosts listed under [fleet] in config.toml",
    )
    parser.add_argument(
        "--ssh-config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="ssh client config for reaching the hosts (ssh -F FILE)",
    )
    parser.add_argument(
        "--prometheus",
        metavar="URL",
        type=_prometheus_url,
        default=argparse.SUPPRESS,
        help="read the fleet from this Prometheus server: every target with DCGM_FI_* "
        "series (gpustation serve, dcgm-exporter) is a host",
    )


def add_control_options(parser: argparse.ArgumentParser, dry_run: bool = True) -> None:
    """``--gpus``/``--simulate``/``--sim-card`` and, for changes, ``--dry-run``."""
    add_gpu_options(parser)
    if dry_run:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="check against the cards and print what would be set; change nothing",
        )


def add_controller_options(parser: argparse.ArgumentParser) -> None:
    """Options of the fan-curve controller loop."""
    parser.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help="poll every SECONDS instead of the profile's poll_interval_s",
    )
    parser.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="stop after SECONDS (fans go back to automatic)",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="poll once, then hand the fans back (a quick check of the whole path)",
    )


@contextmanager
def open_gpus(args: argparse.Namespace) -> Iterator[tuple[Backend, list[int]]]:
    """The backend the options ask for and the GPUs selected with ``--gpus``."""
    wanted = parse_gpu_list(getattr(args, "gpus", None))
    backend = backend_from_args(args)
    try:
        yield backend, select_gpus(backend, wanted)
    finally:
        backend.close()


def simulated_banner(backend: Backend) -> None:
    """Every output built from simulated cards says so."""
    if backend.simulated:
        print("SIMULATED GPUs (no hardware is changed)")
        if backend.note:
            print(backend.note)


def print_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")


def command_text(*parts: object) -> str:
    """How a change is attributed in the journal: the command that made it."""
    return "gpustation " + " ".join(str(p) for p in parts if p not in (None, ""))


def gpus_suffix(args: argparse.Namespace) -> str:
    gpus = getattr(args, "gpus", None)
    return f"--gpus {gpus}" if gpus else ""


def check_interval(args: argparse.Namespace) -> None:
    interval = getattr(args, "interval", None)
    if interval is not None and not 0.05 <= interval <= 60:
        raise UsageError(f"--interval: between 0.05 and 60 seconds, got {interval:g}")
    duration = getattr(args, "duration", None)
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise UsageError(f"--duration: a number of seconds above 0, got {duration:g}")
