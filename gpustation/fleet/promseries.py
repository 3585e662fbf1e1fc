"""Prometheus series -> the model: dcgm-exporter's and gpustation's names filling GpuSamples.

:func:`snapshots_from_series` turns instant-query results into one
:class:`~gpustation.telemetry.model.Snapshot` per scrape target;
:func:`host_history` turns one target's ``query_range`` answer into a
:class:`~gpustation.telemetry.rings.History` for the host screen's graphs.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpustation.fleet.promapi import PrometheusClient, promql_string
from gpustation.telemetry import promnames
from gpustation.telemetry.model import GpuSample, Snapshot
from gpustation.telemetry.rings import History
from gpustation.textsafe import safe

#: label text repeats across every series of a host: clean each distinct string once
clean = functools.lru_cache(maxsize=1 << 16)(safe)


# ---- series -> model ------------------------------------------------------------------------


def to_number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _fan(g: GpuSample, v: float, labels: dict[str, str]) -> None:
    fan = _label_index(labels, "fan")
    if fan is not None:
        while len(g.fans_pct) <= fan:
            g.fans_pct.append(None)  # type: ignore[arg-type]  # a fan not exported
        g.fans_pct[fan] = v


def _label_index(labels: dict[str, str], key: str) -> int | None:
    try:
        index = int(labels.get(key, ""))
    except ValueError:
        return None
    return index if 0 <= index < 64 else None


def _lost(g: GpuSample, v: float, _labels: dict[str, str]) -> None:
    g.lost = v >= 1


def _field(write: Callable[[GpuSample, float], None]) -> Callable[[GpuSample, float, Any], None]:
    return lambda g, v, _labels: write(g, v)


#: GPU series -> how each fills a GpuSample: every series of the table that says how,
#: then those with labels of their own (per fan).
GPU_SERIES: dict[str, Callable[[GpuSample, float, dict[str, str]], None]] = {
    **{s.name: _field(s.write) for s in promnames.GPU_SERIES if s.write is not None},
    promnames.GPU_LOST.name: _lost,
    promnames.FAN_SPEED.name: _fan,
}
#: series only to complete others (VRAM total = used + free + reserved where no total is exported)
_HELPER_SERIES = ("DCGM_FI_DEV_FB_FREE", promnames.FB_RESERVED.name)
#: per-target series without a ``gpu`` label
HOST_SERIES = tuple(s.name for s in promnames.HOST_SERIES)
ALL_SERIES = (*GPU_SERIES, *_HELPER_SERIES, *HOST_SERIES)
#: series that change only when a card is reconfigured: read with the cards' names
#: every :data:`STATIC_REFRESH_S` (or when a host appears), not every pass
STATIC_SERIES = tuple(s.name for s in promnames.GPU_SERIES if s.static and s.write is not None)
FAST_SERIES = tuple(n for n in ALL_SERIES if n not in STATIC_SERIES)
STATIC_REFRESH_S = 30.0
#: what marks a target as a GPU host in the discovery query
PRESENCE = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", promnames.GPUS.name)


def selector(names: Sequence[str], matchers: str = "") -> str:
    alternatives = "|".join(names)
    extra = f",{matchers}" if matchers else ""
    return f'{{__name__=~"{alternatives}"{extra}}}'


def newest_sample_query(matchers: str = "") -> str:
    """Per GPU and per target, the time of the newest sample of the presence series.

    ``timestamp()`` drops the metric name, so series that differ only by name
    would collide; ``or`` keeps one of each label set instead.
    """
    extra = f"{{{matchers}}}" if matchers else ""
    return " or ".join(f"timestamp({name}{extra})" for name in PRESENCE)


def host_label(labels: dict[str, str]) -> str | None:
    """What the host calls itself: dcgm-exporter's ``Hostname`` or gpustation's ``hostname``."""
    return labels.get("Hostname") or labels.get("hostname") or None


#: labels that say which card a series is about; the values query keeps only those
#: that tell series apart (:data:`VALUE_LABELS`), the identity query the rest
ID_LABELS = ("UUID", "modelName", "pci_bus_id", "Hostname", "hostname", "DCGM_FI_DRIVER_VERSION")
VALUE_LABELS = ("__name__", "job", "instance", "gpu", "fan", "GPU_I_ID")


def snapshots_from_series(
    results: Sequence[dict[str, Any]],
    sample_times: dict[str, float] | None = None,
    identity: Sequence[dict[str, Any]] = (),
) -> dict[str, Snapshot]:
    """One Snapshot per ``instance`` from instant-query results; what is not exported is None.

    ``identity`` (series with the labels of :data:`ID_LABELS`, one per card)
    names the cards when ``results`` carries only :data:`VALUE_LABELS`.
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
        # NaN is a value not read: the host and its card are listed, the field is n/a
        number = to_number(value[1])
        if not isinstance(instance, str) or not instance:
            continue
        info = meta.get(instance)
        if info is None:
            info = meta[instance] = {"simulated": False, "job": labels.get("job")}
        if name in HOST_SERIES:
            if name == promnames.SIMULATED.name and number is not None and number >= 1:
                info["simulated"] = True
            elif name == promnames.SNAPSHOT_TIME.name and number is not None:
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
        if number is None:
            continue
        if name in _HELPER_SERIES:
            fb_extra[(instance, index)] = fb_extra.get((instance, index), 0.0) + number
            continue
        setter = GPU_SERIES.get(name)
        if setter is not None:
            setter(gpu, number, labels)
    snaps: dict[str, Snapshot] = {}
    for instance, by_index in gpus.items():
        info = meta.get(instance, {})
        when = info.get("time") or sample_times.get(instance) or time.time()
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
            for event in gpu.xid_events or ():
                event.time = when  # the code is kept, not when it came: seen by this sample
        shown = clean(instance)
        snaps[instance] = Snapshot(
            hostname=info.get("hostname") or shown.rsplit(":", 1)[0],
            time=when,
            simulated=bool(info.get("simulated")),
            driver_version=info.get("driver"),
            gpus=[by_index[i] for i in sorted(by_index)],
            note=f"read from Prometheus (job {clean(str(info.get('job')))}, instance {shown})",
        )
    return {clean(k): v for k, v in snaps.items()}


def _new_gpu(index: int, labels: dict[str, Any], info: dict[str, Any]) -> GpuSample:
    """A card named from its labels; the host's name and driver are noted on the way."""

    def text(key: str) -> str | None:
        value = labels.get(key)
        return clean(str(value)) if value else None

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


# ---- history --------------------------------------------------------------------------------

#: the fields the host screen graphs, each read from the series that carries it alone
_HISTORY_FIELDS = (
    "temperature_c",
    "power_w",
    "utilization_gpu_pct",
    "clock_sm_mhz",
    "memory_used_mib",
)
_HISTORY_SERIES = {
    s.name: s
    for s in promnames.GPU_SERIES
    if s.exported and s.write is not None and len(s.fields) == 1 and s.fields[0] in _HISTORY_FIELDS
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
    result = client.query_range(selector(tuple(_HISTORY_SERIES), where), start, end, step)
    by_time: dict[float, dict[int, GpuSample]] = {}
    for item in result:
        labels = item.get("metric") or {}
        series = _HISTORY_SERIES.get(str(labels.get("__name__", "")))
        if series is None or series.write is None or labels.get("GPU_I_ID"):
            continue
        try:
            index = int(labels.get("gpu", ""))
        except ValueError:
            continue
        current = latest.gpu(index) if latest is not None else None
        for pair in item.get("values") or ():
            if not isinstance(pair, list) or len(pair) != 2:
                continue
            t, v = to_number(pair[0]), to_number(pair[1])
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
            if v is not None:
                series.write(gpu, v)
    history = History()
    hostname = latest.hostname if latest is not None else instance
    for t in sorted(by_time):
        gpus = by_time[t]
        history.add(Snapshot(hostname=hostname, time=t, gpus=[gpus[i] for i in sorted(gpus)]))
    return history
