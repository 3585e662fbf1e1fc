"""The one telemetry model every backend fills and every renderer reads.

Units are in the names. A value the hardware does not report is ``None``
(``null`` in JSON), never a made-up number. ``Snapshot.to_dict`` gives the
``gpustation.snapshot/1`` document; ``Snapshot.from_dict`` reads it back.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: a one-shot snapshot skips it
if TYPE_CHECKING:
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


class _Record:
    """Slots, equality, ``repr`` and dict conversion, all read from ``_fields``.

    What ``@dataclass(slots=True)`` would give, written out: importing and
    creating the dataclasses of this module took about 25 ms of a one-shot
    ``gpustation snapshot`` on an H200 machine (``dataclasses`` pulls in
    ``inspect``, and each class's methods are compiled at import).
    """

    #: The field names, in the order of the JSON document; also the slots.
    _fields: tuple[str, ...] = ()
    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self._fields)

    __hash__ = None  # type: ignore[assignment]  # mutable: not hashable, as a dataclass

    def __repr__(self) -> str:
        args = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._fields)
        return f"{type(self).__name__}({args})"


class PcieInfo(_Record):
    _fields = ("gen", "width", "max_gen", "max_width", "tx_kib_s", "rx_kib_s", "replay_errors")
    __slots__ = _fields

    def __init__(
        self,
        gen: int | None = None,
        width: int | None = None,
        max_gen: int | None = None,
        max_width: int | None = None,
        tx_kib_s: float | None = None,
        rx_kib_s: float | None = None,
        replay_errors: int | None = None,
    ) -> None:
        self.gen = gen
        self.width = width
        self.max_gen = max_gen
        self.max_width = max_width
        self.tx_kib_s = tx_kib_s
        self.rx_kib_s = rx_kib_s
        self.replay_errors = replay_errors

    @property
    def below_max(self) -> bool:
        """True when the link runs at a lower gen or width than it can."""
        return (self.gen is not None and self.max_gen is not None and self.gen < self.max_gen) or (
            self.width is not None and self.max_width is not None and self.width < self.max_width
        )


class ProcessInfo(_Record):
    _fields = ("pid", "gpu_memory_mib", "user", "name", "command", "kind")
    __slots__ = _fields

    def __init__(
        self,
        pid: int,
        gpu_memory_mib: float | None = None,
        user: str | None = None,
        name: str | None = None,
        command: str | None = None,
        kind: str = "compute",  # compute | graphics
    ) -> None:
        self.pid = pid
        self.gpu_memory_mib = gpu_memory_mib
        self.user = user
        self.name = name
        self.command = command
        self.kind = kind


class GpuSample(_Record):
    _fields = (
        "index",
        "uuid",
        "name",
        "pci_bus_id",
        "lost",
        "temperature_c",
        "temperature_slowdown_c",
        "temperature_shutdown_c",
        "power_w",
        "power_limit_w",
        "power_default_w",
        "power_min_w",
        "power_max_w",
        "energy_j",
        "clock_sm_mhz",
        "clock_sm_max_mhz",
        "clock_mem_mhz",
        "clock_mem_max_mhz",
        "memory_used_mib",
        "memory_total_mib",
        "utilization_gpu_pct",
        "utilization_memory_pct",
        "fans_pct",
        "fan_control",
        "pstate",
        "throttle_reasons",
        "pcie",
        "ecc_uncorrected",
        "processes",
    )
    __slots__ = _fields

    def __init__(
        self,
        index: int,
        uuid: str | None = None,
        name: str | None = None,
        pci_bus_id: str | None = None,
        lost: bool = False,
        temperature_c: float | None = None,
        temperature_slowdown_c: float | None = None,
        temperature_shutdown_c: float | None = None,
        power_w: float | None = None,
        power_limit_w: float | None = None,
        power_default_w: float | None = None,
        power_min_w: float | None = None,
        power_max_w: float | None = None,
        energy_j: float | None = None,
        clock_sm_mhz: float | None = None,
        clock_sm_max_mhz: float | None = None,
        clock_mem_mhz: float | None = None,
        clock_mem_max_mhz: float | None = None,
        memory_used_mib: float | None = None,
        memory_total_mib: float | None = None,
        utilization_gpu_pct: float | None = None,
        utilization_memory_pct: float | None = None,
        fans_pct: list[float] | None = None,
        fan_control: list[str] | None = None,
        pstate: int | None = None,
        throttle_reasons: list[str] | None = None,
        pcie: PcieInfo | None = None,
        ecc_uncorrected: int | None = None,
        processes: list[ProcessInfo] | None = None,
    ) -> None:
        self.index = index
        self.uuid = uuid
        self.name = name
        self.pci_bus_id = pci_bus_id
        self.lost = lost
        self.temperature_c = temperature_c
        self.temperature_slowdown_c = temperature_slowdown_c
        self.temperature_shutdown_c = temperature_shutdown_c
        self.power_w = power_w
        self.power_limit_w = power_limit_w
        self.power_default_w = power_default_w
        self.power_min_w = power_min_w
        self.power_max_w = power_max_w
        self.energy_j = energy_j
        self.clock_sm_mhz = clock_sm_mhz
        self.clock_sm_max_mhz = clock_sm_max_mhz
        self.clock_mem_mhz = clock_mem_mhz
        self.clock_mem_max_mhz = clock_mem_max_mhz
        self.memory_used_mib = memory_used_mib
        self.memory_total_mib = memory_total_mib
        self.utilization_gpu_pct = utilization_gpu_pct
        self.utilization_memory_pct = utilization_memory_pct
        self.fans_pct: list[float] = [] if fans_pct is None else fans_pct
        self.fan_control: list[str] = [] if fan_control is None else fan_control
        self.pstate = pstate
        self.throttle_reasons = throttle_reasons
        self.pcie: PcieInfo = PcieInfo() if pcie is None else pcie
        self.ecc_uncorrected = ecc_uncorrected
        self.processes: list[ProcessInfo] = [] if processes is None else processes

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


class HostSample(_Record):
    _fields = (
        "cpu_pct",
        "cpu_per_core_pct",
        "load_avg",
        "memory_used_mib",
        "memory_total_mib",
        "swap_used_mib",
        "swap_total_mib",
        "disk_read_bytes_s",
        "disk_write_bytes_s",
        "net_rx_bytes_s",
        "net_tx_bytes_s",
    )
    __slots__ = _fields

    def __init__(
        self,
        cpu_pct: float | None = None,
        cpu_per_core_pct: list[float] | None = None,
        load_avg: list[float] | None = None,
        memory_used_mib: float | None = None,
        memory_total_mib: float | None = None,
        swap_used_mib: float | None = None,
        swap_total_mib: float | None = None,
        disk_read_bytes_s: float | None = None,
        disk_write_bytes_s: float | None = None,
        net_rx_bytes_s: float | None = None,
        net_tx_bytes_s: float | None = None,
    ) -> None:
        self.cpu_pct = cpu_pct
        self.cpu_per_core_pct: list[float] = [] if cpu_per_core_pct is None else cpu_per_core_pct
        self.load_avg = load_avg
        self.memory_used_mib = memory_used_mib
        self.memory_total_mib = memory_total_mib
        self.swap_used_mib = swap_used_mib
        self.swap_total_mib = swap_total_mib
        self.disk_read_bytes_s = disk_read_bytes_s
        self.disk_write_bytes_s = disk_write_bytes_s
        self.net_rx_bytes_s = net_rx_bytes_s
        self.net_tx_bytes_s = net_tx_bytes_s


class GpuLink(_Record):
    """How two GPUs meet, as ``nvidia-smi topo -m`` names it."""

    _fields = ("gpu_a", "gpu_b", "level", "p2p_read", "p2p_write", "nvlink_count")
    __slots__ = _fields

    def __init__(
        self,
        gpu_a: int,
        gpu_b: int,
        level: str | None = None,  # X, NV#, PIX, PXB, PHB, NODE, SYS
        p2p_read: bool | None = None,
        p2p_write: bool | None = None,
        nvlink_count: int = 0,
    ) -> None:
        self.gpu_a = gpu_a
        self.gpu_b = gpu_b
        self.level = level
        self.p2p_read = p2p_read
        self.p2p_write = p2p_write
        self.nvlink_count = nvlink_count


class GpuPlacement(_Record):
    _fields = ("index", "numa_node", "cpu_affinity", "pcie_below_max")
    __slots__ = _fields

    def __init__(
        self,
        index: int,
        numa_node: int | None = None,
        cpu_affinity: str | None = None,  # e.g. "0-15,32-47"
        pcie_below_max: bool = False,
    ) -> None:
        self.index = index
        self.numa_node = numa_node
        self.cpu_affinity = cpu_affinity
        self.pcie_below_max = pcie_below_max


class Topology(_Record):
    _fields = ("links", "gpus")
    __slots__ = _fields

    def __init__(
        self, links: list[GpuLink] | None = None, gpus: list[GpuPlacement] | None = None
    ) -> None:
        self.links: list[GpuLink] = [] if links is None else links
        self.gpus: list[GpuPlacement] = [] if gpus is None else gpus

    def link(self, a: int, b: int) -> GpuLink | None:
        for link in self.links:
            if {link.gpu_a, link.gpu_b} == {a, b}:
                return link
        return None


class Snapshot(_Record):
    _fields = (
        "hostname",
        "time",
        "simulated",
        "driver_version",
        "nvml_version",
        "cuda_driver_version",
        "gpus",
        "host",
        "topology",
        "note",
        "schema",
    )
    __slots__ = _fields

    def __init__(
        self,
        hostname: str,
        time: float,
        simulated: bool = False,
        driver_version: str | None = None,
        nvml_version: str | None = None,
        cuda_driver_version: str | None = None,
        gpus: list[GpuSample] | None = None,
        host: HostSample | None = None,
        topology: Topology | None = None,
        note: str | None = None,  # e.g. why the simulated backend is in use
        schema: str = SCHEMA,
    ) -> None:
        self.hostname = hostname
        self.time = time
        self.simulated = simulated
        self.driver_version = driver_version
        self.nvml_version = nvml_version
        self.cuda_driver_version = cuda_driver_version
        self.gpus: list[GpuSample] = [] if gpus is None else gpus
        self.host: HostSample = HostSample() if host is None else host
        self.topology: Topology = Topology() if topology is None else topology
        self.note = note
        self.schema = schema

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Snapshot:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} document (schema={data.get('schema')!r})")
        return _from_dict(cls, data)  # type: ignore[no-any-return]

    def gpu(self, index: int) -> GpuSample | None:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        return None


_NESTED: dict[tuple[type, str], type] = {}


def _to_dict(obj: Any) -> Any:
    if isinstance(obj, _Record):
        return {name: _to_dict(getattr(obj, name)) for name in obj._fields}
    if isinstance(obj, list):
        return [_to_dict(x) for x in obj]
    return obj


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for name in cls._fields:  # type: ignore[attr-defined]
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
