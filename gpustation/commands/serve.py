"""``gpustation serve``: the Prometheus ``/metrics`` endpoint.

Binds to loopback unless told otherwise: exposing GPU and process telemetry to
the network is the user's explicit choice, and the command says so on start.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from gpustation.commands.options import add_gpu_options, backend_from_args
from gpustation.errors import UsageError
from gpustation.notify import alert_notifier_from_config, notify_warnings
from gpustation.serve.server import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_KEEP_ALIVE_S,
    DEFAULT_MAX_CONNECTIONS,
)
from gpustation.telemetry.backend import parse_gpu_list
from gpustation.telemetry.recording.recorder import RecordError, recorder_from_config
from gpustation.telemetry.sampler import Sampler

if TYPE_CHECKING:
    from gpustation.telemetry.model import Snapshot
    from gpustation.telemetry.recording.recorder import Recorder

# prometheus_client is imported only when serving, so that building the
# command-line parser (which every `gpustation snapshot` does) stays cheap.
DEFAULT_LISTEN = "127.0.0.1:9400"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``serve`` and its options."""

    p = sub.add_parser(
        "serve",
        help="serve GPU metrics for Prometheus at /metrics",
        description="Serve the GPUs' telemetry at http://HOST:PORT/metrics in the Prometheus "
        "text format, with dcgm-exporter's metric names and labels where DCGM has the "
        "field and gpustation_* metrics for the rest. Sampling runs on its own interval; "
        "a scrape only renders the latest sample.",
    )
    add_gpu_options(p)
    p.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to listen on (default {DEFAULT_LISTEN}; a non-loopback address "
        "makes the unauthenticated endpoint reachable from the network)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="sampling interval (0.1 to 3600, default 1)",
    )
    p.add_argument(
        "--tls-cert", type=Path, metavar="FILE", help="serve HTTPS with this certificate"
    )
    p.add_argument("--tls-key", type=Path, metavar="FILE", help="the certificate's private key")
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT_S,
        metavar="SECONDS",
        help="close a new connection that has not sent its request within SECONDS "
        f"(0.1 to 3600, default {DEFAULT_IDLE_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--keep-alive",
        type=float,
        default=DEFAULT_KEEP_ALIVE_S,
        metavar="SECONDS",
        help="keep a connection open this long for its next request, so that a scraper "
        f"over TLS does not handshake every scrape (0 to 3600, default "
        f"{DEFAULT_KEEP_ALIVE_S:g}; 0 closes after each response)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help=f"connections at once (1 to 10000, default {DEFAULT_MAX_CONNECTIONS}); at the "
        "cap the oldest idle one is closed, or new ones wait",
    )
    p.add_argument(
        "--basic-auth-file",
        type=Path,
        metavar="FILE",
        help="require HTTP basic authentication: user:password lines in a file only you "
        "can read (chmod 600)",
    )


def _warning(host: str, port: int, tls: bool = False, auth: bool = False) -> str:
    if tls and auth:
        return (
            f"gpustation: listening on {host}:{port}, reachable from the network, "
            "with TLS and basic authentication."
        )
    missing = " and ".join(w for w, have in (("TLS", tls), ("authentication", auth)) if not have)
    return (
        f"gpustation: warning: listening on {host}:{port}, which is not a loopback address: "
        f"the metrics endpoint is reachable from the network without {missing}. "
        "Anyone who can reach this port can read GPU, process and host telemetry "
        "(--tls-cert/--tls-key and --basic-auth-file close it)."
    )


def run(args: argparse.Namespace) -> int:
    """Sample and serve until interrupted (Ctrl-C or SIGTERM)."""
    # start-up time: the exporter (prometheus_client)
    from gpustation.serve.exporter import Exporter, is_loopback, parse_listen
    from gpustation.serve.http import load_users, serve, tls_context

    host, port = parse_listen(args.listen)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together: give both, or neither")
    tls = tls_context(args.tls_cert, args.tls_key) if args.tls_cert is not None else None
    users = load_users(args.basic_auth_file) if args.basic_auth_file is not None else None
    if not 0.1 <= args.interval <= 3600:
        raise UsageError(f"--interval: between 0.1 and 3600 seconds, got {args.interval:g}")
    if not 0.1 <= args.idle_timeout <= 3600:
        raise UsageError(f"--idle-timeout: between 0.1 and 3600 seconds, got {args.idle_timeout:g}")
    if not 0 <= args.keep_alive <= 3600:
        raise UsageError(f"--keep-alive: between 0 and 3600 seconds, got {args.keep_alive:g}")
    if not 1 <= args.max_connections <= 10000:
        raise UsageError(f"--max-connections: between 1 and 10000, got {args.max_connections}")

    # [record] enabled = true: keep a flight recording of what is served.
    try:
        recorder = recorder_from_config()
    except RecordError as err:
        print(f"gpustation: not recording: {err}", file=sys.stderr, flush=True)
        recorder = None

    # [notify]: the GPU events (lost, too hot, held idle) the alert rules raise
    alert_notifier = alert_notifier_from_config()
    for warning in notify_warnings():
        print(f"gpustation: warning: {warning}", file=sys.stderr, flush=True)
    backend = backend_from_args(args)
    backend.read_gpm = True  # DCGM_FI_PROF_*: the profiling metrics on every sample
    stop = threading.Event()

    def _on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, _on_term)
    exporter: Exporter | None = None
    server = None
    try:
        sampler = Sampler(backend, gpus=parse_gpu_list(getattr(args, "gpus", None)))
        sample = sampler.sample if recorder is None else _recording(sampler.sample, recorder)
        exporter = Exporter(sample, interval_s=args.interval, alert_notifier=alert_notifier)
        # The first sample is taken before the port opens, so no scrape ever
        # sees an endpoint without GPU series.
        exporter.start()
        server, _ = serve(
            exporter,
            host,
            port,
            tls=tls,
            users=users,
            idle_timeout_s=args.idle_timeout,
            max_connections=args.max_connections,
            keep_alive_s=args.keep_alive,
        )
        bound_port = server.server_address[1]
        if not is_loopback(host):
            print(
                _warning(host, bound_port, tls is not None, users is not None),
                file=sys.stderr,
                flush=True,
            )
        shown = f"[{host}]" if ":" in host else host
        note = " (SIMULATED GPUs)" if backend.simulated else ""
        scheme = "https" if tls is not None else "http"
        print(
            f"gpustation: serving {scheme}://{shown}:{bound_port}/metrics{note}, "
            f"sampling every {args.interval:g} s; Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        # Wake up now and then so Ctrl-C is handled promptly on every platform.
        while not stop.wait(0.5):
            pass
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        if server is not None:
            server.shutdown()
            server.server_close()
        if exporter is not None:
            exporter.stop()
        if alert_notifier is not None:
            alert_notifier.close()  # a last alert still goes out
        if recorder is not None:
            try:
                recorder.close()
            except RecordError as err:
                print(f"gpustation: recording stopped: {err}", file=sys.stderr, flush=True)
        backend.close()


def _recording(sample: Callable[[], Snapshot], recorder: Recorder) -> Callable[[], Snapshot]:
    """``sample`` that also records each snapshot; a failed write stops only the recording."""

    state: dict[str, Recorder | None] = {"recorder": recorder}

    def sample_and_record() -> Snapshot:
        snap = sample()
        rec = state["recorder"]
        if rec is not None:
            try:
                rec.add(snap)
            except RecordError as err:
                state["recorder"] = None
                print(f"gpustation: recording stopped: {err}", file=sys.stderr, flush=True)
        return snap

    return sample_and_record
