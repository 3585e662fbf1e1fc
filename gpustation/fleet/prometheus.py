"""A fleet read from Prometheus: one host per scrape target, no ssh.

:class:`PrometheusFleet` offers what the fleet screen and ``snapshot`` use of
:class:`~gpustation.fleet.fleet.Fleet` (``start``, ``states``, ``state``,
``rows``, ``wait_first``, ``close``, ``hosts``) and fills the same
:class:`~gpustation.fleet.ssh.HostState` values, so either source renders
the same way. One thread polls Prometheus's HTTP API every ``interval``
seconds with three instant queries (``/api/v1/query``):

1. ``max by (__name__, job, instance, gpu, fan, GPU_I_ID)
   ({__name__=~"DCGM_FI_...|gpustation_..."})``: the latest value of every
   changing series the model knows, from ``gpustation serve`` or plain
   dcgm-exporter, with only the labels that tell series apart;
2. ``max by (job, instance) (timestamp(DCGM_FI_DEV_GPU_TEMP) or ...)``: each
   target's newest sample time (an instant query stamps every value with the
   evaluation time; ``timestamp()`` of a selector gives the sample's own);
3. ``up``: whether Prometheus could scrape each target.

Every :data:`STATIC_REFRESH_S`, and when a host appears, two more: each card's
names (``group by (..., UUID, modelName, pci_bus_id, Hostname, hostname,
DCGM_FI_DRIVER_VERSION)``) and the series of :data:`STATIC_SERIES` (limits,
maxima, VRAM total).

A host is a scrape target (its ``instance`` label) that has GPU series, shown
with its ``Hostname`` (dcgm-exporter) or ``hostname`` (gpustation) label. A
host whose scrape fails (``up`` 0), whose series vanished, or whose newest
sample is older than three of its scrape intervals is down, with the time of
its last sample. A target already down when the source first sees it is
asked about once (did it have GPU series in the last :data:`DISCOVERY_WINDOW`,
and when was its last sample?).

:func:`host_history` reads the last minutes of temperature, power,
utilisation, SM clock and VRAM of one host with ``/api/v1/query_range``.

Requests use urllib with a time-out each; credentials (basic auth or a bearer
token) come from files named in config.toml, never from the command line.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import re
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpustation.errors import EXIT_UNREACHABLE, GpustationError, UsageError
from gpustation.fleet.fleet import FleetConfig, FleetRow, rows_from_states
from gpustation.fleet.ssh import CONNECTING, DOWN, STOPPED, UP, HostState
from gpustation.telemetry.history import History
from gpustation.telemetry.model import GpuSample, Snapshot, decode_throttle
from gpustation.textsafe import safe

REQUEST_TIMEOUT_S = 5.0
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
#: how far back the discovery query looks for targets that are already down
DISCOVERY_WINDOW = "10m"
#: assumed scrape interval until two samples of a host have been seen (Prometheus's default)
DEFAULT_SCRAPE_INTERVAL_S = 60.0
STALE_INTERVALS = 3
#: targets already down when first seen, asked about per pass
PROBES_PER_PASS = 64


class PrometheusError(GpustationError):
    """Prometheus could not be reached or answered with an error."""

    exit_code = EXIT_UNREACHABLE


def check_url(text: str, option: str = "--prometheus") -> str:
    """A Prometheus base URL (http or https, a host, no credentials); UsageError otherwise."""
    shown = safe(text)
    try:
        parts = urllib.parse.urlsplit(text.strip())
        port = parts.port
    except ValueError as err:
        raise UsageError(f"{option}: {shown!r} is not a URL ({err})") from None
    if parts.scheme not in ("http", "https"):
        raise UsageError(
            f"{option}: {shown!r} must start with http:// or https:// (e.g. http://prometheus:9090)"
        )
    if not parts.hostname:
        raise UsageError(f"{option}: {shown!r} names no host")
    if parts.username is not None or parts.password is not None:
        raise UsageError(
            f"{option}: put no credentials in the URL (they would show in ps and shell "
            "history); use [fleet] prometheus_user/prometheus_password_file or "
            "prometheus_token_file in config.toml"
        )
    if parts.query or parts.fragment:
        raise UsageError(f"{option}: {shown!r}: give the server's base URL, without ?query or #")
    if port is not None and port == 0:
        raise UsageError(f"{option}: port must be 1-65535 in {shown!r}")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def read_secret(path: str, what: str) -> str:
    """The first line of a file only its owner can read (a password or a token)."""
    p = Path(path).expanduser()
    try:
        info = p.stat()
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UsageError(f"{what}: {p} can be read by other users; chmod 600 it")
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise UsageError(f"{what}: cannot read {p}: {err.strerror or err}") from None
    secret = text.splitlines()[0].strip() if text.strip() else ""
    if not secret:
        raise UsageError(f"{what}: {p} is empty")
    return secret


def auth_header(
    user: str | None = None, password_file: str | None = None, token_file: str | None = None
) -> str | None:
    """The Authorization header for basic auth or a bearer token (or None for neither)."""
    if token_file:
        return "Bearer " + read_secret(token_file, "prometheus_token_file")
    if user:
        password = read_secret(password_file, "prometheus_password_file") if password_file else ""
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return None


class PrometheusClient:
    """Instant and range queries against one Prometheus server (or anything with its API)."""

    def __init__(
        self, url: str, authorization: str | None = None, timeout_s: float = REQUEST_TIMEOUT_S
    ) -> None:
        self.url = check_url(url)
        self.timeout_s = timeout_s
        self._headers = {"Accept": "application/json", "User-Agent": "gpustation"}
        if authorization:
            self._headers["Authorization"] = authorization

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._call("/api/v1/query", params, "vector")

    def query_range(
        self, expr: str, start: float, end: float, step_s: float
    ) -> list[dict[str, Any]]:
        params = {
            "query": expr,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{step_s:g}",
        }
        return self._call("/api/v1/query_range", params, "matrix")

    def _call(self, path: str, params: dict[str, str], kind: str) -> list[dict[str, Any]]:
        body = urllib.parse.urlencode(params).encode()
        request = urllib.request.Request(
            self.url + path,
            data=body,
            headers={**self._headers, "Content-Type": "application/x-www-form-urlencoded"},
            method="POST",
        )
        where = f"Prometheus at {self.url}"
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as err:
            detail = _api_error(err.read(65536)) or err.reason
            raise PrometheusError(f"{where}: HTTP {err.code}: {safe(str(detail))}") from None
        except urllib.error.URLError as err:
            reason = getattr(err.reason, "strerror", None) or err.reason
            raise PrometheusError(f"{where}: cannot connect ({safe(str(reason))})") from None
        except (OSError, ValueError) as err:  # time-outs, resets, a malformed reply
            raise PrometheusError(f"{where}: {safe(str(err) or type(err).__name__)}") from None
        if len(raw) > MAX_RESPONSE_BYTES:
            raise PrometheusError(f"{where}: answer larger than {MAX_RESPONSE_BYTES >> 20} MiB")
        try:
            doc = json.loads(raw)
        except ValueError:
            raise PrometheusError(f"{where}: the answer is not JSON (is it Prometheus?)") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            why = doc.get("error") if isinstance(doc, dict) else None
            raise PrometheusError(f"{where}: query failed: {safe(str(why))}")
        data = doc.get("data")
        if not isinstance(data, dict) or data.get("resultType") != kind:
            raise PrometheusError(f"{where}: expected a {kind} result")
        result = data.get("result")
        return [r for r in result if isinstance(r, dict)] if isinstance(result, list) else []


def _api_error(raw: bytes) -> str | None:
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return str(doc.get("error")) if isinstance(doc, dict) and doc.get("error") else None


#: label text repeats across every series of a host: clean each distinct string once
_clean = functools.lru_cache(maxsize=1 << 16)(safe)


# ---- series -> model ------------------------------------------------------------------------


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _set(name: str) -> Callable[[GpuSample, float, dict[str, str]], None]:
    return lambda g, v, _labels: setattr(g, name, v)


def _set_pcie(name: str, scale: float = 1.0) -> Callable[[GpuSample, float, dict[str, str]], None]:
    return lambda g, v, _labels: setattr(g.pcie, name, v * scale)


def _set_int(name: str) -> Callable[[GpuSample, float, dict[str, str]], None]:
    return lambda g, v, _labels: setattr(g, name, int(v))


def _set_pcie_int(name: str) -> Callable[[GpuSample, float, dict[str, str]], None]:
    return lambda g, v, _labels: setattr(g.pcie, name, int(v))


def _fan(g: GpuSample, v: float, labels: dict[str, str]) -> None:
    try:
        fan = int(labels.get("fan", ""))
    except ValueError:
        return
    if 0 <= fan < 64:
        while len(g.fans_pct) <= fan:
            g.fans_pct.append(None)  # type: ignore[arg-type]  # a fan not exported
        g.fans_pct[fan] = v


#: GPU series (dcgm-exporter's names, then gpustation's) -> how each fills a GpuSample.
#: Both exporters export W, MHz, MiB, °C and %; energy is mJ, PCIe throughput bytes/s.
GPU_SERIES: dict[str, Callable[[GpuSample, float, dict[str, str]], None]] = {
    "DCGM_FI_DEV_GPU_TEMP": _set("temperature_c"),
    "DCGM_FI_DEV_SLOWDOWN_TEMP": _set("temperature_slowdown_c"),
    "DCGM_FI_DEV_SHUTDOWN_TEMP": _set("temperature_shutdown_c"),
    "DCGM_FI_DEV_POWER_USAGE": _set("power_w"),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": _set("power_limit_w"),
    "DCGM_FI_DEV_SM_CLOCK": _set("clock_sm_mhz"),
    "DCGM_FI_DEV_MEM_CLOCK": _set("clock_mem_mhz"),
    "DCGM_FI_DEV_FB_USED": _set("memory_used_mib"),
    "DCGM_FI_DEV_FB_TOTAL": _set("memory_total_mib"),
    "DCGM_FI_DEV_GPU_UTIL": _set("utilization_gpu_pct"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": _set("utilization_memory_pct"),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": lambda g, v, _l: setattr(g, "energy_j", v / 1000.0),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": _set_pcie_int("replay_errors"),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": lambda g, v, _l: setattr(
        g, "throttle_reasons", decode_throttle(int(v))
    ),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": lambda g, v, _l: setattr(
        g, "throttle_reasons", decode_throttle(int(v))
    ),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": _set_int("ecc_uncorrected"),
    "DCGM_FI_PROF_PCIE_TX_BYTES": _set_pcie("tx_kib_s", 1 / 1024),
    "DCGM_FI_PROF_PCIE_RX_BYTES": _set_pcie("rx_kib_s", 1 / 1024),
    "gpustation_power_limit_watts": _set("power_limit_w"),
    "gpustation_power_default_limit_watts": _set("power_default_w"),
    "gpustation_power_min_limit_watts": _set("power_min_w"),
    "gpustation_power_max_limit_watts": _set("power_max_w"),
    "gpustation_temperature_slowdown_celsius": _set("temperature_slowdown_c"),
    "gpustation_sm_clock_max_mhz": _set("clock_sm_max_mhz"),
    "gpustation_pcie_link_gen": _set_pcie_int("gen"),
    "gpustation_pcie_link_width": _set_pcie_int("width"),
    "gpustation_pcie_link_gen_max": _set_pcie_int("max_gen"),
    "gpustation_pcie_link_width_max": _set_pcie_int("max_width"),
    "gpustation_pcie_tx_bytes_per_second": _set_pcie("tx_kib_s", 1 / 1024),
    "gpustation_pcie_rx_bytes_per_second": _set_pcie("rx_kib_s", 1 / 1024),
    "gpustation_pstate": _set_int("pstate"),
    "gpustation_ecc_uncorrected_errors": _set_int("ecc_uncorrected"),
    "gpustation_gpu_lost": lambda g, v, _l: setattr(g, "lost", v >= 1),
    "gpustation_fan_speed_percent": _fan,
}
#: series only to complete others (VRAM total = used + free + reserved where no total is exported)
_HELPER_SERIES = ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
#: per-target series without a ``gpu`` label
HOST_SERIES = ("gpustation_simulated", "gpustation_snapshot_timestamp_seconds", "gpustation_gpus")
ALL_SERIES = (*GPU_SERIES, *_HELPER_SERIES, *HOST_SERIES)
#: series that change only when a card is reconfigured: read with the cards' names
#: every :data:`STATIC_REFRESH_S` (or when a host appears), not every pass
STATIC_SERIES = (
    "DCGM_FI_DEV_SLOWDOWN_TEMP",
    "DCGM_FI_DEV_SHUTDOWN_TEMP",
    "DCGM_FI_DEV_FB_TOTAL",
    "gpustation_power_default_limit_watts",
    "gpustation_power_min_limit_watts",
    "gpustation_power_max_limit_watts",
    "gpustation_temperature_slowdown_celsius",
    "gpustation_sm_clock_max_mhz",
    "gpustation_pcie_link_gen_max",
    "gpustation_pcie_link_width_max",
)
FAST_SERIES = tuple(n for n in ALL_SERIES if n not in STATIC_SERIES)
STATIC_REFRESH_S = 30.0
#: what marks a target as a GPU host in the discovery query
_PRESENCE = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "gpustation_gpus")


def _selector(names: Sequence[str], matchers: str = "") -> str:
    alternatives = "|".join(names)
    extra = f",{matchers}" if matchers else ""
    return f'{{__name__=~"{alternatives}"{extra}}}'


def _newest_sample(matchers: str = "") -> str:
    """Per GPU and per target, the time of the newest sample of the presence series.

    ``timestamp()`` drops the metric name, so series that differ only by name
    would collide; ``or`` keeps one of each label set instead.
    """
    extra = f"{{{matchers}}}" if matchers else ""
    return " or ".join(f"timestamp({name}{extra})" for name in _PRESENCE)


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def host_label(labels: dict[str, str]) -> str | None:
    """What the host calls itself: dcgm-exporter's ``Hostname`` or gpustation's ``hostname``."""
    return labels.get("Hostname") or labels.get("hostname") or None


#: labels that say which card a series is about; the values query keeps only those
#: that tell series apart (:data:`_VALUE_LABELS`), the identity query the rest
_ID_LABELS = ("UUID", "modelName", "pci_bus_id", "Hostname", "hostname", "DCGM_FI_DRIVER_VERSION")
_VALUE_LABELS = ("__name__", "job", "instance", "gpu", "fan", "GPU_I_ID")


def snapshots_from_series(
    results: Sequence[dict[str, Any]],
    sample_times: dict[str, float] | None = None,
    identity: Sequence[dict[str, Any]] = (),
) -> dict[str, Snapshot]:
    """One Snapshot per ``instance`` from instant-query results; what is not exported is None.

    ``identity`` (series with the labels of :data:`_ID_LABELS`, one per card)
    names the cards when ``results`` carries only :data:`_VALUE_LABELS`.
    Label text is made safe for a terminal where it enters the model; names
    and indices only select (a name not in the tables is ignored).
    """
    sample_times = sample_times or {}
    cards: dict[tuple[str, str], dict[str, Any]] = {}
    for item in identity:
        labels = item.get("metric")
        if isinstance(labels, dict):
            cards[(str(labels.get("instance", "")), str(labels.get("gpu", "")))] = labels
    gpus: dict[str, dict[int, GpuSample]] = {}
    fb_extra: dict[tuple[str, int], float] = {}
    meta: dict[str, dict[str, Any]] = {}
    for item in results:
        labels = item.get("metric")
        value = item.get("value")
        if not isinstance(labels, dict) or not isinstance(value, list) or len(value) != 2:
            continue
        instance = labels.get("instance")
        name = labels.get("__name__", "")
        number = _number(value[1])
        if not isinstance(instance, str) or not instance or number is None:
            continue
        info = meta.get(instance)
        if info is None:
            info = meta[instance] = {"simulated": False, "job": labels.get("job")}
        if name in HOST_SERIES:
            if name == "gpustation_simulated" and number >= 1:
                info["simulated"] = True
            elif name == "gpustation_snapshot_timestamp_seconds":
                info["time"] = number
            gpus.setdefault(instance, {})
            continue
        if labels.get("GPU_I_ID"):  # a MIG instance's series: the card's own are read instead
            continue
        host = gpus.get(instance)
        if host is None:
            host = gpus[instance] = {}
        gpu_label = labels.get("gpu", "")
        try:
            index = int(gpu_label)
        except (TypeError, ValueError):
            continue
        gpu = host.get(index)
        if gpu is None:
            card = {**labels, **cards.get((instance, str(gpu_label)), {})}
            gpu = host[index] = _new_gpu(index, card, info)
        if name in _HELPER_SERIES:
            fb_extra[(instance, index)] = fb_extra.get((instance, index), 0.0) + number
            continue
        setter = GPU_SERIES.get(name)
        if setter is not None:
            setter(gpu, number, labels)
    snaps: dict[str, Snapshot] = {}
    for instance, by_index in gpus.items():
        info = meta.get(instance, {})
        for index, gpu in by_index.items():
            extra = fb_extra.get((instance, index))
            if (
                gpu.memory_total_mib is None
                and extra is not None
                and gpu.memory_used_mib is not None
            ):
                gpu.memory_total_mib = gpu.memory_used_mib + extra
            if None in gpu.fans_pct:
                gpu.fans_pct = [f for f in gpu.fans_pct if f is not None]
        when = info.get("time") or sample_times.get(instance) or time.time()
        shown = _clean(instance)
        snaps[instance] = Snapshot(
            hostname=info.get("hostname") or shown.rsplit(":", 1)[0],
            time=when,
            simulated=bool(info.get("simulated")),
            driver_version=info.get("driver"),
            gpus=[by_index[i] for i in sorted(by_index)],
            note=f"read from Prometheus (job {_clean(str(info.get('job')))}, instance {shown})",
        )
    return {_clean(k): v for k, v in snaps.items()}


def _new_gpu(index: int, labels: dict[str, Any], info: dict[str, Any]) -> GpuSample:
    """A card named from its labels; the host's name and driver are noted on the way."""

    def text(key: str) -> str | None:
        value = labels.get(key)
        return _clean(str(value)) if value else None

    gpu = GpuSample(
        index=index, uuid=text("UUID"), name=text("modelName"), pci_bus_id=text("pci_bus_id")
    )
    if "hostname" not in info:
        hostname = text("Hostname") or text("hostname")
        if hostname:
            info["hostname"] = hostname
    if "driver" not in info and text("DCGM_FI_DRIVER_VERSION"):
        info["driver"] = text("DCGM_FI_DRIVER_VERSION")
    if gpu.name and "(simulated)" in gpu.name:
        info["simulated"] = True
    return gpu


def host_name(instance: str, hostname: str | None) -> str:
    """How a target is listed: its instance, after its hostname when that says more."""
    if not hostname or instance.rsplit(":", 1)[0] in (hostname, f"[{hostname}]"):
        return instance
    return f"{hostname} ({instance})"


def _clock(t: float) -> str:
    fmt = "%H:%M:%S" if time.time() - t < 86400 else "%Y-%m-%d %H:%M:%S"
    return time.strftime(fmt, time.localtime(t))


# ---- the fleet ------------------------------------------------------------------------------


@dataclass
class _Target:
    instance: str
    name: str
    last_sample: float | None = None
    snapshot: Snapshot | None = None
    scrape_interval_s: float | None = None


class PrometheusFleet:
    """The hosts Prometheus scrapes, polled every ``interval`` seconds on one thread.

    ``matchers`` (e.g. ``job="gpu"``) narrows every query to some targets.
    """

    def __init__(
        self,
        client: PrometheusClient,
        interval: float = 1.0,
        matchers: str = "",
        stale_intervals: float = STALE_INTERVALS,
    ) -> None:
        self.client = client
        self.interval = interval
        self.matchers = matchers
        self.stale_intervals = stale_intervals
        self.url = client.url
        self._targets: dict[str, _Target] = {}
        self._states: dict[str, HostState] = {}
        self._error: str | None = None
        self._passes = 0
        self._probed: set[str] = set()
        self._identity: list[dict[str, Any]] = []
        self._static: list[dict[str, Any]] = []
        self._static_for: set[str] = set()
        self._static_due = 0.0
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self.last_pass_s: float | None = None

    # -- the interface of Fleet -----------------------------------------------------------
    @property
    def hosts(self) -> list[str]:
        return list(self._states)

    def start(self) -> PrometheusFleet:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="gpustation-prometheus", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(REQUEST_TIMEOUT_S * 4)
        with self._changed:
            self._states = {
                k: HostState(**{**vars_of(s), "state": STOPPED}) for k, s in self._states.items()
            }
            self._changed.notify_all()

    def __enter__(self) -> PrometheusFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def states(self) -> list[HostState]:
        states = self._states  # one read: the poller swaps in a new dict, never mutates it
        if not states and self._error is not None:
            return [self._unreachable()]
        return list(states.values())

    def state(self, host: str) -> HostState:
        state = self._states.get(host)
        if state is None:
            if self._error is not None:
                return self._unreachable(host)
            return HostState(host, CONNECTING, None, None, None, None, None, 0, self.interval)
        return state

    def rows(self, now: float | None = None) -> list[FleetRow]:
        return rows_from_states(self.states(), now)

    def wait_first(self, timeout: float = 10.0) -> list[HostState]:
        """Wait until the first poll has ended (with hosts or with an error)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._passes == 0 and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
        return self.states()

    @property
    def error(self) -> str | None:
        """Why the last poll failed (None when it worked)."""
        return self._error

    def error_text(self) -> str | None:
        """What to tell the user after a pass: Prometheus failed, or it has no GPU hosts."""
        if self._error is not None:
            return self._error
        if self._passes and not self._states:
            return f"Prometheus at {self.url} has no DCGM_FI_* or gpustation_* series"
        return None

    def history(self, host: str, minutes: float = 10.0) -> History:
        """The host's recent history from Prometheus (blocking: call it off the UI thread)."""
        target = next((t for t in list(self._targets.values()) if t.name == host), None)
        if target is None:
            return History()
        return host_history(self.client, target.instance, minutes, self.matchers, target.snapshot)

    # -- polling --------------------------------------------------------------------------
    def _unreachable(self, name: str | None = None) -> HostState:
        return HostState(
            name or self.url, DOWN, None, self._error, None, None, None, self._passes, self.interval
        )

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.poll_once()
            next_at += self.interval
            delay = next_at - time.monotonic()
            if delay <= 0:  # a pass took longer than the interval: don't pile up
                next_at, delay = time.monotonic(), 0.0
            self._stop.wait(delay)

    def poll_once(self) -> None:
        """One pass: query, rebuild every host's state, publish."""
        began = time.monotonic()
        by = f"max by ({', '.join(_VALUE_LABELS)})"
        try:
            # Only the labels that tell series apart travel with every value, and
            # only the values that change: the cards' names and limits come on a
            # slow cadence. At 256 hosts x 8 GPUs the per-pass answer is what
            # Prometheus spends its time on (bench/RESULTS.md).
            values = self.client.query(f"{by} ({_selector(FAST_SERIES, self.matchers)})")
            seen = {str((v.get("metric") or {}).get("instance")) for v in values}
            if time.monotonic() >= self._static_due or not seen <= self._static_for:
                self._identity = self.client.query(
                    f"group by (job, instance, gpu, {', '.join(_ID_LABELS)}) "
                    f"({_selector((*_PRESENCE[:2], 'gpustation_gpu_lost'), self.matchers)})"
                )
                self._static = self.client.query(
                    f"{by} ({_selector(STATIC_SERIES, self.matchers)})"
                )
                self._static_for = seen
                self._static_due = time.monotonic() + STATIC_REFRESH_S
            # (a host whose series are gone keeps none: its cached limits stay out)
            values += [v for v in self._static if (v.get("metric") or {}).get("instance") in seen]
            newest = self.client.query(f"max by (job, instance) ({_newest_sample(self.matchers)})")
            up = self.client.query(f"up{{{self.matchers}}}" if self.matchers else "up")
            self._discover(up)
            self._update(values, newest, up, self._identity)
        except PrometheusError as err:
            self._publish_error(str(err))
        self.last_pass_s = time.monotonic() - began

    def _discover(self, up: list[dict[str, Any]]) -> None:
        """Targets down before this source saw them: were they GPU hosts, and when last sampled?

        Asked once per target (at most :data:`PROBES_PER_PASS` a pass), over the
        last :data:`DISCOVERY_WINDOW`.
        """
        down = []
        for item in up:
            inst = _clean(str((item.get("metric") or {}).get("instance", "")))
            value = _number((item.get("value") or [None, None])[1])
            known = inst in self._targets or inst in self._probed
            if inst and value is not None and value < 1 and not known:
                down.append(inst)
        down = sorted(set(down))[:PROBES_PER_PASS]
        if not down:
            return
        self._probed.update(down)
        alternatives = "|".join(re.escape(d) for d in down)
        where = f"instance=~{promql_string(alternatives)}" + (
            f",{self.matchers}" if self.matchers else ""
        )
        # GPU series carry the Hostname/hostname label (timestamp() drops only the name);
        # a 1 s step finds a host that lived only a few seconds.
        found = self.client.query(
            "max by (job, instance, Hostname, hostname) (max_over_time(("
            + " or ".join(f"timestamp({n}{{{where}}})" for n in _PRESENCE[:2])
            + f")[{DISCOVERY_WINDOW}:1s]))"
        )
        for item in found:
            labels = item.get("metric") or {}
            instance = safe(str(labels.get("instance", "")))
            when = _number((item.get("value") or [None, None])[1])
            if instance and instance not in self._targets:
                name = host_name(instance, host_label({k: safe(str(v)) for k, v in labels.items()}))
                self._targets[instance] = _Target(instance, name, when)

    def _publish_error(self, error: str) -> None:
        self._error = error
        states = {
            name: HostState(**{**vars_of(st), "state": DOWN, "error": error})
            for name, st in self._states.items()
        }
        self._publish(states)

    def _update(
        self,
        values: list[dict[str, Any]],
        newest: list[dict[str, Any]],
        up: list[dict[str, Any]],
        identity: Sequence[dict[str, Any]] = (),
    ) -> None:
        self._error = None
        now = time.time()
        times: dict[str, float] = {}
        for item in newest:
            inst = _clean(str((item.get("metric") or {}).get("instance", "")))
            t = _number((item.get("value") or [None, None])[1])
            if inst and t is not None:
                times[inst] = max(t, times.get(inst, t))
        ups: dict[str, float] = {}
        for item in up:
            inst = _clean(str((item.get("metric") or {}).get("instance", "")))
            v = _number((item.get("value") or [None, None])[1])
            if inst and v is not None:
                ups[inst] = max(v, ups.get(inst, v))
        snaps = snapshots_from_series(values, times, identity)
        for instance, snap in snaps.items():
            target = self._targets.get(instance)
            if target is None:
                target = self._targets[instance] = _Target(
                    instance, host_name(instance, snap.hostname if snap.hostname else None)
                )
            sampled = times.get(instance)
            if sampled is not None:
                if target.last_sample is not None and sampled > target.last_sample:
                    step = sampled - target.last_sample
                    # the smallest step seen is the scrape interval (missed scrapes only add)
                    if target.scrape_interval_s is None or step < target.scrape_interval_s:
                        target.scrape_interval_s = step
                if target.last_sample is None or sampled > target.last_sample:
                    target.last_sample = sampled
            target.snapshot = snap
        states: dict[str, HostState] = {}
        for target in sorted(self._targets.values(), key=lambda t: t.name):
            states[target.name] = self._state_of(target, target.instance in snaps, ups, now)
        self._publish(states)

    def _state_of(
        self, target: _Target, has_series: bool, ups: dict[str, float], now: float
    ) -> HostState:
        scrape = target.scrape_interval_s or DEFAULT_SCRAPE_INTERVAL_S
        last = target.last_sample
        up = ups.get(target.instance)
        problem: str | None = None
        if up is not None and up < 1:
            problem = "Prometheus cannot scrape it (up=0)"
        elif not has_series:
            problem = "its series are gone from Prometheus"
        elif last is not None and now - last > self.stale_intervals * scrape:
            problem = f"stale: no new sample for {now - last:.0f} s"
        if problem is None:
            return HostState(target.name, UP, target.snapshot, None, last, None, None, 1, scrape)
        if last is not None:
            problem += f"; last sample {_clock(last)} ({max(0.0, now - last):.0f} s ago)"
        else:
            problem += f"; no sample in the last {DISCOVERY_WINDOW}"
        return HostState(target.name, DOWN, target.snapshot, problem, last, None, None, 1, scrape)

    def _publish(self, states: dict[str, HostState]) -> None:
        with self._changed:
            self._states = states
            self._passes += 1
            self._changed.notify_all()


def vars_of(state: HostState) -> dict[str, Any]:
    return {name: getattr(state, name) for name in HostState.__dataclass_fields__}


def prometheus_fleet(url: str, config: FleetConfig, interval: float = 1.0) -> PrometheusFleet:
    """The fleet at ``url`` with the ``[fleet]`` settings of config.toml.

    The configured credentials go only to the configured server (or to any
    URL when config.toml names none), never to a URL typed for a look elsewhere.
    """
    url = check_url(url)
    authorization = None
    if config.prometheus is None or config.prometheus == url:
        authorization = auth_header(
            config.prometheus_user, config.prometheus_password_file, config.prometheus_token_file
        )
    return PrometheusFleet(PrometheusClient(url, authorization), interval, config.prometheus_match)


# ---- history --------------------------------------------------------------------------------

_HISTORY_SERIES = {
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_GPU_UTIL": "utilization_gpu_pct",
    "DCGM_FI_DEV_SM_CLOCK": "clock_sm_mhz",
    "DCGM_FI_DEV_FB_USED": "memory_used_mib",
}


def host_history(
    client: PrometheusClient,
    instance: str,
    minutes: float = 10.0,
    matchers: str = "",
    latest: Snapshot | None = None,
    points: int = 600,
    now: float | None = None,
) -> History:
    """The last ``minutes`` of one target as a History (``/api/v1/query_range``, one query).

    Scales (power limit, VRAM total, SM clock maximum) come from ``latest``,
    the host's current snapshot, as the dashboard's graphs take them.
    """
    end = time.time() if now is None else now
    start = end - minutes * 60
    step = max(1.0, round(minutes * 60 / points))
    where = f"instance={promql_string(instance)}" + (f",{matchers}" if matchers else "")
    result = client.query_range(_selector(tuple(_HISTORY_SERIES), where), start, end, step)
    by_time: dict[float, dict[int, GpuSample]] = {}
    for item in result:
        labels = item.get("metric") or {}
        field = _HISTORY_SERIES.get(str(labels.get("__name__", "")))
        if field is None or labels.get("GPU_I_ID"):
            continue
        try:
            index = int(labels.get("gpu", ""))
        except ValueError:
            continue
        current = latest.gpu(index) if latest is not None else None
        for pair in item.get("values") or ():
            if not isinstance(pair, list) or len(pair) != 2:
                continue
            t, v = _number(pair[0]), _number(pair[1])
            if t is None:
                continue
            gpus = by_time.setdefault(t, {})
            gpu = gpus.get(index)
            if gpu is None:
                gpu = gpus[index] = GpuSample(index=index)
                if current is not None:
                    gpu.power_limit_w = current.power_limit_w
                    gpu.power_max_w = current.power_max_w
                    gpu.memory_total_mib = current.memory_total_mib
                    gpu.clock_sm_max_mhz = current.clock_sm_max_mhz
                    gpu.temperature_slowdown_c = current.temperature_slowdown_c
            setattr(gpu, field, v)
    history = History()
    hostname = latest.hostname if latest is not None else instance
    for t in sorted(by_time):
        gpus = by_time[t]
        history.add(Snapshot(hostname=hostname, time=t, gpus=[gpus[i] for i in sorted(gpus)]))
    return history
