"""The one telemetry model every backend fills and every renderer reads.

Units are in the names. A value the hardware does not report is ``None``
(``null`` in JSON), never a made-up number. ``Snapshot.to_dict`` gives the
``gpustation.snapshot/1`` document; ``Snapshot.from_dict`` reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

SCHEMA = "gpustation.snapshot/1"

# Decoded clocks-event (throttle) reasons, in NVML bit order.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal"),
    (0x040, "hw_thermal"),
    (0x080, "hw_power_brake"),
    (0x100, "display_clocks"),
)
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


@dataclass(slots=True)
class PcieInfo:
    gen: int | None = None
    width: int | None = None
    max_gen: int | None = None
    max_width: int | None = None
    tx_kib_s: float | None = None
    rx_kib_s: float | None = None
    replay_errors: int | None = None

    @property
    def below_max(self) -> bool:
        """True when the link runs at a lower gen or width than it can."""
        return (self.gen is not None and self.max_gen is not None and self.gen < self.max_gen) or (
            self.width is not None and self.max_width is not None and self.width < self.max_width
        )


@dataclass(slots=True)
class ProcessInfo:
    pid: int
    gpu_memory_mib: float | None = None
    user: str | None = None
    name: str | None = None
    command: str | None = None
    kind: str = "compute"  # compute | graphics


@dataclass(slots=True)
class GpuSample:
    index: int
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    lost: bool = False
    temperature_c: float | None = None
    temperature_slowdown_c: float | None = None
    temperature_shutdown_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    power_default_w: float | None = None
    power_min_w: float | None = None
    power_max_w: float | None = None
    energy_j: float | None = None
    clock_sm_mhz: float | None = None
    clock_sm_max_mhz: float | None = None
    clock_mem_mhz: float | None = None
    clock_mem_max_mhz: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    utilization_gpu_pct: float | None = None
    utilization_memory_pct: float | None = None
    fans_pct: list[float] = field(default_factory=list)
    fan_control: list[str] = field(default_factory=list)
    pstate: int | None = None
    throttle_reasons: list[str] | None = None
    pcie: PcieInfo = field(default_factory=PcieInfo)
    ecc_uncorrected: int | None = None
    processes: list[ProcessInfo] = field(default_factory=list)

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
    def thermal_throttled(self) -> bool:
        return bool(self.throttle_reasons) and bool(
            THERMAL_REASONS.intersection(self.throttle_reasons or ())
        )

    @property
    def power_throttled(self) -> bool:
        return bool(self.throttle_reasons) and bool(
            POWER_REASONS.intersection(self.throttle_reasons or ())
        )


@dataclass(slots=True)
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


@dataclass(slots=True)
class GpuLink:
    """How two GPUs meet, as ``nvidia-smi topo -m`` names it."""

    gpu_a: int
    gpu_b: int
    level: str | None = None  # X, NV#, PIX, PXB, PHB, NODE, SYS
    p2p_read: bool | None = None
    p2p_write: bool | None = None
    nvlink_count: int = 0


@dataclass(slots=True)
class GpuPlacement:
    index: int
    numa_node: int | None = None
    cpu_affinity: str | None = None  # e.g. "0-15,32-47"
    pcie_below_max: bool = False


@dataclass(slots=True)
class Topology:
    links: list[GpuLink] = field(default_factory=list)
    gpus: list[GpuPlacement] = field(default_factory=list)

    def link(self, a: int, b: int) -> GpuLink | None:
        for link in self.links:
            if {link.gpu_a, link.gpu_b} == {a, b}:
                return link
        return None


@dataclass(slots=True)
class Snapshot:
    hostname: str
    time: float
    simulated: bool = False
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: list[GpuSample] = field(default_factory=list)
    host: HostSample = field(default_factory=HostSample)
    topology: Topology = field(default_factory=Topology)
    note: str | None = None  # e.g. why the simulated backend is in use
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Snapshot:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} document (schema={data.get('schema')!r})")
        return _from_dict(cls, data)

    def gpu(self, index: int) -> GpuSample | None:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        return None


_NESTED: dict[tuple[type, str], type] = {}


def _to_dict(obj: Any) -> Any:
    if hasattr(obj, "__dataclass_fields__"):
        return {f.name: _to_dict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, list):
        return [_to_dict(x) for x in obj]
    return obj


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        sub = _NESTED.get((cls, f.name))
        if sub is not None and value is not None:
            if isinstance(value, list):
                value = [_from_dict(sub, v) for v in value]
            else:
                value = _from_dict(sub, value)
        kwargs[f.name] = value
    return cls(**kwargs)


_NESTED.update(
    {
        (Snapshot, "gpus"): GpuSample,
        (Snapshot, "host"): HostSample,
        (Snapshot, "topology"): Topology,
        (Topology, "links"): GpuLink,
        (Topology, "gpus"): GpuPlacement,
        (GpuSample, "pcie"): PcieInfo,
        (GpuSample, "processes"): ProcessInfo,
    }
)
