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
ratios 0-1, as DCGM gives them, from GPM where the card has it.

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
from gpustation.runs import store
from gpustation.telemetry.alerts import Alert, AlertLog, idle_rule_or_default
from gpustation.telemetry.model import THROTTLE_REASONS, GpuSample, Snapshot, encode_throttle

if TYPE_CHECKING:
    from gpustation.notify import AlertNotifier


GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "modelName", "hostname")


def _ratio(pct: float | None) -> float | None:
    """DCGM's profiling fields are ratios 0-1; the model's are percentages."""
    return None if pct is None else pct / 100.0


def _last_xid(g: GpuSample) -> float | None:
    """The last XID's code, 0 while watched with none, as dcgm-exporter gives it."""
    if g.xid_events is None:
        return None
    return float(g.xid_events[-1].code) if g.xid_events else 0.0


def _nvlink_mb_s(g: GpuSample) -> float | None:
    """Sent and received over every link, in MB/s (what DCGM's field 449 reads)."""
    rates = [r for link in g.nvlink or () if link.active for r in (link.tx_kib_s, link.rx_kib_s)]
    if not rates or any(r is None for r in rates):
        return None
    return sum(r or 0.0 for r in rates) * 1024.0 / 1e6


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


# (metric name, help text, how to read the value from a GpuSample)
_DCGM_GAUGES: tuple[tuple[str, str, Callable[[GpuSample], float | None]], ...] = (
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.temperature_c),
    ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", lambda g: g.memory_temperature_c),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.power_w),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda g: g.clock_sm_mhz),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda g: g.clock_mem_mhz),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: g.memory_used_mib),
    (
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        lambda g: (
            None
            if g.memory_total_mib is None or g.memory_used_mib is None
            else max(0.0, g.memory_total_mib - g.memory_used_mib)
        ),
    ),
    ("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).", lambda g: g.memory_total_mib),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.utilization_gpu_pct),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "Memory utilization (in %).",
        lambda g: g.utilization_memory_pct,
    ),
    ("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", lambda g: g.encoder_utilization_pct),
    ("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", lambda g: g.decoder_utilization_pct),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since boot (in mJ); only ever increases.",
        lambda g: None if g.energy_j is None else g.energy_j * 1000.0,
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "Total number of PCIe retries; only ever increases.",
        lambda g: None if g.pcie.replay_errors is None else float(g.pcie.replay_errors),
    ),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered (0: none since watching began).",
        _last_xid,
    ),
    (
        "DCGM_FI_PROF_SM_ACTIVE",
        "Ratio (0-1) of cycles an SM has at least 1 warp assigned.",
        lambda g: _ratio(g.sm_active_pct),
    ),
    (
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "Ratio (0-1) of warps resident on an SM to the most it can hold.",
        lambda g: _ratio(g.sm_occupancy_pct),
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio (0-1) of cycles any tensor pipe is active.",
        lambda g: _ratio(g.tensor_active_pct),
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio (0-1) of cycles the device memory interface is sending or receiving data.",
        lambda g: _ratio(g.dram_active_pct),
    ),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "NVLink throughput, sent and received, over all links (in MB/s).",
        _nvlink_mb_s,
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "1 while a memory row remap waits for a GPU reset.",
        lambda g: _flag(g.remapped_rows.pending),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "1 when a memory row remap failed.",
        lambda g: _flag(g.remapped_rows.failure),
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors.",
        lambda g: g.remapped_rows.correctable,
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors.",
        lambda g: g.remapped_rows.uncorrectable,
    ),
    (
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "Current clocks event (throttle) reasons as an NVML bitmask.",
        lambda g: (
            None if g.throttle_reasons is None else float(encode_throttle(g.throttle_reasons))
        ),
    ),
)

_OWN_GAUGES: tuple[tuple[str, str, Callable[[GpuSample], float | None]], ...] = (
    ("gpustation_power_limit_watts", "Enforced power limit (W).", lambda g: g.power_limit_w),
    (
        "gpustation_power_default_limit_watts",
        "Default power limit of the card (W).",
        lambda g: g.power_default_w,
    ),
    (
        "gpustation_power_min_limit_watts",
        "Lowest settable power limit (W).",
        lambda g: g.power_min_w,
    ),
    (
        "gpustation_power_max_limit_watts",
        "Highest settable power limit (W).",
        lambda g: g.power_max_w,
    ),
    (
        "gpustation_temperature_slowdown_celsius",
        "Temperature at which the card slows itself down (C).",
        lambda g: g.temperature_slowdown_c,
    ),
    (
        "gpustation_memory_temperature_max_celsius",
        "Highest temperature the card allows its memory (C).",
        lambda g: g.memory_temperature_max_c,
    ),
    (
        "gpustation_temperature_margin_celsius",
        "Degrees below the slowdown limit, as the driver counts them (T.Limit).",
        lambda g: g.temperature_margin_c,
    ),
    ("gpustation_sm_clock_max_mhz", "Highest SM clock (MHz).", lambda g: g.clock_sm_max_mhz),
    ("gpustation_pcie_link_gen", "Current PCIe link generation.", lambda g: g.pcie.gen),
    ("gpustation_pcie_link_width", "Current PCIe link width (lanes).", lambda g: g.pcie.width),
    ("gpustation_pcie_link_gen_max", "Highest PCIe link generation.", lambda g: g.pcie.max_gen),
    ("gpustation_pcie_link_width_max", "Widest PCIe link (lanes).", lambda g: g.pcie.max_width),
    (
        "gpustation_pcie_tx_bytes_per_second",
        "PCIe transmit throughput (bytes/s).",
        lambda g: None if g.pcie.tx_kib_s is None else g.pcie.tx_kib_s * 1024.0,
    ),
    (
        "gpustation_pcie_rx_bytes_per_second",
        "PCIe receive throughput (bytes/s).",
        lambda g: None if g.pcie.rx_kib_s is None else g.pcie.rx_kib_s * 1024.0,
    ),
    ("gpustation_pstate", "Performance state (0 = fastest).", lambda g: g.pstate),
    (
        "gpustation_ecc_uncorrected_errors",
        "Uncorrected ECC errors reported by the card.",
        lambda g: g.ecc_uncorrected,
    ),
    ("gpustation_gpu_processes", "Processes using the GPU.", lambda g: float(len(g.processes))),
    (
        "gpustation_unowned_memory_mib",
        "VRAM used that no listed process holds (MiB).",
        lambda g: g.unowned_memory_mib,
    ),
    (
        "gpustation_device_holders",
        "Processes holding the GPU's device node open without being in NVML's list.",
        lambda g: None if g.device_holders is None else float(len(g.device_holders)),
    ),
    (
        "gpustation_mig_enabled",
        "1 when MIG mode is on.",
        lambda g: None if g.mig is None else _flag(g.mig.enabled),
    ),
    (
        "gpustation_mig_instances",
        "MIG devices on the GPU.",
        lambda g: None if g.mig is None or not g.mig.enabled else float(len(g.mig.instances)),
    ),
)


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
        alert_family = GaugeMetricFamily(
            "gpustation_alert",
            "1 while an alert condition holds (rule in the label: a GPU held but idle, "
            "thermal throttling, a GPU lost ...).",
            labels=("hostname", "gpu", "rule", "severity"),
        )
        for alert in alerts:
            labels = [snap.hostname, str(alert.gpu), alert.rule, alert.severity]
            alert_family.add_metric(labels, 1.0)
        families.append(alert_family)
    for name, doc, read in (*_DCGM_GAUGES, *_OWN_GAUGES):
        fam = GaugeMetricFamily(name, doc, labels=GPU_LABELS)
        for gpu in live:
            value = read(gpu)
            if value is not None:
                fam.add_metric(gpu_labels(snap, gpu), float(value))
        if fam.samples:
            families.append(fam)

    lost = GaugeMetricFamily(
        "gpustation_gpu_lost", "1 when the GPU fell off the bus.", labels=GPU_LABELS
    )
    for gpu in snap.gpus:
        lost.add_metric(gpu_labels(snap, gpu), 1.0 if gpu.lost else 0.0)
    families.append(lost)

    if unattended is not None:
        alone = GaugeMetricFamily(
            "gpustation_fan_manual_unattended",
            "1 for a fan under manual control with no fan controller driving it.",
            labels=(*GPU_LABELS, "fan"),
        )
        for gpu in live:
            for fan in range(len(gpu.fan_control)):
                flag = 1.0 if fan in unattended.get(gpu.index, ()) else 0.0
                alone.add_metric((*gpu_labels(snap, gpu), str(fan)), flag)
        if alone.samples:
            families.append(alone)

    drifted = [g for g in live if g.limit_drift]
    if drifted:
        family = GaugeMetricFamily(
            "gpustation_limit_drifted",
            "1 while the power limit or fans differ from what the control journal says was "
            "applied last, with no entry to explain it (the note says what, and how to apply "
            "it again).",
            labels=(*GPU_LABELS, "note"),
        )
        for gpu in drifted:
            family.add_metric((*gpu_labels(snap, gpu), gpu.limit_drift or ""), 1.0)
        families.append(family)

    if limits_left:
        left = GaugeMetricFamily(
            "gpustation_power_limit_left",
            "1 while the power limit is one a killed program left changed (the note "
            "says which, and the command that puts it back).",
            labels=(*GPU_LABELS, "note"),
        )
        for gpu in live:
            if gpu.index in limits_left:
                left.add_metric((*gpu_labels(snap, gpu), limits_left[gpu.index]), 1.0)
        families.append(left)

    fans = GaugeMetricFamily(
        "gpustation_fan_speed_percent",
        "Fan speed as a percentage of its maximum.",
        labels=(*GPU_LABELS, "fan"),
    )
    for gpu in live:
        for i, pct in enumerate(gpu.fans_pct):
            if pct is not None:
                fans.add_metric([*gpu_labels(snap, gpu), str(i)], float(pct))
    if fans.samples:
        families.append(fans)

    throttle = GaugeMetricFamily(
        "gpustation_throttle_reason",
        "1 while the clocks event (throttle) reason is active, else 0.",
        labels=(*GPU_LABELS, "reason"),
    )
    for gpu in live:
        if gpu.throttle_reasons is None:
            continue
        active = set(gpu.throttle_reasons)
        for _, reason in THROTTLE_REASONS:
            throttle.add_metric([*gpu_labels(snap, gpu), reason], 1.0 if reason in active else 0.0)
    if throttle.samples:
        families.append(throttle)

    families.append(
        GaugeMetricFamily(
            "gpustation_gpus", "GPUs this exporter reads.", value=float(len(snap.gpus))
        )
    )
    families.append(
        GaugeMetricFamily(
            "gpustation_snapshot_timestamp_seconds",
            "When the exported values were sampled (Unix time).",
            value=snap.time,
        )
    )
    if snap.simulated:
        families.append(
            GaugeMetricFamily(
                "gpustation_simulated", "1: these GPUs are simulated, not real.", value=1.0
            )
        )
    if profile:
        fam = GaugeMetricFamily(
            "gpustation_hardware_profile",
            "The hardware profile last applied (value 1, name in the label).",
            labels=("hostname", "profile"),
        )
        fam.add_metric([snap.hostname, profile], 1.0)
        families.append(fam)
    if runs_by_status:
        fam = GaugeMetricFamily(
            "gpustation_runs", "Runs in the run history by status.", labels=("status",)
        )
        for status, count in sorted(runs_by_status.items()):
            fam.add_metric([status], float(count))
        families.append(fam)
    return families


# ---- what the other layers record -------------------------------------------


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
        yield GaugeMetricFamily(
            "gpustation_up", "1 when the last sampling attempt succeeded.", value=float(ok)
        )
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
