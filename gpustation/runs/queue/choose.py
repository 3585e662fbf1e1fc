"""Which free GPUs a queued run asking for any N gets: the least used one, or for N > 1
the best-connected set by the topology gpustation reads (NVLink over one PCIe switch
over the host bridge over the CPUs' interconnect), then the least used."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from gpustation.telemetry.model import Topology

#: how far apart two GPUs are, by ``nvidia-smi topo -m``'s words (lower is closer)
DISTANCE = {"X": 0, "NV": 1, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6}
UNKNOWN_DISTANCE = 7
#: above this many free GPUs the sets are not all tried (8 choose 4 is 70)
MAX_EXHAUSTIVE = 12


def distance(topology: Topology | None, a: int, b: int) -> int:
    link = topology.link(a, b) if topology is not None else None
    if link is None or link.level is None:
        return UNKNOWN_DISTANCE
    if link.nvlink_count or link.level.startswith("NV"):
        return DISTANCE["NV"]
    return DISTANCE.get(link.level, UNKNOWN_DISTANCE)


def choose(
    count: int,
    free: Sequence[int],
    used: Callable[[int], tuple[float, float]],
    topology: Topology | None = None,
) -> list[int] | None:
    """``count`` of the ``free`` GPUs, or None when there are fewer."""
    if count <= 0 or len(free) < count:
        return None
    by_use = sorted(free, key=lambda i: (used(i), i))
    if count == 1 or len(free) > MAX_EXHAUSTIVE:
        return sorted(by_use[:count])

    def cost(group: tuple[int, ...]) -> tuple[int, float, float]:
        far = sum(distance(topology, a, b) for a, b in itertools.combinations(group, 2))
        mem = sum(used(i)[0] for i in group)
        util = sum(used(i)[1] for i in group)
        return (far, mem, util)

    best = min(itertools.combinations(sorted(free), count), key=cost)
    return list(best)
