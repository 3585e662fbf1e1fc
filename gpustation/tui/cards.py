"""A GPU's card on the dashboard: the full card and the compact two lines.

Pure functions from a sample to Rich ``Text``, as :mod:`gpustation.tui.render`'s.
Each line is fitted to the card's width: what matters most (temperatures,
power, throttle reasons, GPM activity) keeps its place, and what moves
least (the memory clock, the PCIe link, the bars' length) gives way.
"""

from __future__ import annotations

from rich.text import Text

from gpustation.telemetry import format as fmt
from gpustation.telemetry import health
from gpustation.telemetry.health import short_name
from gpustation.telemetry.model import THERMAL_REASONS, GpuSample
from gpustation.tui.render import bar, fraction, pcie_text, pct_style

_TEMP_STYLES = {
    health.CRITICAL: "bold white on red",
    health.HOT: "bold yellow",
    health.WARM: "green",
    health.COOL: "cyan",
}


def temp_style(gpu: GpuSample) -> str:
    """Colour by the health rules' temperature band."""
    band = health.temperature_band(gpu)
    if band is None:
        return "bold" if gpu.temperature_c is not None else "dim"
    return _TEMP_STYLES[band]


def memory_temperature_text(gpu: GpuSample) -> Text:
    """``  Mem 41 C (max 95)`` coloured by its distance to the memory maximum;
    nothing on a card without a memory sensor (the alert log says so once)."""
    if gpu.memory_temperature_c is None:
        return Text()
    band = health.memory_temperature_band(gpu)
    t = Text("  Mem ")
    t.append(f"{fmt.num(gpu.memory_temperature_c)} C", style=_TEMP_STYLES.get(band or "", "bold"))
    if gpu.memory_temperature_max_c is not None:
        t.append(f" (max {gpu.memory_temperature_max_c:.0f})", style="dim")
    return t


def throttle_text(gpu: GpuSample, short: bool = False) -> Text:
    """Throttle reasons in words; thermal and power cap stand out in colour.

    ``short``: the reasons alone, without "throttling" after each (their colour
    says it), and one word for the two thermal ones: ``thermal (SW, HW)``.
    """
    reasons = gpu.throttle_reasons
    if reasons is None:
        return Text(fmt.NA, style="dim")
    limiting = [r for r in reasons if r != "gpu_idle"]
    if not limiting:
        return Text("idle" if reasons else "none", style="dim")
    words = [(r, fmt.THROTTLE_WORDS.get(r, r)) for r in limiting]
    if short and set(limiting) >= THERMAL_REASONS:
        at = min(limiting.index(r) for r in THERMAL_REASONS)
        words = [w for w in words if w[0] not in THERMAL_REASONS]
        words.insert(at, ("sw_thermal", "thermal (SW, HW)"))
    out = Text()
    suffix = "" if short else " throttling"
    for n, (reason, word) in enumerate(words):
        if n:
            out.append(", ")
        if reason in ("sw_thermal", "hw_thermal", "hw_slowdown"):
            out.append(f"{word}{suffix}", style="bold white on red")
        elif reason in ("sw_power_cap", "hw_power_brake"):
            out.append(f"{word}{suffix}", style="bold black on yellow")
        else:
            out.append(word, style="yellow")
    return out


def throttled(gpu: GpuSample) -> bool:
    """Whether the card reports a reason other than being idle."""
    return any(r != "gpu_idle" for r in gpu.throttle_reasons or ())


def fans_text(gpu: GpuSample) -> str:
    if not gpu.fans_pct:
        return "no fans"
    manual = any(c == "manual" for c in gpu.fan_control)
    return " ".join(f"{f:.0f}" for f in gpu.fans_pct) + " %" + (" manual" if manual else "")


def card_text(gpu: GpuSample, width: int, focused: bool = False) -> Text:
    """The full card: seven lines; focus adds the default and range of the power limit."""
    title = Text.assemble((f"GPU {gpu.index} ", "bold"), (short_name(gpu.name), "bold cyan"))
    if gpu.lost:
        title.append("  LOST: the driver no longer answers for this GPU", style="bold white on red")
        return title
    title.append(f"  {fmt.pstate(gpu.pstate)}", style="dim")
    title.append(
        f"  enc {fmt.num(gpu.encoder_utilization_pct, unit=' %')}"
        f" dec {fmt.num(gpu.decoder_utilization_pct, unit=' %')}",
        style="dim",
    )
    gpm = gpu.sm_active_pct is not None or gpu.tensor_active_pct is not None
    barw, mem_clock = _card_bars(gpu, width, focused, gpm)
    t = Text()
    t.append_text(title)
    t.append("\nTemp  ")
    t.append(f"{fmt.num(gpu.temperature_c)} C", style=temp_style(gpu))
    if gpu.temperature_slowdown_c is not None:
        t.append(f" (slowdown {gpu.temperature_slowdown_c:.0f} C)", style="dim")
    t.append_text(memory_temperature_text(gpu))
    t.append("  Fans ")
    t.append(fans_text(gpu), style="dim" if not gpu.fans_pct else "")
    t.append("\nPower ")
    t.append_text(bar(fraction(gpu.power_w, gpu.power_limit_w), barw, pct_style(gpu.power_pct)))
    t.append(f" {fmt.pair(gpu.power_w, gpu.power_limit_w, ' W')}")
    if focused:
        # On focus the power range joins the line (no extra row, no relayout).
        t.append(
            f"  default {fmt.num(gpu.power_default_w)},"
            f" {fmt.num(gpu.power_min_w)}-{fmt.num(gpu.power_max_w, unit=' W')}",
            style="italic",
        )
    t.append("\nSM    ")
    t.append_text(bar(fraction(gpu.clock_sm_mhz, gpu.clock_sm_max_mhz), barw, "blue"))
    t.append(f" {fmt.pair(gpu.clock_sm_mhz, gpu.clock_sm_max_mhz, ' MHz')}")
    if mem_clock:
        t.append(f"  mem {fmt.pair(gpu.clock_mem_mhz, gpu.clock_mem_max_mhz, ' MHz')}", style="dim")
    if gpm:
        # GPM: what the SMs really do (only where the card has it and it is read).
        t.append(
            f"  active {fmt.num(gpu.sm_active_pct, unit=' %')}"
            f" tensor {fmt.num(gpu.tensor_active_pct, unit=' %')}"
            f" dram {fmt.num(gpu.dram_active_pct, unit=' %')}",
            style="green",
        )
    t.append("\nVRAM  ")
    t.append_text(
        bar(fraction(gpu.memory_used_mib, gpu.memory_total_mib), barw, pct_style(gpu.memory_pct))
    )
    t.append(f" {fmt.mib(gpu.memory_used_mib)}/{fmt.mib(gpu.memory_total_mib)}")
    t.append(
        f"  util {fmt.num(gpu.utilization_gpu_pct, unit=' %')}"
        f" mem {fmt.num(gpu.utilization_memory_pct, unit=' %')}"
    )
    t.append("\nPCIe  ")
    t.append_text(pcie_text(gpu))
    t.append("\nThrottle ")
    words = throttle_text(gpu)
    if len("Throttle ") + words.cell_len > width:
        words = throttle_text(gpu, short=True)
    t.append_text(words)
    t.append_text(health_text(gpu))
    if gpu.limit_drift:
        t.append("  limit drifted: profile apply --again", style="bold black on yellow")
    t.append_text(mig_text(gpu))
    return t


#: the widest GPM text of a card's SM line
GPM_W = len("  active 100 % tensor 100 % dram 100 %")


def _card_bars(gpu: GpuSample, width: int, focused: bool, gpm: bool) -> tuple[int, bool]:
    """The bars' width on a full card and whether its SM line has room for the memory clock.

    The figures after the bars are measured at their widest for this card (so a
    bar keeps its width from sample to sample): the bars give way first, down
    to 6 cells, then the memory clock (it seldom moves), so the GPM figures show.
    """
    power = len(f" {fmt.pair(gpu.power_limit_w, gpu.power_limit_w, ' W')}")
    if focused:
        power += len(
            f"  default {fmt.num(gpu.power_default_w)},"
            f" {fmt.num(gpu.power_min_w)}-{fmt.num(gpu.power_max_w, unit=' W')}"
        )
    sm = len(f" {fmt.pair(gpu.clock_sm_max_mhz, gpu.clock_sm_max_mhz, ' MHz')}")
    sm += GPM_W if gpm else 0
    mem = len(f"  mem {fmt.pair(gpu.clock_mem_max_mhz, gpu.clock_mem_max_mhz, ' MHz')}")
    total = fmt.mib(gpu.memory_total_mib)
    vram = len(f" {total}/{total}  util 100 % mem 100 %")
    for mem_clock in (True, False):
        widest = max(power, sm + (mem if mem_clock else 0), vram)
        barw = min(30, width - len("Power ") - widest)
        if barw >= 6:
            return barw, mem_clock
    return 6, False


def health_text(gpu: GpuSample) -> Text:
    """The last XID and a pending or failed row remap, for the end of a card."""
    out = Text()
    if gpu.xid_events:
        last = gpu.xid_events[-1]
        out.append(f"  XID {last.code}", style="bold white on red")
        if last.meaning:
            out.append(f" {last.meaning}", style="red")
    rows = gpu.remapped_rows
    if rows.failure:
        out.append("  row remap failed", style="bold white on red")
    elif rows.pending:
        out.append("  row remap pending: reset", style="bold black on yellow")
    return out


def mig_text(gpu: GpuSample) -> Text:
    """A line per MIG device under its GPU (MIG mode is shown, never changed)."""
    out = Text()
    mig = gpu.mig
    if mig is None or not mig.enabled:
        return out
    for inst in mig.instances:
        procs = len(inst.processes)
        out.append(f"\n  MIG {inst.index} ", style="bold")
        out.append(f"{inst.profile or fmt.NA:<8}", style="cyan")
        out.append(
            f" GI {fmt.num(inst.gpu_instance_id)}"
            f"  VRAM {fmt.mib(inst.memory_used_mib)}/{fmt.mib(inst.memory_total_mib)}"
            f"  {procs} proc{'s' if procs != 1 else ''}",
            style="dim",
        )
    return out


def compact_text(gpu: GpuSample, width: int, focused: bool = False) -> Text:
    """Two lines per GPU for small terminals and many GPUs.

    Focus swaps the PCIe link for the power limit's default and range.
    """
    t = Text()
    t.append(f"{gpu.index} ", style="bold")
    t.append(f"{short_name(gpu.name)[:18]:<18}", style="bold cyan")
    if gpu.lost:
        t.append(" LOST: the driver no longer answers", style="bold white on red")
        return t
    t.append(" ")
    t.append(f"{fmt.num(gpu.temperature_c):>3}C", style=temp_style(gpu))
    vram = f"  VRAM {fmt.mib(gpu.memory_used_mib):>6}/{fmt.mib(gpu.memory_total_mib):<6} "
    fans = f" fan {fans_text(gpu)}" if gpu.fans_pct else " no fans"
    if focused:
        link = Text(
            f"limit default {fmt.num(gpu.power_default_w)},"
            f" {fmt.num(gpu.power_min_w)}-{fmt.num(gpu.power_max_w, unit=' W')}",
            style="italic",
        )
    else:
        link = pcie_text(gpu, arrows=False)
    barw, tail = _compact_tail(gpu, width, len(vram) + len(fans) + 1, link)
    t.append(f" {fmt.pair(gpu.power_w, gpu.power_limit_w, 'W'):>9} ")
    t.append_text(bar(fraction(gpu.power_w, gpu.power_limit_w), barw, pct_style(gpu.power_pct)))
    t.append(f" util {fmt.num(gpu.utilization_gpu_pct):>3}%")
    t.append(f" SM {fmt.pair(gpu.clock_sm_mhz, gpu.clock_sm_max_mhz)}")
    t.append(f" {fmt.pstate(gpu.pstate)}", style="dim")
    t.append("\n" + vram)
    t.append_text(
        bar(fraction(gpu.memory_used_mib, gpu.memory_total_mib), barw, pct_style(gpu.memory_pct))
    )
    t.append(fans, style="dim")
    t.append(" ")
    t.append_text(tail)
    t.truncate(width * 2 + 1)
    return t


def _compact_tail(gpu: GpuSample, width: int, used: int, link: Text) -> tuple[int, Text]:
    """The bars' width on a compact card and what ends its second line after ``used``
    columns and the bar: the link (or the limit) and the throttle reasons.

    The throttle reasons are what must show: the link gives way first, then the
    word "throttling" after each reason, then the bars (down to 4 cells).
    """
    barw = max(4, min(16, width - 66))
    if not throttled(gpu):
        return barw, link
    full, short = throttle_text(gpu), throttle_text(gpu, short=True)
    tries = [(barw, link, full), (barw, link, short), (barw, None, full), (barw, None, short)]
    tries += [(4, None, full), (4, None, short)]
    for bar_w, before, words in tries:
        tail = Text()
        if before is not None:
            tail.append_text(before)
            tail.append(" ")
        tail.append_text(words)
        if used + bar_w + tail.cell_len <= width:
            return bar_w, tail
    return 4, short
