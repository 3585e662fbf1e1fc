"""Rich rendering of a Snapshot for ``gpustation snapshot`` (works with no TTY)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpustation.telemetry import format as fmt
from gpustation.telemetry.model import LIMITING_REASONS, GpuSample, Snapshot


def _temp_style(gpu: GpuSample) -> str:
    margin = gpu.slowdown_margin_c
    if margin is None:
        return ""
    if margin <= 5:
        return "bold red"
    if margin <= 15:
        return "yellow"
    return "green"


def _throttle_text(gpu: GpuSample) -> Text:
    text = fmt.throttle(gpu.throttle_reasons)
    limiting = bool(LIMITING_REASONS.intersection(gpu.throttle_reasons or ()))
    return Text(text, style="bold red" if limiting else "dim")


def gpu_table(snap: Snapshot) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold", expand=False)
    for column, justify in (
        ("GPU", "left"),
        ("Temp °C", "right"),
        ("Power W", "right"),
        ("SM MHz", "right"),
        ("Mem MHz", "right"),
        ("VRAM", "right"),
        ("Util %", "right"),
        ("Fans %", "right"),
        ("P", "right"),
        ("PCIe", "left"),
        ("Throttle", "left"),
    ):
        table.add_column(column, justify=justify, no_wrap=column != "Throttle")  # type: ignore[arg-type]
    for g in snap.gpus:
        name = f"{g.index} {g.name or fmt.NA}"
        if g.lost:
            table.add_row(name, Text("GPU LOST (fell off the bus)", style="bold red"))
            continue
        pcie = g.pcie
        link = (
            f"{fmt.pcie_link(pcie.gen, pcie.width)}/{fmt.pcie_link(pcie.max_gen, pcie.max_width)}"
        )
        table.add_row(
            name,
            Text(fmt.pair(g.temperature_c, g.temperature_slowdown_c), style=_temp_style(g)),
            fmt.pair(g.power_w, g.power_limit_w),
            fmt.pair(g.clock_sm_mhz, g.clock_sm_max_mhz),
            fmt.pair(g.clock_mem_mhz, g.clock_mem_max_mhz),
            f"{fmt.mib(g.memory_used_mib)}/{fmt.mib(g.memory_total_mib)}",
            f"{fmt.num(g.utilization_gpu_pct)}/{fmt.num(g.utilization_memory_pct)}",
            ",".join(fmt.num(f) for f in g.fans_pct) if g.fans_pct else "no fans",
            fmt.pstate(g.pstate),
            Text(
                link, style="yellow" if pcie.below_max and (g.utilization_gpu_pct or 0) > 0 else ""
            ),
            _throttle_text(g),
        )
    return table


def host_line(snap: Snapshot) -> Text:
    h = snap.host
    load = " ".join(f"{x:.2f}" for x in h.load_avg) if h.load_avg else fmt.NA
    return Text(
        f"host {snap.hostname}: CPU {fmt.num(h.cpu_pct, 0, '%')} ({len(h.cpu_per_core_pct)} cores)"
        f"  load {load}"
        f"  RAM {fmt.mib(h.memory_used_mib)}/{fmt.mib(h.memory_total_mib)}"
        f"  swap {fmt.mib(h.swap_used_mib)}/{fmt.mib(h.swap_total_mib)}"
        f"  disk r {fmt.rate(h.disk_read_bytes_s)} w {fmt.rate(h.disk_write_bytes_s)}"
        f"  net rx {fmt.rate(h.net_rx_bytes_s)} tx {fmt.rate(h.net_tx_bytes_s)}"
    )


def process_table(snap: Snapshot) -> Table | None:
    rows = [(g.index, p) for g in snap.gpus for p in g.processes]
    if not rows:
        return None
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("GPU", justify="right")
    table.add_column("PID", justify="right")
    table.add_column("User")
    table.add_column("VRAM", justify="right")
    table.add_column("Command", overflow="ellipsis", no_wrap=True, max_width=80)
    for index, p in sorted(rows, key=lambda r: (r[0], -(r[1].gpu_memory_mib or 0))):
        table.add_row(
            str(index),
            str(p.pid),
            p.user or fmt.NA,
            fmt.mib(p.gpu_memory_mib),
            p.command or p.name or fmt.NA,
        )
    return table


def header(snap: Snapshot) -> Text:
    import time

    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.time))
    text = Text()
    if snap.simulated:
        text.append(" SIMULATED ", style="bold black on yellow")
        text.append(" ")
    text.append(f"{snap.hostname}  {when}  driver {snap.driver_version or fmt.NA}", style="bold")
    if snap.cuda_driver_version:
        text.append(f"  CUDA {snap.cuda_driver_version}")
    if snap.note:
        text.append(f"\n{snap.note}", style="yellow")
    return text


def render_snapshot(snap: Snapshot) -> RenderableType:
    parts: list[RenderableType] = [header(snap), gpu_table(snap), host_line(snap)]
    procs = process_table(snap)
    if procs is not None:
        parts.append(procs)
    elif snap.gpus:
        parts.append(Text("no GPU processes", style="dim"))
    return Group(*parts)
