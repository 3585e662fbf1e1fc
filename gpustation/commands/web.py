"""``gpustation web``: the dashboard in a browser, through textual-serve.

Each browser connection gets a dashboard process of its own, read-only unless
``--allow-control``. Every request needs the token printed in the URL on
start; loopback is the default address, and another machine reaches it
through ``ssh -L``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import socket
import sys
from pathlib import Path

from gpustation.commands.options import add_gpu_options
from gpustation.errors import UsageError
from gpustation.serve.exporter import is_loopback, parse_listen
from gpustation.serve.webguard import (
    IDLE_TIMEOUT_S,
    MAX_CONNECTIONS,
    MAX_SESSIONS,
    canonical_host,
    listen_names,
)
from gpustation.telemetry.backend import parse_gpu_list

DEFAULT_LISTEN = "127.0.0.1:8765"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``web`` and its options."""
    p = sub.add_parser(
        "web",
        help="the dashboard in a browser (read-only unless --allow-control)",
        description="Serve the dashboard to a browser through textual-serve: each "
        "connection gets a dashboard of its own. Every request needs the token printed "
        "in the URL on start. The served dashboard shows everything and changes nothing "
        "(no signals to processes, no power, fan or profile change, no launching or "
        "stopping runs) unless --allow-control. Needs the web extra: "
        "pip install 'gpustation[web]'.",
    )
    add_gpu_options(p)
    p.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to listen on (default {DEFAULT_LISTEN}; from another machine: "
        "ssh -L 8765:127.0.0.1:8765 HOST)",
    )
    p.add_argument(
        "--allow-control",
        action="store_true",
        help="let the browser change the machine as the dashboard can: signal processes, "
        "set power limits and fans, apply profiles, launch and stop runs",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="take the token from FILE (only you may read it: chmod 600) instead of a new "
        "one each start",
    )
    p.add_argument(
        "--no-token",
        action="store_true",
        help="serve without a token: loopback and read-only only",
    )
    p.add_argument(
        "--server-name",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer to this name in the Host header (a DNS name of this machine or a "
        "proxy's); requests for any other name are refused",
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        default=None,
        metavar="N",
        help="dashboards open at once, each a process of its own (default 4)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=None,
        metavar="N",
        help="connections open at once; more wait (default 64)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="close a connection that sends no request for this long (default 10)",
    )
    p.add_argument(
        "--refresh",
        type=float,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="the dashboard's refresh interval (0.25 to 10, default 1)",
    )


def dashboard_options(args: argparse.Namespace) -> list[str]:
    """The dashboard options of ``args``, as the served dashboard's command line."""
    out: list[str] = []
    gpus = getattr(args, "gpus", None)
    if gpus:
        parse_gpu_list(gpus)  # a bad list is refused here, not in the browser
        out += ["--gpus", gpus]
    simulate = getattr(args, "simulate", None)
    if simulate is not None:
        out += ["--simulate"] if simulate < 0 else ["--simulate", str(simulate)]
    sim_card = getattr(args, "sim_card", None)
    if sim_card:
        out += ["--sim-card", sim_card]
    refresh = float(getattr(args, "refresh", 1.0))
    if not 0.25 <= refresh <= 10:  # also refuses nan
        raise UsageError(f"--refresh: between 0.25 and 10 seconds, got {refresh:g}")
    out += ["--refresh", f"{refresh:g}"]
    return out


def _limits(args: argparse.Namespace) -> tuple[int, int, float]:
    """(max sessions, max connections, idle timeout) of ``args``; UsageError if out of range."""

    sessions = MAX_SESSIONS if args.max_sessions is None else args.max_sessions
    if not 1 <= sessions <= 64:
        raise UsageError(f"--max-sessions: between 1 and 64, got {sessions}")
    connections = MAX_CONNECTIONS if args.max_connections is None else args.max_connections
    if not sessions + 4 <= connections <= 4096:
        raise UsageError(
            f"--max-connections: between --max-sessions + 4 ({sessions + 4}) and 4096 "
            f"(each dashboard holds one, its page needs a few more), got {connections}"
        )
    idle = IDLE_TIMEOUT_S if args.idle_timeout is None else args.idle_timeout
    if not 0.5 <= idle <= 3600:  # also refuses nan
        raise UsageError(f"--idle-timeout: between 0.5 and 3600 seconds, got {idle:g}")
    return sessions, connections, idle


def _token(args: argparse.Namespace, loopback: bool) -> str | None:
    # optional extra 'web'
    from gpustation.serve.web import new_token, read_token_file

    if args.no_token:
        if args.token_file is not None:
            raise UsageError("--no-token and --token-file: give one or the other")
        if args.allow_control:
            raise UsageError(
                "--allow-control needs a token: leave out --no-token (a token is made on "
                "start) or give --token-file"
            )
        if not loopback:
            raise UsageError(
                "--no-token only on a loopback address (e.g. --listen 127.0.0.1:8765): "
                "anyone who reaches the port would see the machine"
            )
        return None
    if args.token_file is not None:
        return read_token_file(args.token_file)
    return new_token()


def _warning(where: str, allow_control: bool) -> str:
    change = (
        " and change it (signal processes, set power limits and fans, launch and stop runs)"
        if allow_control
        else ""
    )
    return (
        f"gpustation: warning: listening on {where}, which is not a loopback address: "
        f"anyone who can reach this port and has the token can see this machine's GPUs, "
        f"processes and runs{change}. The connection is plain HTTP, token included; "
        "listening on loopback and using ssh -L keeps both off the network."
    )


def _check_web_extra() -> None:
    """UsageError naming the extra to install when the web server's libraries are missing."""
    try:
        import gpustation.serve.web  # noqa: F401  # guarded: a missing 'web' extra is said, exit 2
    except ModuleNotFoundError as err:
        raise UsageError(
            f"gpustation web needs the web extra ({err.name or err} is not installed): "
            "pip install 'gpustation[web]'"
        ) from None


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted (Ctrl-C: 130, SIGTERM: 0)."""
    _check_web_extra()

    host, port = parse_listen(args.listen)
    host = canonical_host(host).strip("[]")  # 127.1 is 127.0.0.1, and loopback
    names = tuple(canonical_host(n) for n in args.server_name)
    for given, name in zip(args.server_name, names, strict=True):
        if not re.fullmatch(r"[a-z0-9_.-]+|\[[0-9a-f:.]+\]", name):
            raise UsageError(
                f"--server-name: a host name or address without a port or a scheme, "
                f"e.g. gpubox.example.org, got {given!r}"
            )
    if args.allow_control and getattr(args, "read_only", False):
        raise UsageError("--read-only and --allow-control: give one or the other")
    options = dashboard_options(args)
    sessions, connections, idle_s = _limits(args)
    loopback = is_loopback(host)
    token = _token(args, loopback)

    # optional extra 'web'
    from gpustation.serve.web import (
        DashboardServer,
        dashboard_command,
        serve_until_stopped,
        url_host,
    )

    hostname = socket.gethostname()
    command = dashboard_command(options, read_only=not args.allow_control)
    server = DashboardServer(
        command,
        host,
        port,
        token,
        title=f"gpustation on {hostname}",
        names=listen_names(host, names),
        max_sessions=sessions,
    )

    def ready(bound: int) -> None:
        shown = url_host(hostname if host in ("0.0.0.0", "::") else host)
        query = f"?token={token}" if token is not None else ""
        mode = "control allowed" if args.allow_control else "read-only"
        print(
            f"gpustation: the dashboard at http://{shown}:{bound}/{query} ({mode}); Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        if loopback:
            print(
                f"gpustation: listening on loopback only; from another machine: "
                f"ssh -L {bound}:{url_host(host)}:{bound} {hostname}, then open that URL there",
                file=sys.stderr,
                flush=True,
            )
        else:
            where = f"{url_host(host)}:{bound}"
            print(_warning(where, args.allow_control), file=sys.stderr, flush=True)

    asyncio.run(
        serve_until_stopped(server, ready, idle_timeout_s=idle_s, max_connections=connections)
    )
    return 0
