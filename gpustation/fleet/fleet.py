"""A fleet of hosts read over ssh: configuration, one row per GPU, ``snapshot --host``.

:class:`Fleet` owns one :class:`~gpustation.fleet.ssh.HostStream` per
host and turns their latest states into :class:`FleetRow` objects: one per GPU
across all hosts, or one row carrying the error for a host that is down. The
fleet screen and ``gpustation snapshot --host A --host B`` both render those
rows, with the same cells (:func:`row_cells`) and sort orders (:data:`SORT_KEYS`).

Configuration, in ``config.toml`` in the config directory::

    [fleet]
    hosts = ["alice@box1", "box2", "gpu-node:2222"]
    interval = 1                       # seconds between snapshots from each host
    remote_command = "gpustation"      # how to start gpustation on the hosts
    ssh_config = "~/.ssh/config-lab"   # optional: ssh -F FILE
    # or read every host from Prometheus (gpustation serve or dcgm-exporter targets):
    prometheus = "http://prometheus:9090"
    prometheus_user = "alice"                        # basic auth, with
    prometheus_password_file = "~/.config/prom-pw"   # a file only you can read
    prometheus_token_file = "~/.config/prom-token"   # or a bearer token
    prometheus_match = 'job="gpu"'                   # optional: only these targets
    prometheus_timeout = 15                          # seconds a request may take in all

``gpustation --fleet`` (and ``gpustation snapshot --fleet``) reads the hosts
listed there, as if each were given with ``--host``, or the Prometheus server
when no hosts are listed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpustation.config import config_path, section
from gpustation.errors import UsageError
from gpustation.fleet.promapi import check_url
from gpustation.fleet.ssh import (
    CONNECTING,
    DOWN,
    GARBAGE,
    UP,
    HostState,
    HostStream,
    parse_host,
    ssh_argv,
)
from gpustation.telemetry import format as fmt
from gpustation.telemetry import health
from gpustation.telemetry.model import GpuSample
from gpustation.textsafe import safe

FLEET_SCHEMA = "gpustation.fleet/1"
FIRST_SNAPSHOT_TIMEOUT_S = 10.0

# ---- configuration ------------------------------------------------------------


@dataclass(frozen=True)
class FleetConfig:
    """The ``[fleet]`` table of config.toml (every key optional)."""

    hosts: list[str] = field(default_factory=list)
    interval: float = 1.0
    remote_command: str | None = None
    ssh_config: str | None = None
    prometheus: str | None = None
    prometheus_user: str | None = None
    prometheus_password_file: str | None = None
    prometheus_token_file: str | None = None
    prometheus_match: str = ""
    #: the deadline of each request to Prometheus, in seconds (None: the client's)
    prometheus_timeout: float | None = None
    #: the Python that runs a multi-node run's node side (``gpustation run --hosts``)
    remote_python: str | None = None


_KEYS = {
    "hosts",
    "interval",
    "remote_command",
    "ssh_config",
    "prometheus",
    "prometheus_user",
    "prometheus_password_file",
    "prometheus_token_file",
    "prometheus_match",
    "prometheus_timeout",
    "remote_python",
}


def _prometheus_keys(table: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """The ``prometheus*`` keys, checked (the files are read only when used)."""

    out: dict[str, Any] = {}
    url = table.get("prometheus")
    if url is not None:
        try:
            if not isinstance(url, str):
                raise UsageError("prometheus: must be a URL string")
            out["prometheus"] = check_url(url, "prometheus")
        except UsageError as err:
            problems.append(str(err))
    for key in ("prometheus_user", "prometheus_password_file", "prometheus_token_file"):
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            problems.append(f"{key} must be a non-empty string")
        elif value is not None:
            out[key] = value if key == "prometheus_user" else str(Path(value).expanduser())
    if "prometheus_token_file" in out and "prometheus_user" in out:
        problems.append("give prometheus_user or prometheus_token_file, not both")
    if "prometheus_password_file" in out and "prometheus_user" not in out:
        problems.append("prometheus_password_file needs prometheus_user")
    match = table.get("prometheus_match")
    if match is not None:
        if not isinstance(match, str) or "{" in match or "}" in match:
            problems.append("prometheus_match must be label matchers such as 'job=\"gpu\"'")
        else:
            out["prometheus_match"] = match.strip()
    timeout = table.get("prometheus_timeout")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            problems.append("prometheus_timeout must be a number of seconds")
        elif not 0.1 <= timeout <= 600:
            problems.append(f"prometheus_timeout must be 0.1 to 600 seconds, got {timeout}")
        else:
            out["prometheus_timeout"] = float(timeout)
    return out


def load_fleet_config(path: Path | None = None) -> FleetConfig:
    """Read ``[fleet]`` from config.toml; a missing file means the defaults.

    Every problem in the table is collected and reported at once.
    """
    path = path or config_path()
    table = section("fleet", path)
    problems: list[str] = []
    hosts = table.get("hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        problems.append("hosts must be a list of strings")
        hosts = []
    else:
        for h in hosts:
            try:
                parse_host(h)
            except UsageError as err:
                problems.append(err.worded("hosts"))
    interval = table.get("interval", 1.0)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)):
        problems.append("interval must be a number of seconds")
        interval = 1.0
    elif not 0.1 <= interval <= 3600:
        problems.append(f"interval must be between 0.1 and 3600 seconds, got {interval}")
    command = table.get("remote_command")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        problems.append("remote_command must be a non-empty string")
        command = None
    remote_python = table.get("remote_python")
    if remote_python is not None and (
        not isinstance(remote_python, str) or not remote_python.strip()
    ):
        problems.append("remote_python must be a non-empty string")
        remote_python = None
    ssh_config = table.get("ssh_config")
    if ssh_config is not None and not isinstance(ssh_config, str):
        problems.append("ssh_config must be a path")
        ssh_config = None
    prom = _prometheus_keys(table, problems)
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        problems.append(f"unknown key(s): {', '.join(unknown)}")
    if problems:
        raise UsageError(f"{path} [fleet]: " + "; ".join(problems))
    if ssh_config:
        ssh_config = str(Path(ssh_config).expanduser())
    return FleetConfig(
        list(hosts), float(interval), command, ssh_config, remote_python=remote_python, **prom
    )


# ---- the fleet ----------------------------------------------------------------


@dataclass(frozen=True)
class FleetRow:
    """One GPU of one host, or (``gpu is None``) one host with no GPU to show."""

    host: str
    status: str  # up | stale | connecting | down | garbage | no GPUs
    error: str | None
    age_s: float | None
    gpu: GpuSample | None
    simulated: bool = False
    hostname: str | None = None  # what the host calls itself

    @property
    def key(self) -> str:
        return f"{self.host}#{self.gpu.index if self.gpu is not None else '-'}"

    @property
    def run(self) -> str | None:
        """What runs on the GPU: the process using the most memory, and how many more."""
        if self.gpu is None or not self.gpu.processes:
            return None
        procs = sorted(self.gpu.processes, key=lambda p: -(p.gpu_memory_mib or 0))
        top = procs[0]
        text = top.command or top.name or f"pid {top.pid}"
        if len(procs) > 1:
            text += f" (+{len(procs) - 1})"
        return text


def _status(state: HostState, now: float) -> str:
    if state.state == UP:
        if state.stale(now):
            return f"stale {state.age_s(now):.0f}s"
        return "up"
    return state.state


def rows_from_states(states: Sequence[HostState], now: float | None = None) -> list[FleetRow]:
    """One row per GPU across hosts (host order kept), or one row per host without GPUs."""
    now = time.time() if now is None else now
    rows: list[FleetRow] = []
    for st in states:
        status = _status(st, now)
        snap = st.snapshot
        if st.state == UP and snap is not None:
            if not snap.gpus:
                rows.append(
                    FleetRow(
                        st.name, "no GPUs", None, st.age_s(now), None, snap.simulated, snap.hostname
                    )
                )
            for gpu in snap.gpus:
                rows.append(
                    FleetRow(
                        st.name, status, None, st.age_s(now), gpu, snap.simulated, snap.hostname
                    )
                )
            continue
        error = st.error
        if st.state in (DOWN, GARBAGE) and st.retry_at is not None:
            wait = max(0.0, st.retry_at - now)
            error = f"{error or st.state} (retry in {wait:.0f}s)"
        elif st.state == CONNECTING and st.attempts > 1 and st.error:
            error = f"reconnecting; last error: {st.error}"
        rows.append(FleetRow(st.name, status, error, st.age_s(now), None))
    return rows


class FleetSource(Protocol):
    """What the fleet screen and ``snapshot`` use of a fleet: :class:`Fleet` (ssh) or
    :class:`~gpustation.fleet.prometheus.PrometheusFleet`."""

    interval: float

    @property
    def hosts(self) -> list[str]: ...

    def start(self) -> Any: ...

    def close(self) -> None: ...

    def states(self) -> list[HostState]: ...

    def state(self, host: str) -> HostState: ...

    def rows(self, now: float | None = None) -> list[FleetRow]: ...

    def wait_first(self, timeout: float = ...) -> list[HostState]: ...


class Fleet:
    """One stream per host; thread-safe reads of the latest state of each.

    ``argv_for`` builds the command for a host (default: :func:`ssh_argv`);
    tests and demos can stream from a local command instead.
    """

    def __init__(
        self,
        hosts: Sequence[str],
        interval: float = 1.0,
        remote_command: str | None = None,
        ssh_config: str | None = None,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        retry: bool = True,
        on_update: Callable[[HostStream, HostState], None] | None = None,
        argv_for: Callable[[str], list[str]] | None = None,
    ) -> None:
        problems = []
        for h in hosts:
            try:
                parse_host(h)
            except UsageError as err:
                problems.append(str(err))
        if problems:
            raise UsageError("; ".join(problems))
        if not hosts:
            raise UsageError("no hosts given")
        self.interval = interval
        if argv_for is None:

            def argv_for(host: str) -> list[str]:
                return ssh_argv(host, interval, remote_command, ssh_config)

        self.streams: dict[str, HostStream] = {}
        for h in dict.fromkeys(hosts):  # a host named twice is read once
            self.streams[h] = HostStream(
                h,
                argv_for(h),
                interval=interval,
                backoff_initial_s=backoff_initial_s,
                backoff_max_s=backoff_max_s,
                retry=retry,
                on_update=on_update,
            )

    @property
    def hosts(self) -> list[str]:
        return list(self.streams)

    def start(self) -> Fleet:
        for stream in self.streams.values():
            stream.start()
        return self

    def close(self) -> None:
        """Stop every stream and end every ssh child."""
        for stream in self.streams.values():
            stream._stop.set()  # ask all first, so the hosts wind down in parallel
        for stream in self.streams.values():
            stream.close()

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def states(self) -> list[HostState]:
        return [s.state() for s in self.streams.values()]

    def state(self, host: str) -> HostState:
        return self.streams[host].state()

    def rows(self, now: float | None = None) -> list[FleetRow]:
        return rows_from_states(self.states(), now)

    def wait_first(self, timeout: float = FIRST_SNAPSHOT_TIMEOUT_S) -> list[HostState]:
        """Wait until every host has sent a snapshot or failed (or ``timeout`` passes)."""
        deadline = time.monotonic() + timeout

        def settled(st: HostState) -> bool:
            return (st.state == UP and st.snapshot is not None) or st.state in (DOWN, GARBAGE)

        for stream in self.streams.values():
            stream.wait(settled, max(0.0, deadline - time.monotonic()))
        return self.states()


# ---- cells and sorting shared by every renderer -------------------------------

COLUMNS: tuple[tuple[str, str], ...] = (
    ("host", "Host"),
    ("status", "Status"),
    ("gpu", "GPU"),
    ("temp", "Temp °C"),
    ("power", "Power W"),
    ("util", "Util %"),
    ("vram", "VRAM"),
    ("throttle", "Throttle"),
    ("run", "Run"),
)


def row_cells(row: FleetRow) -> dict[str, str]:
    """The text of each column for one row (a missing value reads n/a), safe for a
    terminal: a host's error can quote what its ssh session printed."""
    return {k: safe(v) for k, v in _row_cells(row).items()}


def _row_cells(row: FleetRow) -> dict[str, str]:
    g = row.gpu
    cells = {"host": row.host, "status": row.status}
    if g is None:
        cells.update({k: "" for k, _ in COLUMNS if k not in cells})
        cells["run"] = row.error or ""
        return cells
    name = health.short_name(g.name)
    if g.lost:
        cells.update({k: "" for k, _ in COLUMNS if k not in cells})
        cells["gpu"] = f"{g.index} {name}"
        cells["run"] = "GPU LOST (fell off the bus)"
        return cells
    cells.update(
        {
            "gpu": f"{g.index} {name}",
            "temp": fmt.num(g.temperature_c),
            "power": fmt.pair(g.power_w, g.power_limit_w),
            "util": fmt.num(g.utilization_gpu_pct),
            "vram": f"{fmt.mib(g.memory_used_mib)}/{fmt.mib(g.memory_total_mib)}",
            "throttle": fmt.throttle(g.throttle_reasons),
            "run": row.run or "-",
        }
    )
    return cells


def is_limiting(row: FleetRow) -> bool:
    """True when the GPU is held back (power cap, thermal, HW slowdown)."""
    return row.gpu is not None and health.is_limited(row.gpu)


def cell_style(row: FleetRow, key: str) -> str:
    """The style of one cell: what needs attention stands out (the table and the TUI)."""
    if key == "status" and row.status != "up":
        return "bold red" if row.gpu is None else "yellow"
    if key == "throttle" and is_limiting(row):
        return "bold red"
    if key == "run" and row.gpu is None:
        return "red"
    if key == "host" and row.simulated:
        return "yellow"
    return ""


def _gpu_value(read: Callable[[GpuSample], Any]) -> Callable[[FleetRow], Any]:
    return lambda r: None if r.gpu is None or r.gpu.lost else read(r.gpu)


# column -> sort key; None means "no value" and always sorts last.
SORT_KEYS: dict[str, Callable[[FleetRow], Any]] = {
    "host": lambda r: (r.host, r.gpu.index if r.gpu else -1),
    "status": lambda r: (r.status != "up", r.status, r.host),
    "gpu": _gpu_value(lambda g: (g.index, g.name or "")),
    "temp": _gpu_value(lambda g: g.temperature_c),
    "power": _gpu_value(lambda g: g.power_w),
    "util": _gpu_value(lambda g: g.utilization_gpu_pct),
    "vram": _gpu_value(lambda g: g.memory_used_mib),
    "throttle": lambda r: None if r.gpu is None else (is_limiting(r), row_cells(r)["throttle"]),
    "run": lambda r: r.run,
}


def sort_rows(rows: Sequence[FleetRow], column: str, descending: bool = False) -> list[FleetRow]:
    """Rows ordered by ``column``; rows without a value stay last in both directions."""
    key = SORT_KEYS[column]
    have = [r for r in rows if key(r) is not None]
    missing = [r for r in rows if key(r) is None]
    have.sort(key=key, reverse=descending)
    return have + sorted(missing, key=SORT_KEYS["host"])


# ---- gpustation snapshot --host ... ------------------------------------------------


def fleet_document(states: Sequence[HostState]) -> dict[str, Any]:
    """The ``gpustation.fleet/1`` document: every host, with its snapshot or its error."""
    hosts: list[dict[str, Any]] = []
    for st in states:
        if st.state == UP and st.snapshot is not None:
            hosts.append({"host": st.name, "ok": True, "snapshot": st.snapshot.to_dict()})
        else:
            error = st.error or ("no snapshot yet" if st.state == CONNECTING else st.state)
            entry: dict[str, Any] = {"host": st.name, "ok": False, "error": error}
            if st.received_at is not None:
                entry["last_sample_time"] = st.received_at
            hosts.append(entry)
    return {"schema": FLEET_SCHEMA, "hosts": hosts}


def fleet_table(rows: Sequence[FleetRow]) -> Any:
    """A Rich table of fleet rows (host column first)."""
    # start-up time: rich, for terminal output only
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, header_style="bold")
    for key, title in COLUMNS:
        right = key in ("temp", "power", "util", "vram")
        table.add_column(title, justify="right" if right else "left", no_wrap=key != "run")
    for row in rows:
        cells = row_cells(row)
        table.add_row(*(Text(cells[key], style=cell_style(row, key)) for key, _ in COLUMNS))
    return table
