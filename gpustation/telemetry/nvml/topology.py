"""GPU topology through NVML: how each pair of GPUs meets, and where each GPU sits.

NVLink peers (direct or through NVSwitches), the PCIe common ancestor, P2P
support, and each GPU's NUMA node and nearby CPUs (from sysfs where the
kernel knows, NVML otherwise). Read once per sampler: topology is static.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence

from gpustation.telemetry.model import GpuLink, GpuPlacement, Topology
from gpustation.telemetry.nvml.query import Device, GpuLost, Query

# NVML topology levels -> the names ``nvidia-smi topo -m`` prints.
_TOPOLOGY_LEVELS = {
    0: "PIX",  # INTERNAL: two GPUs on one board
    10: "PIX",  # SINGLE: one PCIe switch
    20: "PXB",  # MULTIPLE: several PCIe switches
    30: "PHB",  # HOSTBRIDGE
    40: "NODE",  # NODE (CPU): same NUMA node, across host bridges
    50: "SYS",  # SYSTEM: across the SMP interconnect
}


def normalize_bus_id(bus_id: str | None) -> str | None:
    """``00000000:01:00.0`` -> ``0000:01:00.0`` (lower case, 4-digit domain).

    NVML prints an 8-digit domain; sysfs and ``lspci`` use 4 digits.
    """
    if not bus_id:
        return None
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep or not rest:
        return text
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


def cpu_mask_to_ranges(words: Sequence[int]) -> str | None:
    """NVML CPU-affinity words (64 CPUs each, word 0 first) -> ``"0-15,32-47"``."""
    return cpus_to_ranges(_mask_cpus(words))


def _mask_cpus(words: Sequence[int]) -> set[int]:
    return {
        w * 64 + bit for w, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1
    }


def cpus_to_ranges(cpu_set: set[int]) -> str | None:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"``."""
    cpus = sorted(cpu_set)
    if not cpus:
        return None
    parts: list[str] = []
    start = prev = cpus[0]
    for cpu in cpus[1:]:
        if cpu == prev + 1:
            prev = cpu
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = cpu
    parts.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(parts)


def parse_cpu_list(text: str) -> set[int]:
    """``0-3,8,10-11`` (the kernel's cpulist format) as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def text(value: object) -> str | None:
    """NVML strings arrive as str or, from older pynvml, as bytes."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\x00")
    return str(value)


class TopologyReader:
    """Works out :class:`Topology` for some GPUs of a backend."""

    def __init__(
        self,
        q: Query,
        everyone: Sequence[Device],
        mark_lost: Callable[[Device, str], None],
        sysfs_pci_root: str,
        sysfs_node_root: str,
    ) -> None:
        self.q = q
        self._everyone = everyone
        self._mark_lost = mark_lost
        self._sysfs_pci_root = sysfs_pci_root
        self._sysfs_node_root = sysfs_node_root

    def read(self, gpus: Sequence[Device], live: Sequence[Device]) -> Topology:
        """Links between each pair of ``gpus`` and where each sits; ``live`` are not lost."""
        by_bus = {normalize_bus_id(g.pci_bus_id): g.index for g in self._everyone if g.pci_bus_id}
        nvlinks: dict[tuple[int, int], int] = {}
        switch_links: dict[int, int] = {}
        for gpu in live:
            try:
                peers, to_switches = self._nvlink_peers(gpu, by_bus)
            except GpuLost as err:
                self._mark_lost(gpu, str(err))
                continue
            switch_links[gpu.index] = to_switches
            for remote, count in peers.items():
                key = (min(gpu.index, remote), max(gpu.index, remote))
                nvlinks[key] = max(nvlinks.get(key, 0), count)
        # On NVSwitch systems (HGX) every GPU's links go to the switches, and any
        # two GPUs talk over as many links as the lesser of them has, which is
        # what ``nvidia-smi topo -m`` prints as NV18 on an 8-GPU H100/H200 box.
        for i, a in enumerate(live):
            for b in live[i + 1 :]:
                via_switch = min(switch_links.get(a.index, 0), switch_links.get(b.index, 0))
                key = (min(a.index, b.index), max(a.index, b.index))
                if via_switch > nvlinks.get(key, 0):
                    nvlinks[key] = via_switch
        topo = Topology()
        for i, a in enumerate(gpus):
            for b in gpus[i + 1 :]:
                topo.links.append(self._link(a, b, nvlinks))
        for gpu in gpus:
            topo.gpus.append(self._placement(gpu))
        return topo

    def _nvlink_peers(
        self, gpu: Device, by_bus: dict[str | None, int]
    ) -> tuple[dict[int, int], int]:
        """Active NVLinks of one GPU: counted per peer GPU index, and to NVSwitches."""
        peers: dict[int, int] = {}
        to_switches = 0
        name = "nvmlDeviceGetNvLinkState"
        for link in range(self.q.const("NVML_NVLINK_MAX_LINKS")):
            # NotSupported, or InvalidArgument past the card's last link: no more links.
            active = self.q.quiet(gpu, name, link)
            if active is None:
                break
            if not active:
                continue
            kind = self.q(gpu, "nvlink_remote_type", "nvmlDeviceGetNvLinkRemoteDeviceType", link)
            if kind is not None and int(kind) == self.q.const("NVML_NVLINK_DEVICE_TYPE_SWITCH"):
                to_switches += 1
                continue
            info = self.q(gpu, "nvlink_remote", "nvmlDeviceGetNvLinkRemotePciInfo", link)
            remote = by_bus.get(normalize_bus_id(text(getattr(info, "busId", None))))
            if remote is not None and remote != gpu.index:
                peers[remote] = peers.get(remote, 0) + 1
        return peers, to_switches

    def _link(self, a: Device, b: Device, nvlinks: dict[tuple[int, int], int]) -> GpuLink:
        link = GpuLink(gpu_a=a.index, gpu_b=b.index)
        if a.lost or b.lost:
            return link
        link.nvlink_count = nvlinks.get((min(a.index, b.index), max(a.index, b.index)), 0)
        try:
            level = self.q(a, "topology_level", "nvmlDeviceGetTopologyCommonAncestor", b.handle)
            read = self.q(
                a,
                "p2p_read",
                "nvmlDeviceGetP2PStatus",
                b.handle,
                self.q.const("NVML_P2P_CAPS_INDEX_READ"),
            )
            write = self.q(
                a,
                "p2p_write",
                "nvmlDeviceGetP2PStatus",
                b.handle,
                self.q.const("NVML_P2P_CAPS_INDEX_WRITE"),
            )
        except GpuLost as err:
            # Either end may be the one that fell off; the next read will tell.
            self._mark_lost(a, str(err))
            return link
        if link.nvlink_count:
            link.level = f"NV{link.nvlink_count}"
        elif level is not None:
            link.level = _TOPOLOGY_LEVELS.get(int(level))
        link.p2p_read = None if read is None else int(read) == self.q.const("NVML_P2P_STATUS_OK")
        link.p2p_write = None if write is None else int(write) == self.q.const("NVML_P2P_STATUS_OK")
        return link

    def _placement(self, gpu: Device) -> GpuPlacement:
        place = GpuPlacement(index=gpu.index)
        if gpu.lost:
            return place
        # The kernel's list of the CPUs near the device is what NVML reports
        # too, and nvmlDeviceGetCpuAffinity is a slow driver call.
        cpus = self._sysfs_local_cpus(gpu.pci_bus_id)
        try:
            node = self.q(gpu, "numa_node", "nvmlDeviceGetNumaNodeId")
            if cpus is None:
                words = self.q(
                    gpu,
                    "cpu_affinity",
                    "nvmlDeviceGetCpuAffinity",
                    math.ceil((os.cpu_count() or 1) / 64),
                )
                cpus = None if words is None else _mask_cpus(list(words))
        except GpuLost as err:
            self._mark_lost(gpu, str(err))
            return place
        if node is None:
            node = self._sysfs_numa_node(gpu.pci_bus_id)
        place.numa_node = None if node is None or int(node) < 0 else int(node)
        if cpus:
            place.cpu_affinity = cpus_to_ranges(cpus)
            if place.numa_node is None:
                # As nvidia-smi's "NUMA Affinity": the one node whose CPUs the GPU is close to.
                place.numa_node = self._node_of_cpus(cpus)
        return place

    def _sysfs_local_cpus(self, bus_id: str | None) -> set[int] | None:
        bus = normalize_bus_id(bus_id)
        if bus is None:
            return None
        try:
            with open(os.path.join(self._sysfs_pci_root, bus, "local_cpulist")) as f:
                return parse_cpu_list(f.read()) or None
        except (OSError, ValueError):
            return None

    def _node_of_cpus(self, cpus: set[int]) -> int | None:
        """The NUMA node holding every CPU of an affinity mask, if exactly one does."""
        if not cpus:
            return None
        nodes = []
        try:
            entries = os.listdir(self._sysfs_node_root)
        except OSError:
            return None
        for entry in entries:
            if not (entry.startswith("node") and entry[4:].isdigit()):
                continue
            try:
                with open(os.path.join(self._sysfs_node_root, entry, "cpulist")) as f:
                    node_cpus = parse_cpu_list(f.read())
            except (OSError, ValueError):
                continue
            if cpus & node_cpus:
                nodes.append(int(entry[4:]))
        return nodes[0] if len(nodes) == 1 else None

    def _sysfs_numa_node(self, bus_id: str | None) -> int | None:
        """Older drivers lack nvmlDeviceGetNumaNodeId; the kernel knows too."""
        bus = normalize_bus_id(bus_id)
        if bus is None:
            return None
        try:
            with open(os.path.join(self._sysfs_pci_root, bus, "numa_node")) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None
