"""Text for the dashboard's widgets, built from the telemetry model.

Pure functions from samples to Rich ``Text``: no widgets here, so they are
cheap to test and the widgets only compare the result with what they show
and repaint when it changed. The graphs are block characters drawn from the
ring buffers (a plotext figure costs ~45 ms of CPU per redraw; these cost a
fraction of a millisecond).
"""

from __future__ import annotations

import bisect
import functools

from rich.text import Text

from gpustation.telemetry import format as fmt
from gpustation.telemetry import health
from gpustation.telemetry.alerts import topology_findings
from gpustation.telemetry.model import GpuSample, HostSample, Snapshot
from gpustation.telemetry.rings import METRICS, History, bucket
from gpustation.textsafe import safe

BLOCKS = " ▁▂▃▄▅▆▇█"
EIGHTHS = " ▏▎▍▌▋▊▉█"


def pct_style(pct: float | None) -> str:
    if pct is None:
        return "dim"
    if pct >= 95:
        return "red"
    if pct >= 80:
        return "yellow"
    return "green"


def bar(frac: float | None, width: int, style: str) -> Text:
    """A horizontal bar ``width`` cells wide, in eighths of a cell."""
    if width <= 0:
        return Text()
    if frac is None:
        return Text("·" * width, style="dim")
    frac = max(0.0, min(1.0, frac))
    eighths = round(frac * width * 8)
    full, part = divmod(eighths, 8)
    filled = "█" * full + (EIGHTHS[part] if part and full < width else "")
    return Text.assemble((filled, style), ("·" * (width - len(filled)), "bright_black"))


def fraction(cur: float | None, top: float | None) -> float | None:
    if cur is None or not top:
        return None
    return cur / top


def pcie_text(gpu: GpuSample, arrows: bool = True) -> Text:
    p = gpu.pcie
    out = Text(fmt.pcie_link(p.gen, p.width))
    if p.max_gen is not None or p.max_width is not None:
        out.append(f" of {fmt.pcie_link(p.max_gen, p.max_width)}", style="dim")
    if health.slow_link_under_load(gpu):
        out.stylize("bold yellow")
    if arrows:
        out.append(f"  rx {fmt.kib_rate(p.rx_kib_s)} tx {fmt.kib_rate(p.tx_kib_s)}")
    return out


def unowned_text(snap: Snapshot, command_width: int = 60) -> Text:
    """A line per GPU whose VRAM is largely held by no listed process, naming the
    processes that hold its device node open (empty when there is none)."""
    out = Text()
    for gpu in snap.gpus:
        if gpu.lost or not health.unowned_worth_noting(gpu):
            continue
        held = fmt.mib_words(gpu.unowned_memory_mib)
        line = f"GPU {gpu.index}: {held} of VRAM held by no listed process"
        holders = gpu.device_holders or []
        if holders:
            who = ", ".join(
                f"PID {p.pid} {_cut(p.command or p.name or fmt.NA, command_width)}" for p in holders
            )
            line += f" (holders: {who})"
        if out:
            out.append("\n")
        out.append(safe(line), style="yellow")
    return out


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


@functools.cache
def _row_tables(height: int) -> tuple[tuple[str, ...], ...]:
    """Per graph row (top first), the character for each level -1..8*height.

    Level -1 is a missing value (a dot on the bottom row); on the bottom row a
    zero still draws a thin baseline, since an empty graph reads as "no data".
    """
    tables = []
    for r in range(height - 1, -1, -1):
        base = r * 8
        floor = 1 if r == 0 else 0
        row = ["·" if r == 0 else " "]
        row.extend(BLOCKS[max(floor, min(8, lv - base))] for lv in range(height * 8 + 1))
        tables.append(tuple(row))
    return tuple(tables)


def graph_rows(values: list[float | None], top: float, width: int, height: int) -> list[str]:
    """Block-character columns, ``height`` rows, newest on the right."""
    cols = bucket(values, width)
    pad = " " * (width - len(cols))
    top_level = height * 8
    k = top_level / top if top > 0 else 0.0
    # index into the row tables: 0 is "missing", 1 + level otherwise
    idx = [
        0 if v is None else 1 + (top_level if v >= top else max(0, int(v * k + 0.5))) for v in cols
    ]
    return [pad + "".join(map(table.__getitem__, idx)) for table in _row_tables(height)]


METRIC_STYLE = {
    "util": "green",
    "power": "yellow",
    "temp": "red",
    "sm_clock": "blue",
    "vram": "magenta",
}


def history_text(
    history: History,
    gpus: list[int],
    metric: str,
    width: int,
    rows_per_gpu: int,
    window_s: float,
) -> Text:
    """One labelled graph per GPU of the chosen metric over ``window_s``."""
    m = METRICS[metric]
    out = Text()
    style = METRIC_STYLE.get(metric, "green")
    graph_w = max(8, width)
    for n, index in enumerate(gpus):
        values = history.window(index, metric, window_s)
        scale = history.scale(index, metric) or max((v for v in values if v), default=1.0)
        last = values[-1] if values else None
        if n:
            out.append("\n")
        label = f"GPU {index} {m.label} {fmt.num(last, m.digits)} {m.unit}"
        right = f"scale {fmt.num(scale)} {m.unit}"
        out.append(label, style="bold")
        out.append(" " * max(1, graph_w - len(label) - len(right)) + right, style="dim")
        for row in graph_rows(values, scale, graph_w, rows_per_gpu):
            out.append("\n")
            out.append(row, style=style)
    if gpus:
        # One time axis under the graphs: every GPU is sampled in the same pass.
        out.append("\n")
        out.append(time_axis(history.window_times(gpus[0], window_s), graph_w), style="dim")
    return out


#: steps between the time axis's ticks, in seconds: the shortest that fits is used
AXIS_STEPS_S = (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400)
#: blank cells beside each tick's label at least
AXIS_GAP = 8


def ago(seconds: float) -> str:
    """``-30s``, ``-5m``, ``-2h``, ``-1h30m``: a tick's label."""
    s = round(seconds)
    if s < 60:
        return f"-{s}s"
    if s < 3600:
        return f"-{s // 60}m" + (f"{s % 60}s" if s % 60 else "")
    return f"-{s // 3600}h" + (f"{s % 3600 // 60}m" if s % 3600 // 60 else "")


def _ticks_fit(step: float, span: float, width: int) -> bool:
    """Whether ticks every ``step`` seconds over ``span`` have room on ``width`` cells."""
    count = int(span // step)
    longest = max((len(ago(k * step)) for k in range(1, count + 1)), default=0)
    return count * (longest + AXIS_GAP) <= width


def time_axis(times: list[float], width: int) -> str:
    """The line under a graph drawn from samples at ``times``: how long ago each tick was.

    The columns are the graph's (:func:`graph_rows`: right-aligned, a column the
    mean of its samples); each tick's label is centred on the column whose
    time is nearest, so a pause in the sampling shows as ticks closer together.
    """
    if width <= 0:
        return ""
    line = [" "] * width
    now_label = "now"
    if width >= len(now_label):
        line[width - len(now_label) :] = now_label
    cols = [t for t in bucket(list(times), width) if t is not None]
    if len(cols) < 2:
        return "".join(line)
    pad = width - len(cols)
    newest = times[-1]
    span = newest - times[0]
    step = next((s for s in AXIS_STEPS_S if _ticks_fit(s, span, width)), AXIS_STEPS_S[-1])
    free_until = width - len(now_label) - 1  # labels end before this cell
    k = 1
    while k * step <= span + 1e-6:
        target = newest - k * step
        at = bisect.bisect_left(cols, target)
        if at > 0 and (at == len(cols) or target - cols[at - 1] < cols[at] - target):
            at -= 1
        label = ago(k * step)
        start = max(0, min(width - len(label), pad + at - len(label) // 2))
        if start + len(label) <= free_until:
            line[start : start + len(label)] = label
            free_until = start - 1
        k += 1
    # The oldest column says its age where no tick is near it (after a pause in
    # the sampling, or a span that is no multiple of the step).
    unit = 1 if span < 60 else 10 if span < 600 else 60
    oldest = ago(round(span / unit) * unit)
    if pad + len(oldest) <= free_until:
        line[pad : pad + len(oldest)] = oldest
    return "".join(line)


def host_text(host: HostSample, hostname: str, width: int) -> Text:
    """CPU total and per core, load, RAM/swap, disk and network."""
    t = Text()
    t.append(f"{hostname}\n", style="bold")
    barw = max(6, min(20, width - 22))
    t.append("CPU  ")
    t.append_text(bar(None if host.cpu_pct is None else host.cpu_pct / 100, barw, "green"))
    t.append(f" {fmt.num(host.cpu_pct, unit=' %')}")
    if host.load_avg:
        t.append("\nload " + " ".join(f"{x:.2f}" for x in host.load_avg))
    cores = host.cpu_per_core_pct
    if cores:
        t.append("\ncores ", style="dim")
        line_w = max(8, width - 6)
        for n, pct in enumerate(cores):
            if n and n % line_w == 0:
                t.append("\n      ")
            t.append(BLOCKS[max(1, min(8, round(pct / 100 * 8)))], style=pct_style(pct))
    t.append("\nRAM  ")
    used, total = host.memory_used_mib, host.memory_total_mib
    t.append_text(bar(fraction(used, total), barw, "magenta"))
    t.append(f" {fmt.mib(used)}/{fmt.mib(total)}")
    t.append(f"\nswap {fmt.mib(host.swap_used_mib)}/{fmt.mib(host.swap_total_mib)}")
    t.append(f"\ndisk r {fmt.rate(host.disk_read_bytes_s)} w {fmt.rate(host.disk_write_bytes_s)}")
    t.append(f"\nnet  rx {fmt.rate(host.net_rx_bytes_s)} tx {fmt.rate(host.net_tx_bytes_s)}")
    return t


LEVEL_WORDS = {
    "X": "self",
    "SYS": "across the CPU interconnect between NUMA nodes (SYS)",
    "NODE": "across PCIe host bridges within a NUMA node (NODE)",
    "PHB": "through a PCIe host bridge (PHB)",
    "PXB": "through several PCIe bridges (PXB)",
    "PIX": "through one PCIe bridge (PIX)",
}


def topology_text(snapshot: Snapshot) -> Text:
    """The GPU matrix as ``nvidia-smi topo -m`` shows it, then P2P, NUMA and PCIe."""
    topo = snapshot.topology
    gpus = [g.index for g in snapshot.gpus]
    t = Text()
    t.append("GPU interconnect\n", style="bold underline")
    head = "      " + "".join(f"{'GPU' + str(i):>7}" for i in gpus)
    t.append(head + "   CPU affinity    NUMA\n", style="bold")
    placements = {p.index: p for p in topo.gpus}
    for a in gpus:
        t.append(f"GPU{a:<3}", style="bold")
        for b in gpus:
            if a == b:
                t.append(f"{'X':>7}", style="dim")
                continue
            link = topo.link(a, b)
            level = (link.level if link else None) or "?"
            style = "bold red" if level == "SYS" else "green" if level.startswith("NV") else ""
            t.append(f"{level:>7}", style=style)
        p = placements.get(a)
        aff = (p.cpu_affinity if p else None) or fmt.NA
        numa = fmt.num(p.numa_node) if p else fmt.NA
        t.append(f"   {aff:<15} {numa}\n")
    t.append("\nPeer-to-peer (read/write) and NVLink\n", style="bold underline")
    cells: dict[tuple[int, int], tuple[str, str]] = {}
    for a in gpus:
        for b in gpus:
            link = topo.link(a, b)
            if a == b:
                cells[a, b] = ("X", "dim")
            elif link is None:
                cells[a, b] = (fmt.NA, "dim")
            else:
                rw = "".join(
                    "?" if v is None else ("R" if k == "r" else "W") if v else "-"
                    for k, v in (("r", link.p2p_read), ("w", link.p2p_write))
                )
                cell = rw + (f" NV{link.nvlink_count}" if link.nvlink_count else "")
                cells[a, b] = (cell, "green" if "-" not in rw else "yellow")
    width = max([7] + [len(c) + 2 for c, _ in cells.values()])
    t.append("      " + "".join(f"{'GPU' + str(i):>{width}}" for i in gpus) + "\n", style="bold")
    for a in gpus:
        t.append(f"GPU{a:<3}", style="bold")
        for b in gpus:
            cell, style = cells[a, b]
            t.append(f"{cell:>{width}}", style=style)
        t.append("\n")
    t.append("\nPCIe links (current of maximum)\n", style="bold underline")
    for gpu in snapshot.gpus:
        link_info = gpu.pcie
        t.append(f"GPU{gpu.index:<3}", style="bold")
        t.append(f"{gpu.pci_bus_id or fmt.NA:<18} ")
        t.append_text(pcie_text(gpu, arrows=False))
        if link_info.below_max:
            t.append("  below maximum", style="bold yellow")
        rx, tx = fmt.kib_rate(link_info.rx_kib_s), fmt.kib_rate(link_info.tx_kib_s)
        t.append(f"  rx {rx} tx {tx}\n")
    t.append("\nLegend: ", style="bold")
    t.append(
        "X self; SYS across the CPU interconnect (QPI/UPI) between NUMA nodes; NODE across "
        "host bridges in one NUMA node; PHB through a host bridge; PXB several PCIe bridges; "
        "PIX one PCIe bridge; NV# that many NVLinks. R/W peer read/write supported.\n",
        style="dim",
    )
    findings = topology_findings(snapshot)
    t.append("\nFindings\n", style="bold underline")
    if not findings:
        t.append(
            "Every link runs at its maximum and every pair of GPUs can reach each other "
            "without crossing sockets.\n",
            style="green",
        )
    for line in findings:
        t.append(f"• {line}\n", style="yellow")
    return t
