"""``gpustation`` with no subcommand: the dashboard, or the fleet view (--host, --prometheus)."""

from __future__ import annotations

import argparse

from gpustation.errors import UsageError
from gpustation.fleet.fleet import load_fleet_config
from gpustation.fleet.prometheus import prometheus_fleet
from gpustation.telemetry.backend import parse_gpu_list
from gpustation.telemetry.recording.recorder import RecordError, recorder_from_config


def run(args: argparse.Namespace) -> int:
    gpus = parse_gpu_list(getattr(args, "gpus", None))
    refresh = float(getattr(args, "refresh", 1.0))
    if not 0.25 <= refresh <= 10:  # also refuses nan
        raise UsageError(f"--refresh: between 0.25 and 10 seconds, got {refresh:g}")
    hosts = list(getattr(args, "host", None) or [])
    prometheus = getattr(args, "prometheus", None)
    if prometheus:
        if hosts:
            raise UsageError("--prometheus: give --host or --prometheus, not both")
        # start-up time: the TUI (textual)
        from gpustation.tui.fleet.screen import FleetApp
        from gpustation.tui.keyids import keymap_from_config

        app = FleetApp(
            [],
            refresh_s=refresh,
            fleet=prometheus_fleet(prometheus, load_fleet_config(), refresh),
            keymap=keymap_from_config(),
        )
        try:
            return int(app.run() or 0)
        finally:
            app.fleet.close()
    if hosts:
        # start-up time: the TUI (textual)
        from gpustation.tui.fleet.screen import run_fleet
        from gpustation.tui.keyids import keymap_from_config

        return run_fleet(
            hosts,
            refresh_s=refresh,
            ssh_config=getattr(args, "ssh_config", None),
            keymap=keymap_from_config(),
        )
    # start-up time: the recorder and the dashboard's source only for the dashboard
    from gpustation.tui.source import dashboard_source

    # [record] enabled = true: the dashboard keeps a flight recording meanwhile;
    # one that cannot be written is said on the banner, not a reason to stay shut.
    record_error = None
    try:
        recorder = recorder_from_config()
    except RecordError as err:
        recorder, record_error = None, str(err)
    try:
        source = dashboard_source(
            gpus, getattr(args, "simulate", None), getattr(args, "sim_card", None), recorder
        )
        source.record_error = record_error
        # The driver opens and the first sample is read while the UI is imported.
        source.start_first_pass()
        # start-up time: the TUI (textual) loads while the first pass reads
        from gpustation.tui.app import run_dashboard
        from gpustation.tui.keyids import keymap_from_config

        return run_dashboard(
            refresh_s=refresh,
            read_only=bool(getattr(args, "read_only", False)),
            source=source,
            keymap=keymap_from_config(),
        )
    finally:
        if recorder is not None:
            recorder.close()
