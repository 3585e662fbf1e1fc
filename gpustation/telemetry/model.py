"""The one telemetry model every backend fills and every renderer reads.

Units are in the names. A value the hardware does not report is ``None``
(``null`` in JSON), never a made-up number. ``Snapshot.to_dict`` gives the
``gpustation.snapshot/1`` document; ``Snapshot.from_dict`` reads it back.

Each GPU field is declared once, below, with :func:`gpu_field`: its cost
class and its short label and unit for renderers. The JSON document, the
backends' static caches and slow cadence, and the snapshot table's headers
derive from those declarations. How a backend reads a field is that backend's
business: each keeps a read table keyed by :func:`field_keys`
(``telemetry/nvml/reads.py``, ``telemetry/sim_reads.py``), saying ``None``
for the fields its dedicated code fills (NVML's deep readers: events, GPM,
NVLink, MIG, per-process SM; the sampler's host fields).
"""

from __future__ import annotations

from typing import Any

from gpustation.telemetry.slotted import field, fields, record

SCHEMA = "gpustation.snapshot/1"

# Decoded clocks-event (throttle) reasons, in NVML bit order.
#: clocks-event ("throttle") reasons: NVML's bit, the name gpustation records, the words shown
THROTTLE_TABLE: tuple[tuple[int, str, str], ...] = (
    (0x001, "gpu_idle", "idle"),
    (0x002, "applications_clocks_setting", "app clocks"),
    (0x004, "sw_power_cap", "power cap"),
    (0x008, "hw_slowdown", "HW slowdown"),
    (0x010, "sync_boost", "sync boost"),
    (0x020, "sw_thermal", "thermal (SW)"),
    (0x040, "hw_thermal", "thermal (HW)"),
    (0x080, "hw_power_brake", "power brake"),
    (0x100, "display_clocks", "display clocks"),
)
THROTTLE_REASONS: tuple[tuple[int, str], ...] = tuple((b, n) for b, n, _ in THROTTLE_TABLE)
THROTTLE_WORDS: dict[str, str] = {n: w for _, n, w in THROTTLE_TABLE}
THERMAL_REASONS = frozenset({"sw_thermal", "hw_thermal"})
POWER_REASONS = frozenset({"sw_power_cap", "hw_power_brake"})
# Reasons that mean the card is being held back (gpu_idle and friends are benign).
LIMITING_REASONS = THERMAL_REASONS | POWER_REASONS | {"hw_slowdown"}


def decode_throttle(mask: int) -> list[str]:
    """Turn a clocks-event bitmask into the names above."""
    return [name for bit, name in THROTTLE_REASONS if mask & bit]


def encode_throttle(names: list[str]) -> int:
    bits = dict((n, b) for b, n in THROTTLE_REASONS)
    return sum(bits[n] for n in names if n in bits)


# ---- cost classes: when a field is read ------------------------------------------

#: Read when the GPU opens; names the GPU (and keys the static cache).
IDENTITY = "identity"
#: Fixed while the machine is up with the same driver: read once, cacheable.
STATIC = "static"
#: Read on every refresh.
FAST = "fast"
#: Read on a cadence of its own (slow driver calls, counters); reused between.
SLOW = "slow"
#: Profiling metrics (GPM) from two samples, read only while a reader asks
#: for them (``Backend.read_gpm``); ``None`` otherwise and where unsupported.
GPM = "gpm"
#: Gathered as they happen by a watcher of the backend's own (XID events);
#: a read only copies what was gathered.
EVENTS = "events"
#: Read from the host (``/proc``), not from the driver, by the sampler.
HOST = "host"
#: Filled by the control layer from its journal (``control/drift.py``), by
#: the views that show it; None elsewhere.
CONTROL = "control"


@record(frozen=True)
class FieldSpec:
    """What is declared about one field besides its name and type."""

    cost: str
    label: str = ""
    unit: str = ""


def gpu_field(
    cost: str,
    *,
    label: str = "",
    unit: str = "",
    default: Any = None,
    factory: Any = None,
) -> Any:
    """Declare a field: a record field carrying its :class:`FieldSpec`."""
    meta = {"spec": FieldSpec(cost, label, unit)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def specs(cls: type) -> dict[str, FieldSpec]:
    """The declared fields of a record class, in order, with their specs."""
    return {f.name: f.metadata["spec"] for f in fields(cls) if "spec" in f.metadata}


@record
class PcieInfo:
    gen: int | None = gpu_field(FAST)
    width: int | None = gpu_field(FAST)
    max_gen: int | None = gpu_field(STATIC)
    max_width: int | None = gpu_field(STATIC)
    tx_kib_s: float | None = gpu_field(SLOW, unit="KiB/s")
    rx_kib_s: float | None = gpu_field(SLOW, unit="KiB/s")
    replay_errors: int | None = gpu_field(SLOW)

    @property
    def below_max(self) -> bool:
        """True when the link runs at a lower gen or width than it can."""
        return (self.gen is not None and self.max_gen is not None and self.gen < self.max_gen) or (
            self.width is not None and self.max_width is not None and self.width < self.max_width
        )


@record
class ProcessInfo:
    pid: int
    gpu_memory_mib: float | None = None
    user: str | None = None
    name: str | None = None
    command: str | None = None
    kind: str = "compute"  # compute | graphics | holder (holds the device node open)
    #: Share of the SMs' time this process used since the last read
    #: (``nvmlDeviceGetProcessUtilization``); None where the driver does not say.
    sm_pct: float | None = None
    #: Its estimated part of the GPU's power: SM share plus an even part of the
    #: idle share (``telemetry/shares.py``); None where the shares are unknown.
    power_w: float | None = None
    #: The container, systemd unit or Slurm job it runs in, from its cgroup
    #: (``telemetry/containers.py``): ``docker/web-1``, ``systemd/ollama.service``.
    container: str | None = None


@record
class RemappedRows:
    """HBM rows the card has remapped to spares (``nvmlDeviceGetRemappedRows``).

    ``pending``: a remap waits for the GPU to be reset; ``failure``: a remap
    failed (no spare left): the card needs service.
    """

    correctable: int | None = gpu_field(SLOW)
    uncorrectable: int | None = gpu_field(SLOW)
    pending: bool | None = gpu_field(SLOW)
    failure: bool | None = gpu_field(SLOW)


#: Common XID codes and what they mean (NVIDIA's XID catalogue, in a line each).
XID_MEANINGS: dict[int, str] = {
    8: "GPU stopped processing (a hung channel)",
    13: "graphics engine exception (often an application fault: bad address or instruction)",
    31: "GPU memory page fault (an application accessed memory it should not)",
    32: "invalid or corrupted push buffer stream",
    38: "driver firmware error",
    43: "GPU stopped processing (a user application crashed or was stopped)",
    45: "preemptive cleanup: channels torn down after a reset or a killed process",
    48: "double-bit ECC error (uncorrectable memory error)",
    56: "display engine error",
    57: "error programming video memory interface",
    61: "internal micro-controller breakpoint or warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remap recorded",
    64: "ECC page retirement or row remap failed",
    68: "video processor exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (the affected application must restart)",
    95: "uncontained ECC error (every application on the GPU is affected; reset the GPU)",
    109: "context switch timeout",
    119: "GSP firmware RPC timeout",
    120: "GSP firmware error",
    121: "C2C link corrected error",
    122: "SPI PMU RPC read failure",
    123: "SPI PMU RPC write failure",
    140: "unrecovered ECC error",
    143: "GPU initialization failure",
    154: "GPU recovery action changed (a reset or reboot may be required)",
}


def xid_meaning(code: int) -> str | None:
    """One line about an XID code, or None for one the table does not know."""
    return XID_MEANINGS.get(code)


@record
class XidEvent:
    """An XID error the driver reported while gpustation watched."""

    time: float  # when it was received (Unix time)
    code: int
    meaning: str | None = None


@record
class NvLinkInfo:
    """One NVLink of a GPU; throughput from the driver's data counters between reads."""

    link: int
    active: bool | None = None
    tx_kib_s: float | None = None
    rx_kib_s: float | None = None
    replay_errors: int | None = None
    recovery_errors: int | None = None
    crc_errors: int | None = None  # flit and data CRC errors together


@record
class MigInstance:
    """A MIG device (GPU instance and compute instance) of a GPU, read only."""

    index: int  # MIG device index under its GPU
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    profile: str | None = None  # e.g. "3g.71gb", from the GPU instance profile
    uuid: str | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    processes: list[ProcessInfo] = field(default_factory=list)


@record
class MigInfo:
    """MIG mode (current and pending) and the MIG devices of a GPU."""

    enabled: bool | None = None
    pending: bool | None = None  # the mode after the next GPU reset
    instances: list[MigInstance] = field(default_factory=list)


@record
class GpuSample:
    """One GPU at one moment; every field but ``index`` declared with its cost."""

    index: int
    uuid: str | None = gpu_field(IDENTITY)
    name: str | None = gpu_field(IDENTITY)
    pci_bus_id: str | None = gpu_field(IDENTITY)
    lost: bool = gpu_field(FAST, default=False)
    temperature_c: float | None = gpu_field(FAST, label="Temp", unit="°C")
    temperature_slowdown_c: float | None = gpu_field(STATIC, unit="°C")
    temperature_shutdown_c: float | None = gpu_field(STATIC, unit="°C")
    #: The highest temperature the driver allows the GPU (a later driver's
    #: threshold; None where the driver refuses it).
    temperature_gpu_max_c: float | None = gpu_field(STATIC, unit="°C")
    #: How far the GPU is from its slowdown limit as the driver counts it
    #: (``nvidia-smi -q``'s "T.Limit").
    temperature_margin_c: float | None = gpu_field(FAST, label="T.Limit", unit="°C")
    #: HBM temperature; None on cards that do not report it (GDDR).
    memory_temperature_c: float | None = gpu_field(FAST, label="MemT", unit="°C")
    memory_temperature_max_c: float | None = gpu_field(STATIC, unit="°C")
    power_w: float | None = gpu_field(FAST, label="Power", unit="W")
    power_limit_w: float | None = gpu_field(FAST, unit="W")
    power_default_w: float | None = gpu_field(STATIC, unit="W")
    power_min_w: float | None = gpu_field(STATIC, unit="W")
    power_max_w: float | None = gpu_field(STATIC, unit="W")
    energy_j: float | None = gpu_field(SLOW, unit="J")
    clock_sm_mhz: float | None = gpu_field(FAST, label="SM", unit="MHz")
    clock_sm_max_mhz: float | None = gpu_field(STATIC, unit="MHz")
    clock_mem_mhz: float | None = gpu_field(FAST, label="Mem", unit="MHz")
    clock_mem_max_mhz: float | None = gpu_field(STATIC, unit="MHz")
    memory_used_mib: float | None = gpu_field(FAST, label="VRAM", unit="MiB")
    memory_total_mib: float | None = gpu_field(STATIC, unit="MiB")
    utilization_gpu_pct: float | None = gpu_field(FAST, label="Util", unit="%")
    utilization_memory_pct: float | None = gpu_field(FAST, label="mem", unit="%")
    # The video engines.
    encoder_utilization_pct: float | None = gpu_field(FAST, label="enc", unit="%")
    decoder_utilization_pct: float | None = gpu_field(FAST, label="dec", unit="%")
    fans_pct: list[float] = gpu_field(FAST, label="Fans", unit="%", factory=list)
    fan_control: list[str] = gpu_field(FAST, factory=list)
    pstate: int | None = gpu_field(FAST, label="P")
    throttle_reasons: list[str] | None = gpu_field(FAST, label="Throttle")
    # The link's own fields are declared in PcieInfo.
    pcie: PcieInfo = gpu_field(FAST, label="PCIe", factory=PcieInfo)
    ecc_uncorrected: int | None = gpu_field(FAST)
    #: The driver stays loaded with no client (``nvidia-smi -pm``): without it a
    #: headless card re-initialises for every process that opens it.
    persistence_mode: bool | None = gpu_field(SLOW)
    # Records of their own, read by each backend's process code.
    processes: list[ProcessInfo] = gpu_field(FAST, factory=list)
    #: The device node's number (``/dev/nvidia<minor>``), to find its holders.
    minor_number: int | None = gpu_field(STATIC)
    # Memory health; its fields are declared in RemappedRows.
    remapped_rows: RemappedRows = gpu_field(SLOW, factory=RemappedRows)
    # Profiling metrics (GPM), read by the backend's deep code while asked for.
    sm_active_pct: float | None = gpu_field(GPM, label="SM act", unit="%")
    sm_occupancy_pct: float | None = gpu_field(GPM, label="occ", unit="%")
    tensor_active_pct: float | None = gpu_field(GPM, label="Tensor", unit="%")
    dram_active_pct: float | None = gpu_field(GPM, label="DRAM", unit="%")
    #: The last XIDs seen while watching, oldest first; None: not watched (a
    #: one-shot read) or the driver cannot report them.
    xid_events: list[XidEvent] | None = gpu_field(EVENTS, label="XID")
    #: Each NVLink; [] when the GPU has none, None when it cannot say.
    nvlink: list[NvLinkInfo] | None = gpu_field(SLOW, label="NVLink")
    #: NVLink throughput sent and received over every active link, where only that
    #: sum is known (a host read from Prometheus); None where ``nvlink`` lists them.
    nvlink_sum_mb_s: float | None = gpu_field(SLOW, unit="MB/s")
    #: MIG mode and instances (read only; gpustation never changes MIG mode).
    mig: MigInfo | None = gpu_field(SLOW, label="MIG")
    #: VRAM used minus what the listed processes hold (drivers' and other
    #: containers' contexts, leaks); None when a process's share is unknown.
    unowned_memory_mib: float | None = gpu_field(HOST, label="unowned", unit="MiB")
    #: Processes holding /dev/nvidia<minor> open without being in NVML's list
    #: (the ones this user may look at); None where /proc cannot be read.
    device_holders: list[ProcessInfo] | None = gpu_field(HOST)
    #: The power limit (or fans) differ from what the control journal says was
    #: applied last, with no entry to explain it: what drifted and the command
    #: that applies it again; None when nothing drifted or nobody looked.
    limit_drift: str | None = gpu_field(CONTROL, label="drift")

    @property
    def memory_pct(self) -> float | None:
        if self.memory_used_mib is None or not self.memory_total_mib:
            return None
        return 100.0 * self.memory_used_mib / self.memory_total_mib

    @property
    def power_pct(self) -> float | None:
        if self.power_w is None or not self.power_limit_w:
            return None
        return 100.0 * self.power_w / self.power_limit_w

    @property
    def slowdown_margin_c(self) -> float | None:
        if self.temperature_c is None or self.temperature_slowdown_c is None:
            return None
        return self.temperature_slowdown_c - self.temperature_c

    @property
    def memory_temperature_margin_c(self) -> float | None:
        if self.memory_temperature_c is None or self.memory_temperature_max_c is None:
            return None
        return self.memory_temperature_max_c - self.memory_temperature_c

    @property
    def thermal_throttled(self) -> bool:
        return bool(self.throttle_reasons) and bool(
            THERMAL_REASONS.intersection(self.throttle_reasons or ())
        )

    @property
    def power_throttled(self) -> bool:
        return bool(self.throttle_reasons) and bool(
            POWER_REASONS.intersection(self.throttle_reasons or ())
        )


@record
class HostSample:
    cpu_pct: float | None = None
    cpu_per_core_pct: list[float] = field(default_factory=list)
    load_avg: list[float] | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    swap_used_mib: float | None = None
    swap_total_mib: float | None = None
    disk_read_bytes_s: float | None = None
    disk_write_bytes_s: float | None = None
    net_rx_bytes_s: float | None = None
    net_tx_bytes_s: float | None = None


@record
class GpuLink:
    """How two GPUs meet, as ``nvidia-smi topo -m`` names it."""

    gpu_a: int
    gpu_b: int
    level: str | None = None  # X, NV#, PIX, PXB, PHB, NODE, SYS
    p2p_read: bool | None = None
    p2p_write: bool | None = None
    nvlink_count: int = 0


@record
class GpuPlacement:
    index: int
    numa_node: int | None = None
    cpu_affinity: str | None = None  # e.g. "0-15,32-47"
    pcie_below_max: bool = False


@record
class Topology:
    links: list[GpuLink] = field(default_factory=list)
    gpus: list[GpuPlacement] = field(default_factory=list)

    def link(self, a: int, b: int) -> GpuLink | None:
        for link in self.links:
            if {link.gpu_a, link.gpu_b} == {a, b}:
                return link
        return None


@record
class NamedVersion:
    """A vendor's library or runtime and its version: ``NVML 13.580.159.04``, ``CUDA 13.0``."""

    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


#: The keys the document had before the vendor-neutral ones, written (derived
#: from those) for one more release; readers should move to the new keys.
DEPRECATED_KEYS = {
    "nvml_version": ("library_version", "NVML"),
    "cuda_driver_version": ("compute_runtime_version", "CUDA"),
}


@record
class Snapshot:
    hostname: str
    time: float
    simulated: bool = False
    driver_version: str | None = None
    #: the library the backend reads the cards through (NVML)
    library_version: NamedVersion | None = None
    #: the newest compute runtime the driver supports (CUDA)
    compute_runtime_version: NamedVersion | None = None
    gpus: list[GpuSample] = field(default_factory=list)
    host: HostSample = field(default_factory=HostSample)
    topology: Topology = field(default_factory=Topology)
    note: str | None = None  # e.g. why the simulated backend is in use
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = _to_dict(self)
        out: dict[str, Any] = {}
        for key, value in doc.items():
            out[key] = value
            if key == "compute_runtime_version":
                for old, (new, name) in DEPRECATED_KEYS.items():
                    named = getattr(self, new)
                    out[old] = named.version if named is not None and named.name == name else None
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Snapshot:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} document (schema={data.get('schema')!r})")
        snap: Snapshot = _from_dict(cls, data)
        for old, (new, name) in DEPRECATED_KEYS.items():
            # a document of an older gpustation has only the old key
            value = data.get(old)
            if getattr(snap, new) is None and isinstance(value, str):
                setattr(snap, new, NamedVersion(name, value))
        return snap

    def gpu(self, index: int) -> GpuSample | None:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        return None


# Which fields hold records of their own (one, or a list of them).
_NESTED: dict[tuple[type, str], type] = {
    (Snapshot, "gpus"): GpuSample,
    (Snapshot, "host"): HostSample,
    (Snapshot, "topology"): Topology,
    (Snapshot, "library_version"): NamedVersion,
    (Snapshot, "compute_runtime_version"): NamedVersion,
    (Topology, "links"): GpuLink,
    (Topology, "gpus"): GpuPlacement,
    (GpuSample, "pcie"): PcieInfo,
    (GpuSample, "processes"): ProcessInfo,
    (GpuSample, "remapped_rows"): RemappedRows,
    (GpuSample, "xid_events"): XidEvent,
    (GpuSample, "nvlink"): NvLinkInfo,
    (GpuSample, "mig"): MigInfo,
    (GpuSample, "device_holders"): ProcessInfo,
    (MigInfo, "instances"): MigInstance,
    (MigInstance, "processes"): ProcessInfo,
}
#: GpuSample fields that are records whose own fields are declared (and read) one by one.
RECORDS: dict[str, type] = {"pcie": PcieInfo, "remapped_rows": RemappedRows}


def field_keys() -> dict[str, FieldSpec]:
    """Every declared GPU field by key, in order: ``power_w``, and ``pcie.gen`` for a
    field of a record in RECORDS (which stands for its fields). Backends' read
    tables are keyed by these."""
    keys: dict[str, FieldSpec] = {}
    for name, spec in specs(GpuSample).items():
        cls = RECORDS.get(name)
        if cls is None:
            keys[name] = spec
        else:
            keys.update((f"{name}.{sub}", s) for sub, s in specs(cls).items())
    return keys


def put_field(sample: GpuSample, key: str, value: Any) -> None:
    """Set the field named by a key of :func:`field_keys` on a sample."""
    record_name, dot, name = key.partition(".")
    if dot:
        setattr(getattr(sample, record_name), name, value)
    else:
        setattr(sample, key, value)


_NAMES: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in {*(c for c, _ in _NESTED), *_NESTED.values()}
}


def _to_dict(obj: Any) -> Any:
    names = _NAMES.get(type(obj))
    if names is not None:
        return {name: _to_dict(getattr(obj, name)) for name in names}
    if isinstance(obj, list):
        return [_to_dict(x) for x in obj]
    return obj


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for name in _NAMES[cls]:
        if name not in data:
            continue
        value = data[name]
        sub = _NESTED.get((cls, name))
        if sub is not None and value is not None:
            if isinstance(value, list):
                value = [_from_dict(sub, v) for v in value]
            else:
                value = _from_dict(sub, value)
        kwargs[name] = value
    return cls(**kwargs)
