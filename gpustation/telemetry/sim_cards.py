"""The simulated cards and the synthetic jobs they run: data for
:mod:`gpustation.telemetry.sim`."""

from __future__ import annotations

from dataclasses import dataclass

from gpustation.telemetry import sim_last


@dataclass(frozen=True)
class CardSpec:
    key: str
    name: str
    power_default_w: float
    power_min_w: float
    power_max_w: float
    #: what a fully loaded card would draw with no cap
    power_demand_w: float
    power_idle_w: float
    memory_total_mib: float
    slowdown_c: float
    shutdown_c: float
    clock_sm_max_mhz: float
    clock_sm_idle_mhz: float
    clock_mem_max_mhz: float
    clock_mem_idle_mhz: float
    fans: int
    fan_min_pct: int
    fan_max_pct: int
    #: thermal resistance (C per W) with fans stopped; more fan lowers it
    thermal_r: float
    pcie_max_gen: int
    pcie_idle_gen: int
    ecc: bool
    nvlinks: int
    #: profiling metrics (GPM: Hopper and later), MIG and row remapping (datacenter cards)
    gpm: bool = False
    mig: bool = False
    #: HBM cards report their memory's temperature: this many degrees above the
    #: GPU's share of the heat at idle, and its maximum (None: GDDR, no sensor)
    memory_temp_offset_c: float | None = None
    memory_temp_max_c: float | None = None
    #: the driver's GPU maximum threshold (None: not given)
    gpu_max_c: float | None = None


CARDS: dict[str, CardSpec] = {
    "rtx4090": CardSpec(
        key="rtx4090",
        name="NVIDIA GeForce RTX 4090 (simulated)",
        power_default_w=450.0,
        power_min_w=150.0,
        power_max_w=600.0,
        power_demand_w=560.0,
        power_idle_w=22.0,
        memory_total_mib=24564.0,
        slowdown_c=87.0,
        shutdown_c=92.0,
        clock_sm_max_mhz=3105.0,
        clock_sm_idle_mhz=210.0,
        clock_mem_max_mhz=10501.0,
        clock_mem_idle_mhz=405.0,
        fans=2,
        fan_min_pct=30,
        fan_max_pct=100,
        thermal_r=0.145,
        pcie_max_gen=4,
        pcie_idle_gen=1,
        ecc=False,
        nvlinks=0,
    ),
    "h200": CardSpec(
        key="h200",
        name="NVIDIA H200 (simulated)",
        power_default_w=700.0,
        power_min_w=200.0,
        power_max_w=700.0,
        power_demand_w=760.0,
        power_idle_w=78.0,
        memory_total_mib=143771.0,
        slowdown_c=89.0,
        shutdown_c=95.0,
        clock_sm_max_mhz=1980.0,
        clock_sm_idle_mhz=345.0,
        clock_mem_max_mhz=3201.0,
        clock_mem_idle_mhz=3201.0,
        fans=0,
        fan_min_pct=0,
        fan_max_pct=0,
        thermal_r=0.064,
        pcie_max_gen=5,
        pcie_idle_gen=5,
        ecc=True,
        nvlinks=18,
        gpm=True,
        mig=True,
        memory_temp_offset_c=5.0,
        memory_temp_max_c=95.0,
        gpu_max_c=87.0,
    ),
}

MEMORY_LOAD_C = 6.0  # the HBM's own rise at full DRAM load
MEMORY_SHARE = 0.6  # how much of the GPU's rise over ambient the HBM sees


def memory_temperature(spec: CardSpec, ambient_c: float, gpu_c: float, load: float) -> float | None:
    """HBM sits beside the GPU on one package: it follows the GPU's temperature
    (and so its power) at a lower slope, a little above it at idle and below it
    under load, as an H200 reads, plus a rise of its own under DRAM load. None
    for a card without the sensor (GDDR)."""
    if spec.memory_temp_offset_c is None:
        return None
    heat = gpu_c - ambient_c
    rise = MEMORY_SHARE * heat + spec.memory_temp_offset_c + MEMORY_LOAD_C * load
    return round(ambient_c + rise, 1)


# the defaults and the card names live where --help reads them without this module
DEFAULT_COUNT = sim_last.DEFAULT_COUNT
DEFAULT_CARD = sim_last.DEFAULT_CARD

JOB_NAMES = (
    ("python", "python train.py --config configs/llama-lora.yaml"),
    ("python", "python -m torch.distributed.run --nproc_per_node 2 pretrain.py"),
    ("python3", "python3 finetune_resnet.py --batch-size 256 --bf16"),
    ("vllm", "python -m vllm.entrypoints.openai.api_server --model ./ckpt"),
    ("jupyter", "python -m ipykernel_launcher -f kernel-4f2a.json"),
)
#: the process a poked ``idle_holder_mib`` puts on a GPU: a notebook kernel
#: that loaded a model and went quiet
IDLE_HOLDER = ("jupyter", "python -m ipykernel_launcher -f kernel-7c1e.json")
IDLE_HOLDER_PID = 19000


def card_label(card: str) -> str:
    """A card's short name: ``H200``, ``RTX 4090``."""
    name = CARDS[card].name.removesuffix(" (simulated)").removeprefix("NVIDIA ")
    return name.removeprefix("GeForce ")
