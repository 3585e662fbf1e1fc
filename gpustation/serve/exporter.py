"""The Prometheus endpoint: the latest Snapshot rendered as metrics at scrape time.

Sampling and scraping are decoupled. A sampler thread takes a Snapshot every
``interval_s`` and keeps only the latest one; the :class:`SnapshotCollector`
turns that Snapshot into metric families when Prometheus asks. A scrape never
samples, so a slow or stuck scraper cannot stall sampling, and many scrapers
cost no more GPU reads than one.

Metric names follow dcgm-exporter where DCGM has the field, with its labels
(``gpu``, ``UUID``, ``pci_bus_id``, ``modelName``, ``hostname``) and its units
(W, MHz, MiB, mJ, °C, %), so existing Grafana dashboards work unchanged. What
DCGM lacks carries the ``gpustation_`` prefix. A value the card does not report
is left out, never exported as 0. The profiling series (``DCGM_FI_PROF_*``) are
ratios 0-1, as DCGM gives them, from GPM where the card has it. Every name,
help text and scale comes from ``telemetry/promnames.py``, the table the
fleet reads the same series back with.

dcgm-exporter types the energy and PCIe replay series as counters without a
``_total`` suffix. prometheus_client always appends ``_total`` to counters in
the text format, so those two are exported as gauges under DCGM's exact names:
dashboards select by name, and ``rate()``/``increase()`` work on them alike.
"""

from __future__ import annotations

import contextlib
import ipaddress
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from gpustation.control import journal, lease
from gpustation.control.drift import mark_drift
from gpustation.control.fans import unattended_manual_fans
from gpustation.errors import UsageError
from gpustation.runs.store import index as store
from gpustation.serve.container_series import container_metrics
from gpustation.telemetry.alerts import Alert, AlertLog, idle_rule_or_default
from gpustation.telemetry.model import THROTTLE_REASONS, GpuSample, Snapshot
from gpustation.telemetry.promnames import (
    ALERT,
    FAN_SPEED,
    FAN_UNATTENDED,
    GPU_LABELS,
    GPU_LOST,
    GPU_SERIES,
    GPUS,
    HARDWARE_PROFILE,
    LIMIT_DRIFTED,
    POWER_LIMIT_LEFT,
    RUNS,
    SIMULATED,
    SNAPSHOT_TIME,
    THROTTLE_REASON,
    UP,
    Series,
)

if TYPE_CHECKING:
    from gpustation.notify import AlertNotifier

__all__ = ["GPU_LABELS", "Exporter", "gpu_labels", "is_loopback", "parse_listen"]


def _family(series: Series, value: float | None = None) -> GaugeMetricFamily:
    if value is not None:
        return GaugeMetricFamily(series.name, series.help, value=value)
    return GaugeMetricFamily(series.name, series.help, labels=series.labels)


def gpu_labels(snap: Snapshot, gpu: GpuSample) -> list[str]:
    """Label values in :data:`GPU_LABELS` order (missing values become "")."""
    return [str(gpu.index), gpu.uuid or "", gpu.pci_bus_id or "", gpu.name or "", snap.hostname]


def snapshot_metrics(
    snap: Snapshot,
    profile: str | None = None,
    runs_by_status: dict[str, int] | None = None,
    unattended: dict[int, list[int]] | None = None,
    alerts: list[Alert] | None = None,
    limits_left: dict[int, str] | None = None,
) -> list[Metric]:
    """Render one Snapshot (plus the active profile and run counts) as metric families.

    Pure: no I/O, so it can be called at every scrape and tested exactly.
    """
    families: list[Metric] = []
    live = [g for g in snap.gpus if not g.lost]
    if alerts is not None:
        alert_family = _family(ALERT)
        for alert in alerts:
            labels = [snap.hostname, str(alert.gpu), alert.rule, alert.severity]
            alert_family.add_metric(labels, 1.0)
        families.append(alert_family)
    for series in GPU_SERIES:
        if not series.exported:
            continue
        fam = GaugeMetricFamily(series.name, series.help, labels=GPU_LABELS)
        for gpu in live:
            value = series.read(gpu)
            if value is not None:
                fam.add_metric(gpu_labels(snap, gpu), float(value))
        if fam.samples:
            families.append(fam)

    lost = _family(GPU_LOST)
    for gpu in snap.gpus:
        lost.add_metric(gpu_labels(snap, gpu), 1.0 if gpu.lost else 0.0)
    families.append(lost)

    if unattended is not None:
        alone = _family(FAN_UNATTENDED)
        for gpu in live:
            for fan in range(len(gpu.fan_control)):
                flag = 1.0 if fan in unattended.get(gpu.index, ()) else 0.0
                alone.add_metric((*gpu_labels(snap, gpu), str(fan)), flag)
        if alone.samples:
            families.append(alone)

    drifted = [g for g in live if g.limit_drift]
    if drifted:
        family = _family(LIMIT_DRIFTED)
        for gpu in drifted:
            family.add_metric((*gpu_labels(snap, gpu), gpu.limit_drift or ""), 1.0)
        families.append(family)

    if limits_left:
        left = _family(POWER_LIMIT_LEFT)
        for gpu in live:
            if gpu.index in limits_left:
                left.add_metric((*gpu_labels(snap, gpu), limits_left[gpu.index]), 1.0)
        families.append(left)

    families += container_metrics(live, lambda g: gpu_labels(snap, g))

    fans = _family(FAN_SPEED)
    for gpu in live:
        for i, pct in enumerate(gpu.fans_pct):
            if pct is not None:
                fans.add_metric([*gpu_labels(snap, gpu), str(i)], float(pct))
    if fans.samples:
        families.append(fans)

    throttle = _family(THROTTLE_REASON)
    for gpu in live:
        if gpu.throttle_reasons is None:
            continue
        active = set(gpu.throttle_reasons)
        for _, reason in THROTTLE_REASONS:
            throttle.add_metric([*gpu_labels(snap, gpu), reason], 1.0 if reason in active else 0.0)
    if throttle.samples:
        families.append(throttle)

    families.append(_family(GPUS, float(len(snap.gpus))))
    families.append(_family(SNAPSHOT_TIME, snap.time))
    if snap.simulated:
        families.append(_family(SIMULATED, 1.0))
    if profile:
        fam = _family(HARDWARE_PROFILE)
        fam.add_metric([snap.hostname, profile], 1.0)
        families.append(fam)
    if runs_by_status:
        fam = _family(RUNS)
        for status, count in sorted(runs_by_status.items()):
            fam.add_metric([status], float(count))
        families.append(fam)
    return families


# ---- collector and server ---------------------------------------------------


@dataclass
class _Latest:
    snapshot: Snapshot | None = None
    profile: str | None = None
    runs: dict[str, int] | None = None
    error: str | None = None
    unattended: dict[int, list[int]] | None = None
    alerts: list[Alert] | None = None
    limits_left: dict[int, str] | None = None


class SnapshotCollector(Collector):
    """Renders whatever the sampler stored last; never samples itself."""

    def __init__(self, latest: Callable[[], _Latest]) -> None:
        self._latest = latest

    def collect(self) -> Iterator[Metric]:
        latest = self._latest()
        ok = latest.snapshot is not None and latest.error is None
        yield _family(UP, float(ok))
        if latest.snapshot is not None:
            yield from snapshot_metrics(
                latest.snapshot,
                latest.profile,
                latest.runs,
                latest.unattended,
                latest.alerts,
                latest.limits_left,
            )


class Exporter:
    """A sampler thread plus a collector that reads its latest result.

    ``sample`` is any callable returning a Snapshot (usually
    ``Sampler(backend).sample``). ``extras`` (profile and run counts) are read
    on the sampler thread too, every ``extras_interval_s``. ``alert_notifier``
    is handed the alerts each sample raises (``[notify]``'s GPU events).
    """

    def __init__(
        self,
        sample: Callable[[], Snapshot],
        interval_s: float = 1.0,
        with_extras: bool = True,
        extras_interval_s: float = 10.0,
        alert_notifier: AlertNotifier | None = None,
    ) -> None:
        self._sample = sample
        self._alert_notifier = alert_notifier
        self.interval_s = interval_s
        self._with_extras = with_extras
        self._extras_interval_s = extras_interval_s
        self._latest = _Latest()
        self._alerts = AlertLog(idle=idle_rule_or_default())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(self.latest))
        self.samples_taken = 0
        self._render_lock = threading.Lock()
        self._rendered: dict[tuple[int, object], tuple[_Latest, bytes]] = {}

    def latest(self) -> _Latest:
        # One attribute read: the sampler swaps in a new object, never mutates it.
        return self._latest

    def rendered(self, encoder: Callable[[CollectorRegistry], bytes]) -> bytes:
        """The latest sample in ``encoder``'s format, rendered once per sample.

        Every scrape between two samples would render the same text; many
        scrapers at once would each pay for it under one interpreter lock.
        """
        latest = self._latest
        key = (id(latest), encoder)
        with self._render_lock:
            cached = self._rendered.get(key)
            if cached is None or cached[0] is not latest:
                self._rendered = {k: v for k, v in self._rendered.items() if v[0] is latest}
                cached = (latest, encoder(self.registry))
                self._rendered[key] = cached
            return cached[1]

    def sample_once(self) -> None:
        """Take one sample and publish it (the sampler thread calls this)."""
        previous = self._latest
        try:
            snap = self._sample()
        except Exception as err:  # keep serving the last values, and say so
            self._latest = replace(previous, error=str(err) or repr(err))
            return
        if self._with_extras:
            mark_drift(snap)  # the journal is read again only when it changed
        raised = self._alerts.update(snap)
        if self._alert_notifier is not None and raised:
            self._alert_notifier.take(raised, snap.hostname)  # it only queues, never raises
        self._latest = replace(previous, snapshot=snap, error=None, alerts=self._alerts.active)
        self.samples_taken += 1

    def _refresh_extras(self) -> None:
        profile: str | None = None
        runs: dict[str, int] = {}
        unattended: dict[int, list[int]] | None = None
        left: dict[int, str] | None = None
        with contextlib.suppress(Exception):
            profile = journal.active_profile()
        with contextlib.suppress(Exception):
            runs = store.runs_by_status()
        cur = self._latest
        if cur.snapshot is not None:
            gpus, simulated = cur.snapshot.gpus, cur.snapshot.simulated
            with contextlib.suppress(Exception):
                unattended = unattended_manual_fans(gpus, simulated)
            with contextlib.suppress(Exception):
                left = lease.left_notes([(g.index, g.uuid) for g in gpus], simulated)
        self._latest = replace(
            cur, profile=profile, runs=runs, unattended=unattended, limits_left=left
        )

    def _loop(self) -> None:
        next_at = time.monotonic()
        next_extras = next_at
        while not self._stop.is_set():
            self.sample_once()
            if self._with_extras and time.monotonic() >= next_extras:
                self._refresh_extras()
                next_extras = time.monotonic() + self._extras_interval_s
            self._ready.set()
            next_at += self.interval_s
            delay = next_at - time.monotonic()
            if delay <= 0:  # sampling took longer than the interval: don't pile up
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def start(self) -> None:
        """Start sampling; returns once the first sample is published."""
        self._thread = threading.Thread(target=self._loop, name="gpustation-exporter", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=30)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` -> (host, port); UsageError if malformed."""
    text = text.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise UsageError(f"--listen: expected HOST:PORT (e.g. 127.0.0.1:9400), got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise UsageError(f"--listen: {host!r} is not an IPv6 address") from None
    elif ":" in host:
        raise UsageError(
            f"--listen: put an IPv6 address in brackets, e.g. [::1]:9400, got {text!r}"
        )
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise UsageError(f"--listen: port must be 1-65535, got {port_text!r}")
    if not host:
        host = "0.0.0.0"  # ":9400" means every interface, as in most exporters
    return host, port


def is_loopback(host: str) -> bool:
    """True when ``host`` names only this machine (so nothing else can scrape it)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
