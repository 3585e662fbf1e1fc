"""What a sweep found: per-point figures, the Pareto front, the recommendation, the plot.

A point's figures leave out the warm-up: the window starts at the runner's
first throughput report (runners report none while warming up) or, with
``--warmup-s``, that many seconds after the run started, and ends at its last
report. Throughput is the mean of the reports in the window; energy per unit
of work is the GPUs' mean power over the same window (from the driver's
energy counter where it was read, else the power samples) divided by it.

The SVG is written here rather than through a plotting library: the project
has none that writes files (plotext draws in the terminal), and a scatter of
a few dozen points with a front is short to write.
"""

from __future__ import annotations

import html
import itertools
from pathlib import Path
from typing import Any

from gpustation.runs import rundir
from gpustation.runs.fold import finite_number
from gpustation.runs.sweep.model import Point, Sweep
from gpustation.runs.tail import parse_metric_line
from gpustation.telemetry.format import NA


def _lines(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        with open(path, "rb") as fh:
            for raw in fh:
                event = parse_metric_line(raw)
                if event is not None:
                    out.append(event)
    except OSError:
        pass
    return out


def work_unit(unit: str | None) -> str | None:
    """``img/s`` -> ``img``, ``tokens/s`` -> ``token``."""
    if not unit or "/" not in unit:
        return None
    base = unit.split("/")[0].strip()
    return base[:-1] if base.endswith("s") and len(base) > 3 else base


def point_figures(directory: Path, warmup_s: float | None = None) -> dict[str, Any]:
    """The figures of one finished point from its run directory."""
    state = rundir.read_state(directory)
    metrics = _lines(directory / rundir.METRICS_FILE)
    samples = [
        s for s in _lines(directory / rundir.TELEMETRY_FILE) if isinstance(s.get("gpus"), list)
    ]
    reports = [
        (float(e["time"]), tp, e.get("unit"))
        for e in metrics
        if finite_number(e.get("time")) is not None
        and (tp := finite_number(e.get("throughput"))) is not None
    ]
    start = reports[0][0] if reports else None
    if warmup_s is not None and state is not None and state.started_at is not None:
        start = state.started_at + warmup_s
    end = reports[-1][0] if reports else (state.ended_at if state is not None else None)
    figures: dict[str, Any] = {}
    steady = [r for r in reports if start is None or r[0] >= start]
    if steady:
        figures["throughput"] = sum(r[1] for r in steady) / len(steady)
        figures["unit"] = next((r[2] for r in steady if r[2]), None)
        figures["work_unit"] = work_unit(figures["unit"])
    window = [
        s
        for s in samples
        if (t := finite_number(s.get("time"))) is not None
        and (start is None or t >= start)
        and (end is None or t <= end + 1.0)
    ] or samples
    if len(window) >= 2:
        figures.update(_power_figures(window))
    peaks = _peaks(samples)
    figures.update(peaks)
    power = figures.get("avg_power_w")
    tp = figures.get("throughput")
    if isinstance(power, float) and isinstance(tp, float) and tp > 0:
        figures["energy_per_unit_j"] = power / tp
    return figures


def _power_figures(window: list[dict[str, Any]]) -> dict[str, Any]:
    t0 = finite_number(window[0].get("time")) or 0.0
    t1 = finite_number(window[-1].get("time")) or 0.0
    span = t1 - t0
    if span <= 0:
        return {}
    first = {g.get("index"): finite_number(g.get("energy_j")) for g in window[0]["gpus"]}
    last = {g.get("index"): finite_number(g.get("energy_j")) for g in window[-1]["gpus"]}
    energy: float | None = None
    if first and all(first.get(i) is not None and last.get(i) is not None for i in first):
        energy = sum((last[i] or 0.0) - (first[i] or 0.0) for i in first)
    if energy is None or energy <= 0:  # no counter: integrate the power samples
        energy = 0.0
        for a, b in itertools.pairwise(window):
            dt = (finite_number(b.get("time")) or 0.0) - (finite_number(a.get("time")) or 0.0)
            pa = sum(finite_number(g.get("power_w")) or 0.0 for g in a["gpus"])
            pb = sum(finite_number(g.get("power_w")) or 0.0 for g in b["gpus"])
            energy += max(0.0, dt) * (pa + pb) / 2
    return {"window_s": span, "energy_j": energy, "avg_power_w": energy / span}


def _counter_power(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """The GPUs' mean power between two samples from their energy counters."""
    dt = (finite_number(b.get("time")) or 0.0) - (finite_number(a.get("time")) or 0.0)
    before = {g.get("index"): finite_number(g.get("energy_j")) for g in a["gpus"]}
    after = {g.get("index"): finite_number(g.get("energy_j")) for g in b["gpus"]}
    if dt <= 0 or not before or before.keys() != after.keys():
        return None
    if any(v is None for v in (*before.values(), *after.values())):
        return None
    joules = sum((after[i] or 0.0) - (before[i] or 0.0) for i in before)
    return joules / dt if joules >= 0 else None


def _peaks(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Peak power, temperature and VRAM, and the seconds spent throttled.

    The peak power is the highest of the power readings and of the mean
    power between consecutive samples by the energy counters: a reading is
    the driver's power at that moment, and a workload whose power swings
    between readings can spend more between them than any reading shows
    (the mean over the window would then be above the "peak").
    """
    out: dict[str, Any] = {}
    throttled = 0.0
    prev: float | None = None
    for a, b in itertools.pairwise(samples):
        between = _counter_power(a, b)
        if between is not None:
            out["peak_power_w"] = max(out.get("peak_power_w", 0.0), between)
    for s in samples:
        power = sum(finite_number(g.get("power_w")) or 0.0 for g in s["gpus"])
        out["peak_power_w"] = max(out.get("peak_power_w", 0.0), power)
        for g in s["gpus"]:
            for key, name in (
                ("temperature_c", "peak_temp_c"),
                ("memory_used_mib", "peak_vram_mib"),
            ):
                v = finite_number(g.get(key))
                if v is not None:
                    out[name] = max(out.get(name, v), v)
        t = finite_number(s.get("time")) or finite_number(s.get("t"))
        if prev is not None and t is not None and any(g.get("throttle") for g in s["gpus"]):
            throttled += max(0.0, t - prev)
        prev = t
    if samples:
        out["throttled_s"] = throttled
    return out


# ---- the front and the recommendation -------------------------------------------


def measured(sweep: Sweep) -> list[Point]:
    return [
        p
        for p in sweep.points
        if p.status == "succeeded"
        and isinstance(p.figures.get("throughput"), float)
        and isinstance(p.figures.get("energy_per_unit_j"), float)
    ]


def pareto_front(points: list[Point]) -> list[Point]:
    """Points no other point beats on both throughput (higher) and J/unit (lower)."""

    def tp(p: Point) -> float:
        return float(p.figures["throughput"])

    def jpu(p: Point) -> float:
        return float(p.figures["energy_per_unit_j"])

    front = [
        p
        for p in points
        if not any(
            tp(q) >= tp(p) and jpu(q) <= jpu(p) and (tp(q) > tp(p) or jpu(q) < jpu(p))
            for q in points
        )
    ]
    return sorted(front, key=tp)


def recommend(sweep: Sweep) -> dict[str, Any]:
    """The fastest point, and the least energy per unit within ``within_pct`` of it."""
    points = measured(sweep)
    if not points:
        return {}
    fastest = max(points, key=lambda p: p.figures["throughput"])
    floor = fastest.figures["throughput"] * (1 - sweep.within_pct / 100)
    near = [p for p in points if p.figures["throughput"] >= floor]
    frugal = min(near, key=lambda p: p.figures["energy_per_unit_j"])
    return {"fastest": fastest.index, "frugal": frugal.index, "within_pct": sweep.within_pct}


def recommendation_text(sweep: Sweep) -> str:
    rec = recommend(sweep)
    if not rec:
        return "No point finished with both a throughput and an energy figure."
    fastest = sweep.points[rec["fastest"]]
    frugal = sweep.points[rec["frugal"]]
    unit = fastest.figures.get("unit") or "/s"
    wu = fastest.figures.get("work_unit") or "unit"
    f_tp, f_j = fastest.figures["throughput"], fastest.figures["energy_per_unit_j"]
    text = f"Fastest: {fastest.label}, {f_tp:,.1f} {unit} at {f_j:.4g} J/{wu}."
    if frugal.index == fastest.index:
        return (
            text + f" It also uses the least energy per {wu} within {sweep.within_pct:g} % of it."
        )
    g_tp, g_j = frugal.figures["throughput"], frugal.figures["energy_per_unit_j"]
    return text + (
        f" Least energy within {sweep.within_pct:g} % of that: {frugal.label}, "
        f"{g_tp:,.1f} {unit} ({100 * (g_tp / f_tp - 1):+.1f} %) at {g_j:.4g} J/{wu} "
        f"({100 * (g_j / f_j - 1):+.1f} %)."
    )


# ---- the plots ---------------------------------------------------------------------


def svg_plot(sweep: Sweep, width: int = 720, height: int = 480) -> str:
    """Throughput (x) against energy per unit (y), the Pareto front drawn and marked."""
    points = measured(sweep)
    front = {p.index for p in pareto_front(points)}
    rec = recommend(sweep)
    pad_l, pad_r, pad_t, pad_b = 80, 30, 40, 60
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">'
        f"sweep {html.escape(sweep.id)}: throughput against energy per unit</text>",
    ]
    if not points:
        out.append(
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">no measured point</text>'
        )
        return "\n".join([*out, "</svg>"])
    xs = [p.figures["throughput"] for p in points]
    ys = [p.figures["energy_per_unit_j"] for p in points]
    x0, x1 = _span(xs)
    y0, y1 = _span(ys)

    def sx(v: float) -> float:
        return pad_l + (v - x0) / (x1 - x0) * (width - pad_l - pad_r)

    def sy(v: float) -> float:
        return height - pad_b - (v - y0) / (y1 - y0) * (height - pad_t - pad_b)

    unit = points[0].figures.get("unit") or "/s"
    wu = points[0].figures.get("work_unit") or "unit"
    bottom, mid_y = height - pad_b, (height - pad_b + pad_t) / 2
    out += [
        f'<line x1="{pad_l}" y1="{bottom}" x2="{width - pad_r}" y2="{bottom}" stroke="black"/>',
        f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{bottom}" stroke="black"/>',
        f'<text x="{(width + pad_l) / 2}" y="{height - 15}" text-anchor="middle">'
        f"throughput ({html.escape(unit)})</text>",
        f'<text x="18" y="{mid_y}" text-anchor="middle" '
        f'transform="rotate(-90 18 {mid_y})">energy (J/{html.escape(wu)})</text>',
    ]
    for i in range(5):
        vx = x0 + (x1 - x0) * i / 4
        vy = y0 + (y1 - y0) * i / 4
        out.append(
            f'<text x="{sx(vx):.1f}" y="{bottom + 16}" text-anchor="middle">{vx:,.4g}</text>'
        )
        out.append(f'<text x="{pad_l - 6}" y="{sy(vy) + 4:.1f}" text-anchor="end">{vy:.4g}</text>')
    line = " ".join(
        f"{sx(p.figures['throughput']):.1f},{sy(p.figures['energy_per_unit_j']):.1f}"
        for p in pareto_front(points)
    )
    out.append(f'<polyline points="{line}" fill="none" stroke="#d62728" stroke-width="2"/>')
    for p in points:
        on_front = p.index in front
        colour = "#d62728" if on_front else "#1f77b4"
        x, y = sx(p.figures["throughput"]), sy(p.figures["energy_per_unit_j"])
        out.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{colour}"><title>'
            f"{html.escape(p.label)}</title></circle>"
        )
        mark = " (fastest)" if rec.get("fastest") == p.index else ""
        mark += " (recommended)" if rec.get("frugal") == p.index else ""
        out.append(
            f'<text x="{x + 8:.1f}" y="{y - 6:.1f}" font-size="10">'
            f"{html.escape(p.label + mark)}</text>"
        )
    out.append(
        f'<text x="{width - pad_r}" y="{pad_t}" text-anchor="end" fill="#d62728">'
        "Pareto front</text>"
    )
    return "\n".join([*out, "</svg>"])


def _span(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi - lo < 1e-12:
        lo, hi = lo * 0.9 - 1e-9, hi * 1.1 + 1e-9
    margin = (hi - lo) * 0.08
    return lo - margin, hi + margin


def terminal_plot(sweep: Sweep, width: int = 80, height: int = 20, colour: bool = True) -> str:
    """The same scatter drawn with plotext for the terminal, the recommended points
    marked; without ``colour`` as plain text (a file, a pipe, ``NO_COLOR``)."""
    import plotext as plt  # start-up time: the terminal plot only when one is drawn

    points = measured(sweep)
    if not points:
        return ""
    plt.clear_figure()
    plt.limitsize(False, False)  # the size asked for, not the terminal's as plotext sees it
    plt.plotsize(width, height)
    plt.theme("clear")  # the terminal's own colours, as the runs screen's plots
    front = pareto_front(points)
    others = [p for p in points if p not in front]
    if others:
        plt.scatter(
            [p.figures["throughput"] for p in others],
            [p.figures["energy_per_unit_j"] for p in others],
            label="points",
        )
    plt.plot(
        [p.figures["throughput"] for p in front],
        [p.figures["energy_per_unit_j"] for p in front],
        label="Pareto front",
        marker="dot",
    )
    rec = recommend(sweep)
    marked = {rec["fastest"]: "fastest", rec["frugal"]: "recommended"} if rec else {}
    if rec and rec["fastest"] == rec["frugal"]:
        marked = {rec["fastest"]: "fastest, recommended"}
    for index, what in marked.items():
        p = sweep.points[index]
        x, y = p.figures["throughput"], p.figures["energy_per_unit_j"]
        plt.scatter([x], [y], marker="x", color="red")
        plt.text(f"#{index + 1} {what}", x, y, alignment="right", color="red")
    unit = points[0].figures.get("unit") or "/s"
    plt.xlabel(f"throughput ({unit})")
    plt.ylabel(f"J/{points[0].figures.get('work_unit') or 'unit'}")
    figure = str(plt.build())
    return figure if colour else str(plt.uncolorize(figure))


# ---- the points table ----------------------------------------------------------------


def point_columns(sweep: Sweep) -> list[str]:
    """The points table's headings (``sweeps show`` and the runs screen)."""
    unit = next((p.figures.get("unit") for p in sweep.points if p.figures.get("unit")), None)
    wu = next(
        (p.figures.get("work_unit") for p in sweep.points if p.figures.get("work_unit")), "unit"
    )
    return [
        "#",
        "point",
        "status",
        f"throughput ({unit or '/s'})",
        f"J/{wu}",
        "avg W",
        "peak W",
        "peak °C",
        "throttled s",
        "peak VRAM MiB",
        "run",
    ]


#: the headings shown left-aligned; the figures are right-aligned
TEXT_COLUMNS = ("point", "status", "run")


def constants(sweep: Sweep) -> list[str]:
    """``KEY=VALUE`` for each setting every point shares (an axis of one value)."""
    shared = [f"{k}={v[0]}" for k, v in sweep.axes.items() if len(v) == 1]
    if len(sweep.power_limits) == 1:
        shared.append(f"power={sweep.power_limits[0]}")
    return shared


def point_label(sweep: Sweep, point: Point) -> str:
    """The point's settings less the ones every point shares."""
    parts = [f"{k}={v}" for k, v in point.overrides.items() if len(sweep.axes.get(k, ())) != 1]
    if point.power is not None and len(sweep.power_limits) != 1:
        parts.append(f"power={point.power}")
    return " ".join(parts) or ("(as above)" if constants(sweep) else "(defaults)")


def point_rows(sweep: Sweep, constants_apart: bool = False) -> list[list[str]]:
    """A row of text per point, in :func:`point_columns`' order (labels not yet made
    safe); with ``constants_apart`` a point's label leaves out :func:`constants`."""

    def num(value: object, fmt: str) -> str:
        return format(value, fmt) if isinstance(value, (int, float)) else NA

    rows = []
    for p in sweep.points:
        f = p.figures
        rows.append(
            [
                str(p.index + 1),
                point_label(sweep, p) if constants_apart else p.label,
                p.status + (" [SIMULATED]" if sweep.simulated else ""),
                num(f.get("throughput"), ",.1f"),
                num(f.get("energy_per_unit_j"), ".4g"),
                num(f.get("avg_power_w"), ".0f"),
                num(f.get("peak_power_w"), ".0f"),
                num(f.get("peak_temp_c"), ".0f"),
                num(f.get("throttled_s"), ".0f"),
                num(f.get("peak_vram_mib"), ",.0f"),
                p.run_id or NA,
            ]
        )
    return rows
