"""The Prometheus series, declared once: the exporter writes them, the fleet reads them back.

:data:`GPU_SERIES` gives each per-GPU series (labels :data:`GPU_LABELS`) with
the model field it carries. Most are one field: :func:`field_series` names it
by its path under ``GpuSample`` (``"pcie.tx_kib_s"``) with the scale from the
model's unit to the series' (dcgm-exporter's units: W, MHz, MiB, mJ, °C, %;
ratios 0-1 for profiling; bytes/s for gpustation's throughput), and derives
both directions from it: the value written (the field times the scale, a
flag as 0/1) and the value read back (divided by the scale, as the field's
type). A series is static, read by the fleet with the cards' names rather than
on every pass, when its field's cost class is. The few series computed from
several fields or a list (free VRAM, the last XID, the throttle bitmask, NVLink
over every link, counts) give both directions side by side, or say why they
are not read back. Series that dcgm-exporter writes and gpustation does not
(``exported=False``) are only read.

:data:`SERIES` declares the rest: series with labels of their own (per fan,
per throttle reason), per host, per run, per alert, with their
help text and labels, and, where the fleet does not read one back, why.
"""

from __future__ import annotations

from collections.abc import Callable

from gpustation.telemetry.model import (
    IDENTITY,
    RECORDS,
    STATIC,
    GpuSample,
    MigInfo,
    XidEvent,
    decode_throttle,
    encode_throttle,
    specs,
    xid_meaning,
)
from gpustation.telemetry.slotted import record

#: dcgm-exporter's labels of a GPU's series (gpustation writes ``hostname`` in lower case).
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "modelName", "hostname")

Read = Callable[[GpuSample], float | None]
Write = Callable[[GpuSample, float], None]


@record(frozen=True)
class GpuSeries:
    """One series per GPU: how it is read from a GpuSample and written back into one.

    ``fields`` are the model paths it carries; ``write`` is None where the
    series cannot fill the model (``unread`` says why).
    """

    name: str
    help: str
    read: Read
    write: Write | None
    fields: tuple[str, ...]
    static: bool = False
    exported: bool = True
    unread: str = ""


def _parts(path: str) -> tuple[type, str, str | None]:
    """(record class, field name, GpuSample attribute holding the record or None)."""
    head, _, tail = path.partition(".")
    if tail:
        return RECORDS[head], tail, head
    return GpuSample, head, None


def _kind(cls: type, name: str) -> str:
    # The model's annotations are text ("int | None"): the first type names the kind.
    annotation = str(cls.__annotations__[name])
    return annotation.split("|")[0].strip()


def field_series(
    name: str, path: str, help: str = "", scale: float = 1.0, exported: bool = True
) -> GpuSeries:
    """A series carrying one model field, ``scale`` times its value."""
    cls, attr, holder = _parts(path)
    if attr not in specs(cls):
        raise ValueError(f"{path}: not a declared field of {cls.__name__}")
    kind = _kind(cls, attr)
    static = specs(cls)[attr].cost in (STATIC, IDENTITY)

    def owner(g: GpuSample) -> object:
        return g if holder is None else getattr(g, holder)

    def read(g: GpuSample) -> float | None:
        value = getattr(owner(g), attr)
        return None if value is None else float(value) * scale

    def write(g: GpuSample, v: float) -> None:
        value: object
        if kind == "bool":
            value = v >= 0.5
        elif kind == "int":
            value = round(v / scale)
        else:
            value = v / scale
        setattr(owner(g), attr, value)

    return GpuSeries(name, help, read, write, (path,), static, exported)


# ---- series computed from more than one field ------------------------------------------------


def _fb_free(g: GpuSample) -> float | None:
    if g.memory_total_mib is None or g.memory_used_mib is None:
        return None
    return max(0.0, g.memory_total_mib - g.memory_used_mib)


def _last_xid(g: GpuSample) -> float | None:
    """The last XID's code, 0 while watched with none, as dcgm-exporter gives it."""
    if g.xid_events is None:
        return None
    return float(g.xid_events[-1].code) if g.xid_events else 0.0


def _set_xid(g: GpuSample, v: float) -> None:
    # Prometheus keeps the last code, not when it came: the reader dates it.
    code = int(v)
    g.xid_events = [XidEvent(time=0.0, code=code, meaning=xid_meaning(code))] if code else []


def _nvlink_mb_s(g: GpuSample) -> float | None:
    """Sent and received over every link, in MB/s (what DCGM's field 449 reads)."""
    if g.nvlink is None:
        return g.nvlink_sum_mb_s
    rates = [r for link in g.nvlink if link.active for r in (link.tx_kib_s, link.rx_kib_s)]
    if not rates or any(r is None for r in rates):
        return None
    return sum(r or 0.0 for r in rates) * 1024.0 / 1e6


def _set_nvlink_sum(g: GpuSample, v: float) -> None:
    # Prometheus has the sum, not the links: the model says so (nvlink stays None).
    g.nvlink_sum_mb_s = v


def _throttle_mask(g: GpuSample) -> float | None:
    return None if g.throttle_reasons is None else float(encode_throttle(g.throttle_reasons))


def _set_throttle(g: GpuSample, v: float) -> None:
    g.throttle_reasons = decode_throttle(int(v))


def _mig_enabled(g: GpuSample) -> float | None:
    return None if g.mig is None or g.mig.enabled is None else float(g.mig.enabled)


def _set_mig_enabled(g: GpuSample, v: float) -> None:
    g.mig = MigInfo(enabled=v >= 0.5)


#: why a series of a count, or of a sum per container, is not read back
UNREAD_AGGREGATE = "an aggregate (a count, a sum per container) of records the fleet does not hold"

_F = field_series

#: Every per-GPU series, dcgm-exporter's names first, in the exporter's order.
GPU_SERIES: tuple[GpuSeries, ...] = (
    _F("DCGM_FI_DEV_GPU_TEMP", "temperature_c", "GPU temperature (in C)."),
    _F("DCGM_FI_DEV_MEMORY_TEMP", "memory_temperature_c", "Memory temperature (in C)."),
    _F("DCGM_FI_DEV_POWER_USAGE", "power_w", "Power draw (in W)."),
    _F("DCGM_FI_DEV_SM_CLOCK", "clock_sm_mhz", "SM clock frequency (in MHz)."),
    _F("DCGM_FI_DEV_MEM_CLOCK", "clock_mem_mhz", "Memory clock frequency (in MHz)."),
    _F("DCGM_FI_DEV_FB_USED", "memory_used_mib", "Framebuffer memory used (in MiB)."),
    GpuSeries(
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        _fb_free,
        None,
        ("memory_total_mib", "memory_used_mib"),
        unread="completes the VRAM total where none is exported (with FB_RESERVED)",
    ),
    _F("DCGM_FI_DEV_FB_TOTAL", "memory_total_mib", "Framebuffer memory total (in MiB)."),
    _F("DCGM_FI_DEV_GPU_UTIL", "utilization_gpu_pct", "GPU utilization (in %)."),
    _F("DCGM_FI_DEV_MEM_COPY_UTIL", "utilization_memory_pct", "Memory utilization (in %)."),
    _F("DCGM_FI_DEV_ENC_UTIL", "encoder_utilization_pct", "Encoder utilization (in %)."),
    _F("DCGM_FI_DEV_DEC_UTIL", "decoder_utilization_pct", "Decoder utilization (in %)."),
    _F(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "energy_j",
        "Total energy consumption since boot (in mJ); only ever increases.",
        scale=1000.0,
    ),
    _F(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "pcie.replay_errors",
        "Total number of PCIe retries; only ever increases.",
    ),
    GpuSeries(
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered (0: none since watching began).",
        _last_xid,
        _set_xid,
        ("xid_events",),
    ),
    _F(
        "DCGM_FI_PROF_SM_ACTIVE",
        "sm_active_pct",
        "Ratio (0-1) of cycles an SM has at least 1 warp assigned.",
        scale=0.01,
    ),
    _F(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "sm_occupancy_pct",
        "Ratio (0-1) of warps resident on an SM to the most it can hold.",
        scale=0.01,
    ),
    _F(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "tensor_active_pct",
        "Ratio (0-1) of cycles any tensor pipe is active.",
        scale=0.01,
    ),
    _F(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "dram_active_pct",
        "Ratio (0-1) of cycles the device memory interface is sending or receiving data.",
        scale=0.01,
    ),
    GpuSeries(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "NVLink throughput, sent and received, over all links (in MB/s).",
        _nvlink_mb_s,
        _set_nvlink_sum,
        ("nvlink", "nvlink_sum_mb_s"),
    ),
    _F(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "remapped_rows.pending",
        "1 while a memory row remap waits for a GPU reset.",
    ),
    _F(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "remapped_rows.failure",
        "1 when a memory row remap failed.",
    ),
    _F(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "remapped_rows.correctable",
        "Number of remapped rows for correctable errors.",
    ),
    _F(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "remapped_rows.uncorrectable",
        "Number of remapped rows for uncorrectable errors.",
    ),
    GpuSeries(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "Current clocks event (throttle) reasons as an NVML bitmask.",
        _throttle_mask,
        _set_throttle,
        ("throttle_reasons",),
    ),
    # dcgm-exporter's, read where a host runs it; gpustation writes these fields under
    # its own names below, or not at all.
    _F("DCGM_FI_DEV_SLOWDOWN_TEMP", "temperature_slowdown_c", exported=False),
    _F("DCGM_FI_DEV_SHUTDOWN_TEMP", "temperature_shutdown_c", exported=False),
    _F("DCGM_FI_DEV_POWER_MGMT_LIMIT", "power_limit_w", exported=False),
    GpuSeries(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "",
        _throttle_mask,
        _set_throttle,
        ("throttle_reasons",),
        exported=False,
    ),
    _F("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_uncorrected", exported=False),
    _F("DCGM_FI_PROF_PCIE_TX_BYTES", "pcie.tx_kib_s", scale=1024.0, exported=False),
    _F("DCGM_FI_PROF_PCIE_RX_BYTES", "pcie.rx_kib_s", scale=1024.0, exported=False),
    # gpustation's own, for what DCGM lacks.
    _F("gpustation_power_limit_watts", "power_limit_w", "Enforced power limit (W)."),
    _F(
        "gpustation_power_default_limit_watts",
        "power_default_w",
        "Default power limit of the card (W).",
    ),
    _F("gpustation_power_min_limit_watts", "power_min_w", "Lowest settable power limit (W)."),
    _F("gpustation_power_max_limit_watts", "power_max_w", "Highest settable power limit (W)."),
    _F(
        "gpustation_temperature_slowdown_celsius",
        "temperature_slowdown_c",
        "Temperature at which the card slows itself down (C).",
    ),
    _F(
        "gpustation_memory_temperature_max_celsius",
        "memory_temperature_max_c",
        "Highest temperature the card allows its memory (C).",
    ),
    _F(
        "gpustation_temperature_margin_celsius",
        "temperature_margin_c",
        "Degrees below the slowdown limit, as the driver counts them (T.Limit).",
    ),
    _F("gpustation_sm_clock_max_mhz", "clock_sm_max_mhz", "Highest SM clock (MHz)."),
    _F("gpustation_pcie_link_gen", "pcie.gen", "Current PCIe link generation."),
    _F("gpustation_pcie_link_width", "pcie.width", "Current PCIe link width (lanes)."),
    _F("gpustation_pcie_link_gen_max", "pcie.max_gen", "Highest PCIe link generation."),
    _F("gpustation_pcie_link_width_max", "pcie.max_width", "Widest PCIe link (lanes)."),
    _F(
        "gpustation_pcie_tx_bytes_per_second",
        "pcie.tx_kib_s",
        "PCIe transmit throughput (bytes/s).",
        scale=1024.0,
    ),
    _F(
        "gpustation_pcie_rx_bytes_per_second",
        "pcie.rx_kib_s",
        "PCIe receive throughput (bytes/s).",
        scale=1024.0,
    ),
    _F("gpustation_pstate", "pstate", "Performance state (0 = fastest)."),
    _F(
        "gpustation_ecc_uncorrected_errors",
        "ecc_uncorrected",
        "Uncorrected ECC errors reported by the card.",
    ),
    GpuSeries(
        "gpustation_gpu_processes",
        "Processes using the GPU.",
        lambda g: float(len(g.processes)),
        None,
        ("processes",),
        unread=UNREAD_AGGREGATE,
    ),
    _F(
        "gpustation_unowned_memory_mib",
        "unowned_memory_mib",
        "VRAM used that no listed process holds (MiB).",
    ),
    GpuSeries(
        "gpustation_device_holders",
        "Processes holding the GPU's device node open without being in NVML's list.",
        lambda g: None if g.device_holders is None else float(len(g.device_holders)),
        None,
        ("device_holders",),
        unread=UNREAD_AGGREGATE,
    ),
    GpuSeries(
        "gpustation_mig_enabled", "1 when MIG mode is on.", _mig_enabled, _set_mig_enabled, ("mig",)
    ),
    GpuSeries(
        "gpustation_mig_instances",
        "MIG devices on the GPU.",
        lambda g: None if g.mig is None or not g.mig.enabled else float(len(g.mig.instances)),
        None,
        ("mig",),
        unread=UNREAD_AGGREGATE,
    ),
)


@record(frozen=True)
class Series:
    """A series that is not one value per GPU field: its name, help text and labels."""

    name: str
    help: str
    labels: tuple[str, ...] = ()
    #: why the fleet does not read it back; "" when it does
    unread: str = ""
    #: False for a series dcgm-exporter writes and gpustation only reads
    exported: bool = True


_NOT_MODEL = "not part of a GPU's telemetry"

GPU_LOST = Series("gpustation_gpu_lost", "1 when the GPU fell off the bus.", GPU_LABELS)
FAN_SPEED = Series(
    "gpustation_fan_speed_percent",
    "Fan speed as a percentage of its maximum.",
    (*GPU_LABELS, "fan"),
)
THROTTLE_REASON = Series(
    "gpustation_throttle_reason",
    "1 while the clocks event (throttle) reason is active, else 0.",
    (*GPU_LABELS, "reason"),
    unread="the bitmask DCGM_FI_DEV_CLOCKS_EVENT_REASONS carries the same",
)
FAN_UNATTENDED = Series(
    "gpustation_fan_manual_unattended",
    "1 for a fan under manual control with no fan controller driving it.",
    (*GPU_LABELS, "fan"),
    unread="the control state of the exporter's host",
)
POWER_LIMIT_LEFT = Series(
    "gpustation_power_limit_left",
    "1 while the power limit is one a killed program left changed (the note "
    "says which, and the command that puts it back).",
    (*GPU_LABELS, "note"),
    unread="the control state of the exporter's host",
)
ALERT = Series(
    "gpustation_alert",
    "1 while an alert condition holds (rule in the label: a GPU held but idle, "
    "thermal throttling, a GPU lost ...).",
    ("hostname", "gpu", "rule", "severity"),
    unread="the exporter's own alerts: the fleet's are raised from the values",
)
FB_RESERVED = Series(
    "DCGM_FI_DEV_FB_RESERVED",
    "Framebuffer memory the driver reserves (in MiB); written by dcgm-exporter.",
    GPU_LABELS,
    exported=False,
)
GPUS = Series("gpustation_gpus", "GPUs this exporter reads.")
SNAPSHOT_TIME = Series(
    "gpustation_snapshot_timestamp_seconds", "When the exported values were sampled (Unix time)."
)
SIMULATED = Series("gpustation_simulated", "1: these GPUs are simulated, not real.")
HARDWARE_PROFILE = Series(
    "gpustation_hardware_profile",
    "The hardware profile last applied (value 1, name in the label).",
    ("hostname", "profile"),
    unread=_NOT_MODEL,
)
LIMIT_DRIFTED = Series(
    "gpustation_limit_drifted",
    "1 while a card's power limit (or fans) differ from what was applied last, with no "
    "journal entry to explain it (the note says what, and the command that applies it again).",
    (*GPU_LABELS, "note"),
    unread="the control state of the exporter's host",
)
RUNS = Series("gpustation_runs", "Runs in the run history by status.", ("status",), _NOT_MODEL)
UP = Series("gpustation_up", "1 when the last sampling attempt succeeded.", (), _NOT_MODEL)
# A GPU's processes summed per container, systemd unit or Slurm job: never per PID (a
# PID label would make a new series for every process ever started).
CONTAINER_POWER = Series(
    "gpustation_container_power_watts",
    "Estimated power of a container's processes on the GPU, from their SM shares (W).",
    (*GPU_LABELS, "container"),
    UNREAD_AGGREGATE,
)
CONTAINER_MEMORY = Series(
    "gpustation_container_memory_used_mib",
    "VRAM held by a container's processes on the GPU (MiB).",
    (*GPU_LABELS, "container"),
    UNREAD_AGGREGATE,
)
CONTAINER_PROCESSES = Series(
    "gpustation_container_processes",
    "A container's processes on the GPU.",
    (*GPU_LABELS, "container"),
    UNREAD_AGGREGATE,
)

#: every series that is not in :data:`GPU_SERIES`
SERIES: tuple[Series, ...] = (
    GPU_LOST,
    FAN_SPEED,
    THROTTLE_REASON,
    FAN_UNATTENDED,
    POWER_LIMIT_LEFT,
    LIMIT_DRIFTED,
    ALERT,
    FB_RESERVED,
    GPUS,
    SNAPSHOT_TIME,
    SIMULATED,
    HARDWARE_PROFILE,
    RUNS,
    UP,
    CONTAINER_POWER,
    CONTAINER_MEMORY,
    CONTAINER_PROCESSES,
)
#: per-target series without a ``gpu`` label that the fleet reads
HOST_SERIES = (SIMULATED, SNAPSHOT_TIME, GPUS)
