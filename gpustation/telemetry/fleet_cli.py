"""The fleet's command-line options, kept apart so every command can afford them.

``gpustation`` and ``gpustation snapshot`` add these to their parsers; this
module imports nothing beyond argparse until ``--fleet`` is actually used, so
building a parser stays cheap.
"""

from __future__ import annotations

import argparse

TYPE_CHECKING = False  # typing stays out of a one-shot snapshot
if TYPE_CHECKING:
    from typing import Any


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
        from gpustation import paths
        from gpustation.errors import UsageError
        from gpustation.telemetry.fleet import load_fleet_config

        try:
            config = load_fleet_config()
        except UsageError as err:
            parser.error(str(err))
        if not config.hosts:
            parser.error(
                "--fleet: no hosts listed; add [fleet] hosts = [...] to "
                f"{paths.config_dir() / 'config.toml'}, or name hosts with --host"
            )
        hosts = list(getattr(namespace, "host", None) or [])
        namespace.host = hosts + [h for h in config.hosts if h not in hosts]
        namespace.fleet = True


def add_fleet_options(parser: argparse.ArgumentParser) -> None:
    """``--fleet`` and ``--ssh-config`` (unset defaults, read with getattr)."""
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
