"""What gives way when a screen is short of room: the footer's keys, the runs
table's columns, the sweeps table's headings and ids, a card's words."""

from __future__ import annotations

import io

from rich.console import Console
from rich.text import Text

from gpustation.telemetry.model import GpuSample
from gpustation.telemetry.sim import SimBackend
from gpustation.tui.cards import card_text, compact_text
from gpustation.tui.footer import FooterItem, fit
from gpustation.tui.runs.model import short_ids
from gpustation.tui.runs.sweeps import points_table
from gpustation.tui.runs.table import CELL_PAD, COLUMN_NEED, RUN_COLUMNS, fit_columns
from gpustation.tui.source import DataSource

from .conftest import Clock, fixed_host
from .test_runs_detail import write_sweep

# ---- the footer -----------------------------------------------------------------------

DASHBOARD_KEYS = [
    FooterItem(("k",), "Kill", ("kill",)),
    FooterItem(("/",), "Filter", ("filter",)),
    FooterItem(("s",), "Sort", ("sort",)),
    FooterItem(("q",), "Quit", ("quit",)),
    FooterItem(("?",), "Help", ("show_help",)),
    FooterItem(("c",), "Control", ("switch_to",)),
    FooterItem(("r",), "Runs", ("switch_to",)),
    FooterItem(("t",), "Topology", ("show_topology",)),
    FooterItem(("a",), "Alerts", ("show_alerts",)),
    FooterItem(("p",), "Pause", ("toggle_pause",)),
    FooterItem(("m",), "Metric", ("cycle_metric",)),
    FooterItem(("+",), "Slower", ("slower",)),
    FooterItem(("-",), "Faster", ("faster",)),
]
NEED = ("kill", "filter", "quit", "show_help", "slower", "faster", "cycle_metric")


def words(items: tuple[FooterItem, ...]) -> list[str]:
    return [" ".join(i.keys) + " " + i.description for i in items]


def test_a_wide_footer_shows_every_key_in_the_roomy_style() -> None:
    plan = fit(DASHBOARD_KEYS, 240, NEED, wide=True, palette=True)
    assert not plan.compact and plan.palette and plan.items == tuple(DASHBOARD_KEYS)


def test_short_of_room_related_keys_share_a_word_then_the_least_needed_go() -> None:
    plan = fit(DASHBOARD_KEYS, 100, NEED, wide=False, palette=True)
    assert plan.compact and plan.width() <= 100
    assert words(plan.items)[-2:] == ["m Metric", "+ - Refresh"]
    assert "c r t a Screens" in words(plan.items)
    plan = fit(DASHBOARD_KEYS, 80, NEED, wide=False, palette=False)
    assert plan.width() <= 80
    shown = words(plan.items)
    # those named needed stay, in the footer's order; the last not named went first
    assert shown[:2] == ["k Kill", "/ Filter"] and shown[-2:] == ["m Metric", "+ - Refresh"]
    assert "q Quit" in shown and "? Help" in shown and "p Pause" not in shown
    plan = fit(DASHBOARD_KEYS, 40, NEED, wide=False, palette=False)
    assert plan.width() <= 40 and words(plan.items) == ["k Kill", "/ Filter", "q Quit", "? Help"]


def test_footer_widths_are_what_textual_draws() -> None:
    assert FooterItem(("k",), "Kill", ("kill",)).width(compact=True) == len("k Kill ")
    assert FooterItem(("k",), "Kill", ("kill",)).width(compact=False) == len(" k Kill ")
    assert FooterItem(("+", "-"), "Refresh", ("slower", "faster")).width(True) == len(
        "+ - Refresh "
    )


# ---- the runs table ------------------------------------------------------------------


def test_a_run_is_named_by_the_shortest_end_of_its_id_no_other_has() -> None:
    ids = [
        "20261129-153012-resnet50-bf16-3f2a",
        "20261129-160000-resnet50-bf16-a3f2",  # contains "3f2" but not "3f2a"
        "20261130-090000-lora-tiny-3f2a",  # the same token: the tail grows
        "run-1",
        "run-10",  # "run-1" is in "run-10": it stands whole
    ]
    short = short_ids(ids)
    assert short[ids[0]] == "bf16-3f2a"
    assert short[ids[1]] == "a3f2"
    assert short[ids[2]] == "tiny-3f2a"
    assert short["run-1"] == "run-1" and short["run-10"] == "run-10"
    for run_id, tail in short.items():
        assert run_id.endswith(tail)
        if tail != run_id:
            assert [i for i in ids if tail in i] == [run_id]


def test_the_runs_table_keeps_the_most_needed_columns_that_fit() -> None:
    widths = {key: max(len(label), 8) for key, label in RUN_COLUMNS}
    widths["mark"] = 1
    full = sum(w + CELL_PAD for w in widths.values())
    columns, whole = fit_columns(widths, full, whole_id_w=8)
    assert columns == tuple(k for k, _ in RUN_COLUMNS) and whole
    # 30 columns fewer: the least needed go, whole, and the rest keep their order
    columns, _ = fit_columns(widths, full - 30, whole_id_w=8)
    dropped = {k for k, _ in RUN_COLUMNS if k not in columns}
    assert dropped == set(COLUMN_NEED[-3:]), dropped
    assert list(columns) == [k for k, _ in RUN_COLUMNS if k in columns]
    # no room even for the first: the mark and the preset stay, a row names its run
    assert fit_columns(widths, 5, whole_id_w=8)[0] == ("mark", "preset")
    # whole ids only where they fit beside the rest
    assert not fit_columns(widths, full, whole_id_w=30)[1]


# ---- the sweeps table ----------------------------------------------------------------


def test_the_sweeps_table_is_the_roomiest_that_fits(gpustation_dirs: dict[str, object]) -> None:
    sweep = write_sweep(gpustation_dirs)  # type: ignore[arg-type]
    for point in sweep.points:
        point.run_id = f"20231114-2213{point.index}0-resnet50-bf16-ab1{point.index}"

    def drawn(width: int) -> tuple[str, int]:
        table, used = points_table(sweep, width)
        out = io.StringIO()
        Console(width=max(used, width), file=out, color_system=None).print(table)
        return out.getvalue(), used

    wide, used = drawn(160)
    assert used <= 160 and "throughput (img/s)" in wide and "peak VRAM MiB" in wide
    assert "20231114-221300-resnet50-bf16-ab10" in wide  # whole ids where they fit
    narrow, used = drawn(74)
    assert used <= 74
    # shorter headings and ids, no figure or word broken
    assert "ab10" in narrow and "resnet50" not in narrow
    for figure in ("power=100%", "1,000.0", "980.0", "0.22", "216", "8,000", "img/s", "J/img"):
        assert figure in narrow, (figure, narrow)
    # narrower than anything fits: the narrowest, to scroll sideways
    tiny, used = drawn(30)
    assert used > 30 and "1,000.0" in tiny


# ---- a card's words ------------------------------------------------------------------


def sample(card: str, hot: bool = False) -> GpuSample:
    """A simulated card's sample (its GPM read); ``hot``: two minutes at full load in
    a hot room, at its power cap and throttled for heat."""
    clock = Clock()
    backend = SimBackend(count=1, card=card, seed=0, state_path=None, clock=clock)
    source = DataSource(lambda: backend, host_source=fixed_host, hostname="box", clock=clock)
    source.want_gpm = True
    if hot:
        backend.poke(0, load=1.0, ambient_c=70.0)
        source.sample()
        clock.t += 120.0
    return source.sample().snapshot.gpus[0]


def test_a_compact_card_keeps_its_throttle_reasons_at_80_columns() -> None:
    gpu = sample("rtx4090", hot=True)
    assert {"sw_power_cap", "sw_thermal", "hw_thermal"} <= set(gpu.throttle_reasons or ())
    lines = compact_text(gpu, 78).plain.split("\n")
    assert all(len(line) <= 78 for line in lines), lines
    assert lines[1].endswith("power cap, thermal (SW, HW)"), lines
    # with room, each in full after the link
    roomy = compact_text(gpu, 160).plain.split("\n")[1]
    assert "Gen4 x16" in roomy and "thermal (SW) throttling, thermal (HW) throttling" in roomy


def test_a_full_card_keeps_its_gpm_figures_and_its_throttle_line() -> None:
    gpu = sample("h200")
    assert gpu.sm_active_pct is not None
    text: Text = card_text(gpu, 74)
    lines = text.plain.split("\n")
    assert all(len(line) <= 74 for line in lines), lines
    sm = next(line for line in lines if line.startswith("SM "))
    assert "dram" in sm and "mem " not in sm, sm  # the memory clock gave way
    assert "mem " in card_text(gpu, 120).plain.split("\n")[3]
    throttled = sample("rtx4090", hot=True)
    lines = card_text(throttled, 60).plain.split("\n")
    assert all(len(line) <= 60 for line in lines), lines


def test_a_figure_not_known_reads_n_a_on_the_runs_side_as_everywhere() -> None:
    from gpustation.runs.summary import RunSummary
    from gpustation.telemetry.format import NA
    from gpustation.tui.runs.model import fmt_value
    from gpustation.tui.runs.widgets import energy_cell

    assert fmt_value(None) == NA == "n/a"
    assert energy_cell(RunSummary(id="r"), None) == NA
    assert fmt_value(0.5) == "0.5000"


async def test_the_runs_table_is_as_wide_as_its_cells_at_once() -> None:
    """A data table measures new cells when it is next idle; the runs table does not
    wait for that (on a busy screen it was seen not to come for 20 s)."""
    from textual.app import App, ComposeResult
    from textual.widgets.data_table import ColumnKey

    from gpustation.tui.runs.table import RunRow, RunsTable

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield RunsTable(id="t")

    app = One()
    async with app.run_test(size=(200, 20)):
        table = app.query_one(RunsTable)
        cells = {"preset": "resnet50-bf16", "id": "20231116-221322-ab12", "status": "running"}
        table.show_runs([RunRow("20231116-221322-ab12", cells)], priced=False)
        # no pause: what the table holds before it is next idle
        status = table.columns[ColumnKey("status")]
        preset = table.columns[ColumnKey("preset")]
        assert status.content_width >= len("running") > len("status")
        assert preset.content_width >= len("resnet50-bf16")
        table.show_runs(
            [RunRow("20231116-221322-ab12", {**cells, "status": "failed (exit 75)"})], priced=False
        )
        assert status.content_width >= len("failed (exit 75)")
