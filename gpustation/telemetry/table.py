"""Plain-text rendering of a Snapshot for ``gpustation snapshot``.

Deliberately free of rich and of any terminal library: a one-shot snapshot
should cost the time of reading the GPUs, not of importing a renderer. Colour
(ANSI) is used only when asked for — the command asks when stdout is a
terminal and ``NO_COLOR`` is unset — so pipes, ssh and cron get clean text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from gpustation import timefmt
from gpustation.telemetry import format as fmt
from gpustation.telemetry import health
from gpustation.telemetry.model import GpuSample, ProcessInfo, Snapshot, specs
from gpustation.textsafe import safe

Cell = tuple[str, str]  # (text, style name)

_ANSI = {
    "": "",
    "bold": "\x1b[1m",
    "dim": "\x1b[2m",
    "red": "\x1b[1;31m",
    "yellow": "\x1b[33m",
    "green": "\x1b[32m",
    "banner": "\x1b[1;30;43m",
}
_RESET = "\x1b[0m"


def _paint(text: str, style: str, color: bool) -> str:
    if not color or not style:
        return text
    return f"{_ANSI[style]}{text}{_RESET}"


def _table(header: list[str], rows: list[list[Cell]], right: set[int], color: bool) -> list[str]:
    """Align cells in columns two spaces apart; ``right`` holds right-aligned columns.

    Every cell is made safe for the terminal first (rule 8): a GPU name or a
    command line may come from another host or another user.
    """
    rows = [[(safe(text), style) for text, style in row] for row in rows]
    widths = [len(h) for h in header]
    for row in rows:
        for i, (text, _) in enumerate(row):
            widths[i] = max(widths[i], len(text))

    def line(cells: list[Cell]) -> str:
        out = []
        for i, (text, style) in enumerate(cells):
            pad = widths[i] - len(text)
            padded = " " * pad + text if i in right else text + " " * pad
            out.append(_paint(padded, style, color))
        return "  ".join(out).rstrip()

    lines = [line([(h, "bold") for h in header])]
    lines += [line(row) for row in rows]
    return lines


_TEMPERATURE_STYLES = {health.CRITICAL: "red", health.HOT: "yellow"}


def temperature_style(gpu: GpuSample) -> str:
    """Colour by the health rules' temperature band."""
    band = health.temperature_band(gpu)
    return "" if band is None else _TEMPERATURE_STYLES.get(band, "green")


def _link(g: GpuSample) -> Cell:
    pcie = g.pcie
    text = f"{fmt.pcie_link(pcie.gen, pcie.width)}/{fmt.pcie_link(pcie.max_gen, pcie.max_width)}"
    return text, "yellow" if health.slow_link_under_load(g) else ""


def _throttle(g: GpuSample) -> Cell:
    return fmt.throttle(g.throttle_reasons), "red" if health.is_limited(g) else "dim"


class Column(NamedTuple):
    """A column of the GPU table: its header comes from the field's declaration."""

    field: str  # the GpuSample field it shows first (its label and unit head the column)
    cell: Callable[[GpuSample], Cell]
    right: bool = True
    unit_in_header: bool = True

    @property
    def header(self) -> str:
        spec = _SPECS[self.field]
        return f"{spec.label} {spec.unit}" if self.unit_in_header and spec.unit else spec.label


_SPECS = specs(GpuSample)
COLUMNS: tuple[Column, ...] = (
    Column(
        "temperature_c",
        lambda g: (fmt.pair(g.temperature_c, g.temperature_slowdown_c), temperature_style(g)),
    ),
    Column(
        "power_w",
        lambda g: (fmt.pair(g.power_w, g.power_limit_w), "red" if g.power_throttled else ""),
    ),
    Column("clock_sm_mhz", lambda g: (fmt.pair(g.clock_sm_mhz, g.clock_sm_max_mhz), "")),
    Column("clock_mem_mhz", lambda g: (fmt.pair(g.clock_mem_mhz, g.clock_mem_max_mhz), "")),
    Column(
        "memory_used_mib",
        lambda g: (f"{fmt.mib(g.memory_used_mib)}/{fmt.mib(g.memory_total_mib)}", ""),
        unit_in_header=False,
    ),
    Column(
        "utilization_gpu_pct",
        lambda g: (f"{fmt.num(g.utilization_gpu_pct)}/{fmt.num(g.utilization_memory_pct)}", ""),
    ),
    Column(
        "fans_pct",
        lambda g: (",".join(fmt.num(f) for f in g.fans_pct) if g.fans_pct else "no fans", ""),
    ),
    Column("pstate", lambda g: (fmt.pstate(g.pstate), "")),
    Column("pcie", _link, right=False),
    Column("throttle_reasons", _throttle, right=False),
)


def _memory_temperature(g: GpuSample) -> Cell:
    if g.memory_temperature_c is None and g.memory_temperature_max_c is None:
        return ("not reported", "dim")
    band = health.memory_temperature_band(g)
    style = "" if band is None else _TEMPERATURE_STYLES.get(band, "green")
    return (fmt.pair(g.memory_temperature_c, g.memory_temperature_max_c), style)


#: Shown beside the GPU temperature when a card of the machine reports its
#: memory's (HBM); a machine of GDDR cards is spared a column that says nothing.
MEMORY_COLUMN = Column("memory_temperature_c", _memory_temperature)


def columns_for(snap: Snapshot) -> tuple[Column, ...]:
    if any(g.memory_temperature_c is not None for g in snap.gpus):
        return (COLUMNS[0], MEMORY_COLUMN, *COLUMNS[1:])
    return COLUMNS


def _gpu_row(g: GpuSample, columns: tuple[Column, ...] = COLUMNS) -> list[Cell]:
    name: Cell = (f"{g.index} {g.name or fmt.NA}", "")
    if g.lost:
        # The GPU's name, then the news across the columns' place.
        blank: list[Cell] = [("", "")] * (len(columns) - 1)
        return [name, *blank, ("GPU LOST (fell off the bus)", "red")]
    return [name] + [column.cell(g) for column in columns]


def gpu_lines(snap: Snapshot, color: bool = False) -> list[str]:
    columns = columns_for(snap)
    header = ["GPU"] + [column.header for column in columns]
    rows = [_gpu_row(g, columns) for g in snap.gpus]
    right = {i + 1 for i, column in enumerate(columns) if column.right}
    return _table(header, rows, right=right, color=color)


def host_line(snap: Snapshot) -> str:
    h = snap.host
    load = " ".join(f"{x:.2f}" for x in h.load_avg) if h.load_avg else fmt.NA
    cores = len(h.cpu_per_core_pct)
    return (
        f"host {safe(snap.hostname)}: CPU {fmt.num(h.cpu_pct, 0, '%')} ({cores} cores)"
        f"  load {load}"
        f"  RAM {fmt.mib(h.memory_used_mib)}/{fmt.mib(h.memory_total_mib)}"
        f"  swap {fmt.mib(h.swap_used_mib)}/{fmt.mib(h.swap_total_mib)}"
        f"  disk r {fmt.rate(h.disk_read_bytes_s)} w {fmt.rate(h.disk_write_bytes_s)}"
        f"  net rx {fmt.rate(h.net_rx_bytes_s)} tx {fmt.rate(h.net_tx_bytes_s)}"
    )


def process_lines(snap: Snapshot, color: bool = False, command_width: int = 100) -> list[str]:
    found = [(g.index, p) for g in snap.gpus for p in g.processes]
    found.sort(key=lambda r: (r[0], -(r[1].gpu_memory_mib or 0)))
    rows: list[list[Cell]] = []
    for index, p in found:
        command = p.command or p.name or fmt.NA
        if len(command) > command_width:
            command = command[: command_width - 1] + "…"
        rows.append(
            [
                (str(index), ""),
                (str(p.pid), ""),
                (p.user or fmt.NA, ""),
                (fmt.mib(p.gpu_memory_mib), ""),
                (fmt.num(p.sm_pct), ""),
                (fmt.num(p.power_w, 0, " W"), ""),
                (p.container or "-", ""),
                (command, ""),
            ]
        )
    header = ["GPU", "PID", "User", "VRAM", "SM %", "Power", "Container", "Command"]
    return _table(header, rows, right={0, 1, 3, 4, 5}, color=color)


def container_lines(snap: Snapshot, color: bool = False) -> list[str]:
    """The GPU processes summed per GPU and container (``snapshot --group container``).

    Processes in no container, unit or job are summed as ``-``; a sum is n/a
    when one of its processes' figures is.
    """
    groups: dict[tuple[int, str], list[ProcessInfo]] = {}
    for g in snap.gpus:
        for p in g.processes:
            groups.setdefault((g.index, p.container or "-"), []).append(p)
    rows: list[list[Cell]] = []
    for (index, name), procs in sorted(groups.items()):
        rows.append(
            [
                (str(index), ""),
                (name, ""),
                (str(len(procs)), ""),
                (fmt.mib(_sum(p.gpu_memory_mib for p in procs)), ""),
                (fmt.num(_sum(p.power_w for p in procs), 0, " W"), ""),
            ]
        )
    header = ["GPU", "Container", "Processes", "VRAM", "Power"]
    return _table(header, rows, right={0, 2, 3, 4}, color=color)


def _sum(values: Iterable[float | None]) -> float | None:
    total = 0.0
    for value in values:
        if value is None:
            return None
        total += value
    return total


def health_lines(snap: Snapshot, color: bool = False, command_width: int = 60) -> list[str]:
    """A line each for what needs a look: the last XID, a pending or failed row
    remap, VRAM no listed process holds, processes holding a GPU's device node
    open without being in NVML's list, and each MIG device."""
    lines: list[str] = []
    for g in snap.gpus:
        if g.lost:
            continue
        if g.xid_events:
            last = g.xid_events[-1]
            when = timefmt.clock(last.time)
            more = f" ({len(g.xid_events)} seen)" if len(g.xid_events) > 1 else ""
            text = (
                f"GPU {g.index}: XID {last.code} at {when}: {last.meaning or 'unknown XID'}{more}"
            )
            lines.append(_paint(safe(text), "red", color))
        rows = g.remapped_rows
        if rows.failure:
            text = f"GPU {g.index}: a memory row remap failed: the card needs service"
            lines.append(_paint(text, "red", color))
        elif rows.pending:
            text = f"GPU {g.index}: a memory row remap is pending: reset the GPU when it is idle"
            lines.append(_paint(text, "yellow", color))
        if g.mig is not None and g.mig.enabled:
            for inst in g.mig.instances:
                procs = len(inst.processes)
                text = (
                    f"GPU {g.index} MIG {inst.index} {inst.profile or fmt.NA}"
                    f" (GI {fmt.num(inst.gpu_instance_id)}):"
                    f" VRAM {fmt.mib(inst.memory_used_mib)}/{fmt.mib(inst.memory_total_mib)},"
                    f" {procs} process{'es' if procs != 1 else ''}"
                )
                lines.append(safe(text))
        holders = g.device_holders or []
        unowned = g.unowned_memory_mib
        if holders or health.unowned_worth_noting(g):
            text = f"GPU {g.index}: {fmt.mib(unowned)} of VRAM held by no listed process"
            if holders:
                who = ", ".join(
                    f"{p.pid} ({(p.command or p.name or fmt.NA)[:command_width]})" for p in holders
                )
                node = (
                    f"/dev/nvidia{g.minor_number}" if g.minor_number is not None else "its device"
                )
                text += f"; {node} is also held open by {who}"
            lines.append(_paint(safe(text), "yellow", color))
    return lines


def header_line(snap: Snapshot, color: bool = False) -> str:
    when = timefmt.full(snap.time)
    text = safe(f"{snap.hostname}  {when}  driver {snap.driver_version or fmt.NA}")
    if snap.compute_runtime_version:
        text += safe(f"  {snap.compute_runtime_version}")
    text = _paint(text, "bold", color)
    if snap.simulated:
        text = _paint(" SIMULATED ", "banner", color) + " " + text
    return text


def render_snapshot(snap: Snapshot, color: bool = False, group: str | None = None) -> str:
    """The whole snapshot as text: header, GPU table, host line, processes
    (``group="container"``: summed per container)."""
    lines = [header_line(snap, color)]
    if snap.note:
        lines.append(_paint(safe(snap.note), "yellow", color))
    lines += gpu_lines(snap, color)
    lines += health_lines(snap, color)
    lines.append(host_line(snap))
    if any(g.processes for g in snap.gpus):
        lines += (
            container_lines(snap, color) if group == "container" else process_lines(snap, color)
        )
    elif snap.gpus:
        lines.append(_paint("no GPU processes", "dim", color))
    return "\n".join(lines)
