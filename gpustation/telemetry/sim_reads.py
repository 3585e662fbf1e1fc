"""How the simulator reads each declared field: its read table.

One line per field key of :func:`gpustation.telemetry.model.field_keys`, in
the model's order: a function of the card's simulated moment (:class:`SimView`),
or ``None`` where the simulator's dedicated code fills the field
(``SimBackend._deep``: GPM, XIDs, NVLink, MIG) or the sampler does. A test
checks the table names every declared field and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpustation.telemetry.model import ProcessInfo
from gpustation.telemetry.sim_cards import CardSpec, memory_temperature

#: a card at or above this load counts as busy (clocks up, PCIe at full speed)
BUSY_LOAD = 0.05


@dataclass
class SimView:
    """One simulated card at one moment: what its reads are made from."""

    index: int
    serial: int  # the card's own number, which follows it between slots
    spec: CardSpec
    g: dict[str, Any]  # its state (temperature, power, fans...)
    hash: Callable[..., float]  # the machine's deterministic numbers in [0, 1)
    load: float = 0.0
    processes: list[ProcessInfo] = field(default_factory=list)
    memory_used_mib: float = 0.0
    #: PCIe tx and rx KiB/s and replay count, from the last slow read
    pcie_slow: tuple[float, float, int] = (0.0, 0.0, 0)
    read_energy: bool = True
    read_ecc: bool = True

    @property
    def busy(self) -> bool:
        return self.load >= BUSY_LOAD


def _temperature(v: SimView) -> float | None:
    return None if v.g.get("temperature_fails") else round(float(v.g["temperature_c"]), 1)


def _margin(v: SimView) -> float | None:
    temperature = _temperature(v)
    return None if temperature is None else round(v.spec.slowdown_c - temperature, 1)


def _memory_temperature(v: SimView) -> float | None:
    if v.g.get("temperature_fails"):
        return None
    return memory_temperature(v.spec, float(v.g["ambient_c"]), float(v.g["temperature_c"]), v.load)


def _pcie_gen(v: SimView) -> int:
    """The link's gen: what it was poked down to, else the card's own (lower when idle)."""
    trained = v.spec.pcie_max_gen if v.busy else v.spec.pcie_idle_gen
    poked = v.g.get("pcie_gen")
    return trained if poked is None else min(int(poked), trained)


def _pstate(v: SimView) -> int:
    if not v.spec.fans:  # a datacenter card stays in P0
        return 0
    return 2 if v.busy else 8


def _holders(v: SimView) -> list[ProcessInfo]:
    return [
        ProcessInfo(pid=pid, user="sim", name=cmd.split(" ")[0], command=cmd, kind="holder")
        for pid, cmd in v.g["holders"]
    ]


def _remapped(value: Any) -> Callable[[SimView], Any]:
    return lambda v: value if v.spec.ecc else None


Read = Callable[[SimView], Any]

READS: dict[str, Read | None] = {
    "uuid": lambda v: f"GPU-SIM-{int(v.hash('uuid', v.spec.key) * 2**32):08x}-{v.serial:04d}",
    "name": lambda v: v.spec.name,
    "pci_bus_id": lambda v: f"00000000:{0x17 + v.index * 0x10:02X}:00.0",
    "lost": None,  # SimBackend: a lost card gives its identity alone
    "temperature_c": _temperature,
    "temperature_slowdown_c": lambda v: v.spec.slowdown_c,
    "temperature_shutdown_c": lambda v: v.spec.shutdown_c,
    "temperature_gpu_max_c": lambda v: v.spec.gpu_max_c,
    "temperature_margin_c": _margin,
    "memory_temperature_c": _memory_temperature,
    "memory_temperature_max_c": lambda v: v.spec.memory_temp_max_c,
    "power_w": lambda v: round(float(v.g["power_w"]), 1),
    "power_limit_w": lambda v: float(v.g["power_limit_w"]),
    "power_default_w": lambda v: v.spec.power_default_w,
    "power_min_w": lambda v: v.spec.power_min_w,
    "power_max_w": lambda v: v.spec.power_max_w,
    "energy_j": lambda v: round(float(v.g["energy_j"]), 1) if v.read_energy else None,
    "clock_sm_mhz": lambda v: round(float(v.g["clock_sm_mhz"])),
    "clock_sm_max_mhz": lambda v: v.spec.clock_sm_max_mhz,
    "clock_mem_mhz": lambda v: v.spec.clock_mem_max_mhz if v.busy else v.spec.clock_mem_idle_mhz,
    "clock_mem_max_mhz": lambda v: v.spec.clock_mem_max_mhz,
    "memory_used_mib": lambda v: min(v.memory_used_mib, v.spec.memory_total_mib),
    "memory_total_mib": lambda v: v.spec.memory_total_mib,
    "utilization_gpu_pct": lambda v: round(v.load * 100.0),
    "utilization_memory_pct": lambda v: round(v.load * 62.0),
    # a little work from jobs that decode their inputs on the GPU
    "encoder_utilization_pct": lambda v: (
        round(v.load * 6.0 * v.hash("enc", v.index)) if v.busy else 0
    ),
    "decoder_utilization_pct": lambda v: (
        round(v.load * 30.0 * v.hash("dec", v.index)) if v.busy else 0
    ),
    "fans_pct": lambda v: [round(f) for f in v.g["fans_pct"]],
    "fan_control": lambda v: list(v.g["fan_mode"]),
    "pstate": _pstate,
    "throttle_reasons": lambda v: list(v.g["throttle"]),
    "pcie.gen": _pcie_gen,
    "pcie.width": lambda v: int(v.g.get("pcie_width") or 16),
    "pcie.max_gen": lambda v: v.spec.pcie_max_gen,
    "pcie.max_width": lambda v: 16,
    "pcie.tx_kib_s": lambda v: v.pcie_slow[0],
    "pcie.rx_kib_s": lambda v: v.pcie_slow[1],
    "pcie.replay_errors": lambda v: v.pcie_slow[2],
    "ecc_uncorrected": lambda v: v.g["ecc_uncorrected"] if v.read_ecc else None,
    # A datacenter card's driver is kept loaded (nvidia-persistenced); a desktop
    # card's display keeps it loaded anyway.
    "persistence_mode": lambda v: v.spec.fans == 0,
    "processes": lambda v: v.processes,
    "minor_number": lambda v: v.index,
    "remapped_rows.correctable": _remapped(0),
    "remapped_rows.uncorrectable": _remapped(0),
    "remapped_rows.pending": _remapped(False),
    "remapped_rows.failure": _remapped(False),
    "sm_active_pct": None,  # SimBackend._deep
    "sm_occupancy_pct": None,  # SimBackend._deep
    "tensor_active_pct": None,  # SimBackend._deep
    "dram_active_pct": None,  # SimBackend._deep
    "xid_events": None,  # SimBackend._deep
    "nvlink": None,  # SimBackend._deep
    "nvlink_sum_mb_s": None,  # only a host read from Prometheus knows the sum alone
    "mig": None,  # SimBackend._deep
    "unowned_memory_mib": None,  # the sampler
    "device_holders": _holders,
    "limit_drift": None,  # the control layer, from its journal
}
