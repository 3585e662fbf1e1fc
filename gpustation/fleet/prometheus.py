"""A fleet read from Prometheus: one host per scrape target, no ssh.

:class:`PrometheusFleet` offers what the fleet screen and ``snapshot`` use of
:class:`~gpustation.fleet.fleet.Fleet` (``start``, ``states``, ``state``,
``rows``, ``wait_first``, ``close``, ``hosts``) and fills the same
:class:`~gpustation.fleet.ssh.HostState` values, so either source renders
the same way. One thread polls Prometheus's HTTP API every ``interval``
seconds with three instant queries (``/api/v1/query``):

1. ``max by (job, instance) (timestamp(DCGM_FI_DEV_GPU_TEMP) or ...)``: each
   target's newest sample time (an instant query stamps every value with the
   evaluation time; ``timestamp()`` of a selector gives the sample's own);
2. ``up``: whether Prometheus could scrape each target;
3. ``max by (__name__, job, instance, gpu, fan, GPU_I_ID)
   ({__name__=~"DCGM_FI_...|gpustation_...", instance=~"..."})``: the latest
   value of every changing series ``telemetry/promnames.py`` declares, from ``gpustation serve``
   or plain dcgm-exporter, with only the labels that tell series apart, for
   the hosts scraped since their last read (every host when most were).

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

Requests (``promapi.py``) have a connect time-out, a total deadline
(``[fleet] prometheus_timeout``), a size cap and a shape check; closing cuts
off the request in flight. Credentials (basic auth or a bearer token) come
from files named in config.toml, never from the command line, and go only to
the configured origin.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpustation import timefmt
from gpustation.fleet.fleet import FleetConfig, FleetRow, rows_from_states
from gpustation.fleet.promapi import (
    TOTAL_TIMEOUT_S,
    PrometheusClient,
    PrometheusError,
    auth_header,
    check_url,
    promql_string,
)
from gpustation.fleet.promseries import (
    FAST_SERIES,
    ID_LABELS,
    PRESENCE,
    STATIC_REFRESH_S,
    STATIC_SERIES,
    VALUE_LABELS,
    clean,
    host_history,
    host_label,
    host_name,
    newest_sample_query,
    selector,
    snapshots_from_series,
    to_number,
)
from gpustation.fleet.ssh import CONNECTING, DOWN, STOPPED, UP, HostState
from gpustation.telemetry.model import Snapshot
from gpustation.telemetry.promnames import GPU_LOST
from gpustation.telemetry.rings import History
from gpustation.textsafe import safe

__all__ = [
    "PrometheusClient",
    "PrometheusError",
    "PrometheusFleet",
    "check_url",
    "host_history",
    "prometheus_fleet",
    "snapshots_from_series",
]

#: how far back the discovery query looks for targets that are already down
DISCOVERY_WINDOW = "10m"
#: assumed scrape interval until two samples of a host have been seen (Prometheus's default)
DEFAULT_SCRAPE_INTERVAL_S = 60.0
STALE_INTERVALS = 3
#: targets already down when first seen, asked about per pass
PROBES_PER_PASS = 64
#: how long closing waits for the poll thread once its request is cut off
CLOSE_WAIT_S = 1.0


def _clock(t: float) -> str:
    return timefmt.recent(t)


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
        self._fetched: dict[str, float] = {}  # instance -> newest sample time when last read
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
        """Stop polling; a request in flight is cut off, so this never waits on the network."""
        self._stop.set()
        self.client.abort()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(CLOSE_WAIT_S)
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
        by = f"max by ({', '.join(VALUE_LABELS)})"
        try:
            newest = self.client.query(
                f"max by (job, instance) ({newest_sample_query(self.matchers)})"
            )
            up = self.client.query(f"up{{{self.matchers}}}" if self.matchers else "up")
            times = _instance_values(newest)
            # Only hosts scraped since their values were read are asked again: with a
            # refresh faster than the scrape interval most hosts have nothing new.
            # Only the labels that tell series apart travel with every value, and
            # only the values that change: the cards' names and limits come on a
            # slow cadence (bench/RESULTS.md has what each step saved).
            changed = [i for i, t in times.items() if t > self._fetched.get(i, float("-inf"))]
            if not self._fetched or 2 * len(changed) > len(times):
                values = self.client.query(f"{by} ({selector(FAST_SERIES, self.matchers)})")
            elif changed:
                which = f"instance=~{promql_string('|'.join(re.escape(i) for i in changed))}"
                matchers = f"{which},{self.matchers}" if self.matchers else which
                values = self.client.query(f"{by} ({selector(FAST_SERIES, matchers)})")
            else:
                values = []
            fetched = {str((v.get("metric") or {}).get("instance")) for v in values}
            for instance in fetched:
                self._fetched[instance] = times.get(instance, float("-inf"))
            seen = set(times)
            if time.monotonic() >= self._static_due or not seen <= self._static_for:
                self._identity = self.client.query(
                    f"group by (job, instance, gpu, {', '.join(ID_LABELS)}) "
                    f"({selector((*PRESENCE[:2], GPU_LOST.name), self.matchers)})"
                )
                self._static = self.client.query(f"{by} ({selector(STATIC_SERIES, self.matchers)})")
                self._static_for = seen
                self._static_due = time.monotonic() + STATIC_REFRESH_S
            # the hosts read now get the cached limits (the others keep their snapshot;
            # a host whose series are gone gets none)
            values += [
                v for v in self._static if (v.get("metric") or {}).get("instance") in fetched
            ]
            self._discover(up)
            self._update(values, newest, up, self._identity, {clean(i) for i in seen - fetched})
        except PrometheusError as err:
            self._publish_error(str(err))
        except Exception as err:  # a bug must not end the poll thread and freeze the table
            self._publish_error(
                f"Prometheus at {self.url}: cannot read the answer "
                f"({type(err).__name__}: {safe(str(err))})"
            )
        self.last_pass_s = time.monotonic() - began

    def _discover(self, up: list[dict[str, Any]]) -> None:
        """Targets down before this source saw them: were they GPU hosts, and when last sampled?

        Asked once per target (at most :data:`PROBES_PER_PASS` a pass), over the
        last :data:`DISCOVERY_WINDOW`.
        """
        down = []
        for item in up:
            inst = clean(str((item.get("metric") or {}).get("instance", "")))
            value = to_number((item.get("value") or [None, None])[1])
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
            + " or ".join(f"timestamp({n}{{{where}}})" for n in PRESENCE[:2])
            + f")[{DISCOVERY_WINDOW}:1s]))"
        )
        for item in found:
            labels = item.get("metric") or {}
            instance = safe(str(labels.get("instance", "")))
            when = to_number((item.get("value") or [None, None])[1])
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
        unchanged: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        """Rebuild every host's state; ``unchanged`` hosts keep the snapshot they have."""
        self._error = None
        now = time.time()
        times = {clean(k): v for k, v in _instance_values(newest).items()}
        ups = {clean(k): v for k, v in _instance_values(up).items()}
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
        live = set(snaps) | {
            i for i in unchanged if i in self._targets and self._targets[i].snapshot is not None
        }
        states: dict[str, HostState] = {}
        for target in sorted(self._targets.values(), key=lambda t: t.name):
            states[target.name] = self._state_of(target, target.instance in live, ups, now)
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


def _instance_values(results: Sequence[dict[str, Any]]) -> dict[str, float]:
    """instance -> the largest value of the results that carry it (raw label text)."""
    out: dict[str, float] = {}
    for item in results:
        inst = (item.get("metric") or {}).get("instance")
        value = to_number((item.get("value") or [None, None])[1])
        if isinstance(inst, str) and inst and value is not None:
            out[inst] = max(value, out.get(inst, value))
    return out


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
    timeout = config.prometheus_timeout or TOTAL_TIMEOUT_S
    client = PrometheusClient(url, authorization, timeout_s=timeout)
    return PrometheusFleet(client, interval, config.prometheus_match)
