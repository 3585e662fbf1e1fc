"""Every screen and overlay at 80x24, 120x36, 160x48 and 240x70, opened with the
keys a user presses: the figures they opened it for are on the screen as drawn
(the text of the app's screenshot, dialogs over their screen included), not
only in the widgets' data.

One app per size and family of screens: the dashboard's own screens, the runs
screen with a live run and everything it opens, the fleet, a replay.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import DataTable

from gpustation.runs import rundir
from gpustation.runs.launch.start import RunHandle, launch
from gpustation.runs.launch.stop import stop_run
from gpustation.runs.presets import load_presets
from gpustation.runs.store.index import sync_run
from gpustation.telemetry import format as fmt
from gpustation.telemetry.health import short_name
from gpustation.telemetry.model import GpuSample
from gpustation.telemetry.recording.file import Recording
from gpustation.tui.app import DashboardApp
from gpustation.tui.fleet.screen import FleetApp, FleetScreen, HostScreen
from gpustation.tui.modes import SCREENS_BY_MODE
from gpustation.tui.replay.screen import ReplayApp
from gpustation.tui.replay.source import ReplaySource
from gpustation.tui.runs import CompareScreen, LaunchDialog, RunsScreen
from gpustation.tui.runs.model import fmt_value
from gpustation.tui.runs.prune import FilterDialog, PruneDialog
from gpustation.tui.runs.sweeps import SweepsScreen
from gpustation.tui.widgets import GpuCard
from tests.telemetry.recording_tools import START as REC_START
from tests.telemetry.recording_tools import make_recording

from .conftest import Clock, first_frame, make_app, runs_ui, screen_lines, screen_text, wait_for
from .test_runs_detail import TOP_OPS, finished_run, write_sweep
from .test_snapshots import FakeFleet

pytestmark = pytest.mark.timeout(240)

SIZES = [(80, 24), (120, 36), (160, 48), (240, 70)]
IDS = ["80x24", "120x36", "160x48", "240x70"]


def body(app: Any) -> str:
    """The screen less its status line and footer (which name alerts and keys)."""
    return "\n".join(screen_lines(app)[:-2])


def footer(app: Any) -> str:
    return screen_lines(app)[-1]


def inside(app: Any, widget: Widget) -> str:
    """The text drawn inside ``widget``'s region, its lines joined by spaces (a wrapped
    sentence reads whole)."""
    region = widget.region
    lines = screen_lines(app)[region.y : region.bottom]
    cropped = [line[region.x : region.right] for line in lines]
    words = " ".join(cropped).translate(str.maketrans("", "", "│╭╮╰╯─▊▎▔▁▌▐"))
    return " ".join(words.split())


def has_all(text: str, *wanted: str) -> list[str]:
    """The ``wanted`` strings missing from ``text`` (an empty list: all there)."""
    return [w for w in wanted if w not in text]


async def scrolled_through(pilot: Pilot[Any], pages: int = 6) -> str:
    """The screen's text over ``pages`` Page Downs, as a user reads a long screen."""
    seen = [screen_text(pilot.app)]
    for _ in range(pages):
        await pilot.press("pagedown")
        await pilot.pause()
        seen.append(screen_text(pilot.app))
    return "\n".join(seen)


# ---- the dashboard and its own screens ------------------------------------------------


def card_figures(g: GpuSample) -> list[str]:
    """What a GPU's card (full or compact) must show: temperature, power, VRAM."""
    return [
        f"{fmt.num(g.temperature_c)}",
        f"{fmt.num(g.power_w)}/{fmt.num(g.power_limit_w)}",
        f"{fmt.mib(g.memory_used_mib)}/{fmt.mib(g.memory_total_mib)}",
    ]


def footer_problems(app: Any) -> list[str]:
    """What the footer lacks of m, + and - (their own words, or the one word they share)."""
    keys = footer(app)
    problems = [] if re.search(r"\bm Metric\b", keys) else ["m in the footer"]
    if not (("+ Slower" in keys and "- Faster" in keys) or "+ - Refresh" in keys):
        problems.append("+ and - in the footer")
    return problems


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_the_dashboard_topology_alerts_and_control(
    size: tuple[int, int], gpustation_dirs: dict[str, Path]
) -> None:
    clock = Clock()
    app, backend = make_app(
        count=2, clock=clock, refresh_s=0.25, notify_alerts=False, screens=SCREENS_BY_MODE
    )
    async with app.run_test(size=size) as pilot:
        await first_frame(pilot)
        # GPU 0 hot and at its power cap, GPU 1 at its power cap
        backend.poke(0, load=1.0, ambient_c=70.0)
        backend.poke(1, load=1.0)
        clock.t += 120.0

        def throttled() -> bool:
            snap = app.latest
            return (
                snap is not None
                and all({"sw_power_cap"} <= set(g.throttle_reasons or ()) for g in snap.gpus)
                and {"sw_thermal", "hw_thermal"} <= set(snap.gpus[0].throttle_reasons or ())
            )

        await wait_for(pilot, throttled)
        await pilot.press("p")  # paused: the figures on screen stay those of app.latest
        await pilot.pause()
        snap = app.latest
        assert snap is not None
        shown = body(app)
        problems = [
            f"GPU {g.index}: {missing}"
            for g in snap.gpus
            if (missing := has_all(shown, *card_figures(g)))
        ]
        # every GPU's throttle reasons in words: two power caps, GPU 0's thermal ones
        if shown.count("power cap") < 2 or "thermal" not in shown:
            problems.append("throttle reasons")
        problems += footer_problems(app)
        assert not problems, f"{problems}\n{screen_text(app)}"

        await pilot.press("t")
        await wait_for(pilot, lambda: "GPU interconnect" in screen_text(app))
        shown = body(app)
        missing = has_all(shown, "PCIe links", *(g.pci_bus_id or "" for g in snap.gpus))
        assert not missing, f"{missing}\n{shown}"

        await pilot.press("a")
        await wait_for(pilot, lambda: "held back by its power limit" in screen_text(app))
        shown = body(app)
        for alert in app.alerts.log:
            assert alert.message[:40] in shown, f"{alert.message}\n{shown}"

        await pilot.press("c")
        await wait_for(pilot, lambda: "power limit" in screen_text(app))
        shown = body(app)
        for g in snap.gpus:
            limits = f"power limit {fmt.num(g.power_limit_w)} W"
            span = f"range {fmt.num(g.power_min_w)}-{fmt.num(g.power_max_w)} W"
            assert limits in shown and span in shown, f"GPU {g.index}\n{shown}"
        assert "w Power cap" in footer(app), footer(app)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_help_lists_every_key(
    size: tuple[int, int], gpustation_dirs: dict[str, Path]
) -> None:
    app, _ = make_app(count=2, notify_alerts=False, screens=SCREENS_BY_MODE)
    async with app.run_test(size=size) as pilot:
        await first_frame(pilot)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: "gpustation dashboard" in screen_text(app))
        read = await scrolled_through(pilot)
        # every key of the runs screen and the views it opens, those the footer leaves out too
        lines = (
            r"m\s+Metric",
            r"\+\s+Slower",
            r"P\s+Profile",
            r"S\s+Sweeps",
            r"\[ \]\s+Earlier / Later",
            r"\{ \}\s+Much earlier / Much later",
            r"o\s+Next pane",
            r"x\s+Steps/time",
            r"1-9\s+Profile",
            "compare view",
            "sweeps view",
        )
        missing = [line for line in lines if not re.search(line, read)]
        assert not missing, f"{missing} not in help:\n{read}"


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_four_h200s_show_their_gpm_activity(
    size: tuple[int, int], gpustation_dirs: dict[str, Path]
) -> None:
    app, _ = make_app(count=4, card="h200", refresh_s=0.25, notify_alerts=False)
    async with app.run_test(size=size) as pilot:
        await first_frame(pilot)

        full = not next(iter(app.screen.query(GpuCard))).compact
        assert full or size[0] < 160  # 160x48 has room for full cards

        def gpm_read() -> bool:
            # read only while full cards show it (compact ones have no room for it)
            snap = app.latest
            return snap is not None and all(g.sm_active_pct is not None for g in snap.gpus)

        if full:
            await wait_for(pilot, gpm_read)
        await pilot.press("p")
        await pilot.pause()
        snap = app.latest
        assert snap is not None
        shown = body(app)
        for g in snap.gpus:
            assert not has_all(shown, *card_figures(g)), f"GPU {g.index}\n{shown}"
            gpm = (
                f"active {fmt.num(g.sm_active_pct, unit=' %')}"
                f" tensor {fmt.num(g.tensor_active_pct, unit=' %')}"
                f" dram {fmt.num(g.dram_active_pct, unit=' %')}"
            )
            assert not full or gpm in shown, f"GPU {g.index}: {gpm}\n{shown}"
        assert not footer_problems(app), footer(app)


# ---- the runs screen and what it opens --------------------------------------------------

#: a few steps (a log line and a metric each), then a long wait: a run still going
#: whose figures stay put
TRAINER = """\
import time
from gpustation.runs.metrics import MetricsWriter
with MetricsWriter.from_env() as m:
    for step in range(1, 13):
        print(f"step {step} loss {2.0 / step:.4f}", flush=True)
        m.log(step=step, loss=2.0 / step, throughput=50.0, unit="img/s", total_steps=1000)
        time.sleep(0.1)
    time.sleep(600)
"""
#: a run id as gpustation makes them
LONG_ID = "20231116-221322-resnet50-bf16-ab12"
RUNS_SCREENS = [*SCREENS_BY_MODE[:4], next(e for e in SCREENS_BY_MODE if e.mode == "runs")]


def one_pane(size: tuple[int, int]) -> bool:
    return size[0] < 100 or size[1] < 32


@pytest.fixture
def past_runs(gpustation_dirs: dict[str, Path]) -> dict[str, Any]:
    """A finished sweep whose point run-1 was profiled and has a note; run-2, finished."""
    sweep = write_sweep(gpustation_dirs)
    member = finished_run(gpustation_dirs, "run-1")
    (member / rundir.ANNOTATIONS_JSON).write_text(
        json.dumps({"tags": [f"sweep:{sweep.id}"], "note": "baseline"})
    )
    (member / "profile").mkdir()
    (member / "profile" / "top_ops.json").write_text(json.dumps(TOP_OPS))
    sync_run(member)
    other = finished_run(gpustation_dirs, "run-2")
    (other / rundir.ANNOTATIONS_JSON).write_text(json.dumps({"note": "second try"}))
    sync_run(other)
    finished_run(gpustation_dirs, LONG_ID)
    return {"sweep": sweep}


@pytest.fixture
def live_run(gpustation_dirs: dict[str, Path], tmp_path: Path) -> Iterator[RunHandle]:
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    preset_dir = gpustation_dirs["config"] / "presets" / "runs"
    preset_dir.mkdir(parents=True)
    (preset_dir / "a-live.toml").write_text(f'command = ["{sys.executable}", "{trainer}"]\n')
    presets, _ = load_presets()
    handle = launch(presets["a-live"], {}, [0], simulate=1)
    try:
        yield handle
    finally:
        stop_run(handle.run_dir, grace_s=1.0, wait_s=20.0)


async def open_runs(pilot: Pilot[Any], *run_ids: str) -> None:
    """Press r; wait until ``run_ids`` are listed."""
    app = pilot.app
    assert isinstance(app, DashboardApp)
    await wait_for(pilot, lambda: app.frame is not None)
    await pilot.press("r")
    ui = runs_ui(app)
    await wait_for(pilot, lambda: ui.presets is not None and set(run_ids) <= set(ui.views))
    await pilot.pause()


async def move_to(pilot: Pilot[Any], run_id: str) -> None:
    """Up or down the runs table with the arrow keys to ``run_id``'s row."""
    app = pilot.app
    ui = runs_ui(app)
    table = app.screen.query_one("#runs-table", DataTable)
    table.focus()
    steps = table.get_row_index(run_id) - table.cursor_row
    await pilot.press(*["down" if steps > 0 else "up"] * abs(steps))
    await wait_for(pilot, lambda: ui.selected == run_id and ui.views[run_id].loaded)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_a_live_run_can_be_followed(size: tuple[int, int], live_run: RunHandle) -> None:
    app, _ = make_app(count=1, screens=RUNS_SCREENS)
    async with app.run_test(size=size) as pilot:
        await open_runs(pilot, live_run.id)
        ui = runs_ui(app)
        await wait_for(pilot, lambda: ui.selected == live_run.id, timeout=30)
        view = ui.views[live_run.id]
        await wait_for(
            pilot, lambda: view.summary.steps == 12 and len(view.timeline.gpu) >= 3, timeout=30
        )
        await wait_for(pilot, lambda: "step 12 loss" in "\n".join(view.lines))
        if one_pane(size):
            assert "o Next pane" in footer(app), footer(app)
            await pilot.press("o")  # the loss curve and the log
        loss = f"loss {fmt_value(view.summary.final_loss)}"

        def run_drawn() -> bool:
            text = body(app)
            return "smoothed" in text and loss in text and "step 12 loss" in text

        await wait_for(pilot, run_drawn)
        shown = body(app)
        assert live_run.id in shown, shown  # the header names the run whole
        header = inside(app, app.screen.query_one("#run-header"))
        assert "img/J SIMULATED" in header, header  # energy per image, of simulated GPUs
        log_lines = re.findall(r"step \d+ loss \d\.\d{4}", shown)
        assert len(log_lines) >= 4, shown
        if one_pane(size):
            await pilot.press("o")  # the GPU plot
        await wait_for(pilot, lambda: "power W" in body(app) and "at the end" in body(app))
        shown = body(app)
        assert "util %" in shown and "seconds since the start" in shown, shown
        cursor = next(line for line in shown.splitlines() if "at the end" in line)
        assert re.search(r"\d+ W\b", cursor) and "SIMULATED" in cursor, cursor
        if one_pane(size):
            await pilot.press("o")  # the runs again
        # the runs table: the run, by the end of its id (enough to name it), its status
        token = live_run.id.rsplit("-", 1)[1]
        await wait_for(pilot, lambda: re.search(rf"\b{token}\b.*running", body(app)) is not None)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_the_runs_table_keeps_the_columns_that_fit(
    size: tuple[int, int], past_runs: dict[str, Any]
) -> None:
    app, _ = make_app(count=1, screens=RUNS_SCREENS)
    async with app.run_test(size=size) as pilot:
        await open_runs(pilot, "run-1", "run-2")
        table = app.screen.query_one("#runs-table")
        await wait_for(pilot, lambda: "run-2" in inside(app, table))
        shown = inside(app, table)
        # which run, and how it went, whatever the width
        missing = has_all(shown, "preset", "run", "status", "run-1", "run-2", "succeeded")
        assert not missing, f"{missing}\n{shown}"
        if size[0] >= 240:
            # and everything else where there is room
            columns = ("step", "loss", "energy", "time", "GPUs", "started", "tags · note")
            missing = has_all(shown, *columns, "second try", "1.1 Wh SIMULATED")
            assert not missing, f"{missing}\n{shown}"
        # no column is cut: each header shows whole
        header = next(line for line in screen_lines(app) if " preset " in line)
        assert not re.search(r"\w│", header), header


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_the_sweeps_view(size: tuple[int, int], past_runs: dict[str, Any]) -> None:
    sweep = past_runs["sweep"]
    app, _ = make_app(count=1, screens=RUNS_SCREENS)
    async with app.run_test(size=size) as pilot:
        await open_runs(pilot, "run-1")
        await move_to(pilot, "run-1")
        await pilot.press("S")  # the sweep run-1 is a point of
        await wait_for(pilot, lambda: isinstance(app.screen, SweepsScreen))
        overlay = app.screen
        assert isinstance(overlay, SweepsScreen)
        await wait_for(pilot, lambda: overlay.shown == sweep.id)
        await wait_for(pilot, lambda: "980.0" in body(app))
        await pilot.pause()
        shown = body(app)
        # the setting every point shares, once
        assert "every point: batch_size=64" in shown, shown
        table = inside(app, overlay.query_one("#sweep-points"))
        # each point's own setting, every figure, its run
        missing = has_all(
            table,
            *("power=100%", "power=80%", "power=60%"),
            *("1,000.0", "980.0", "700.0", "0.22", "216", "236", "65", "8,000"),
            *("run-0", "run-1", "run-2"),
            "J/img",
        )
        assert not missing, f"{missing}\n{table}"
        assert "batch_size" not in table, table
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_the_prune_and_filter_dialogs_say_their_hint_whole(
    size: tuple[int, int], past_runs: dict[str, Any]
) -> None:
    app, _ = make_app(count=1, screens=RUNS_SCREENS)
    async with app.run_test(size=size) as pilot:
        await open_runs(pilot, "run-1")
        await pilot.press("D")
        await wait_for(pilot, lambda: isinstance(app.screen, PruneDialog))
        await pilot.pause()
        prune_hint = inside(app, app.screen.query_one("#prune-box"))
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
        await pilot.press("slash")
        await wait_for(pilot, lambda: isinstance(app.screen, FilterDialog))
        await pilot.pause()
        filter_hint = inside(app, app.screen.query_one("#filter-box"))
        missing = [
            hint
            for hint, shown in (
                (
                    "Delete the runs that ended before this long ago (e.g. 12h, 30d, 4w):",
                    prune_hint,
                ),
                ("Show the runs matching (preset:NAME tag:TAG status:S or any text):", filter_hint),
            )
            if hint not in shown
        ]
        assert not missing, f"{missing}\n{prune_hint}\n{filter_hint}"


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_the_profile_compare_view_and_launch_form(
    size: tuple[int, int], past_runs: dict[str, Any]
) -> None:
    app, _ = make_app(count=1, screens=RUNS_SCREENS)
    async with app.run_test(size=size) as pilot:
        await open_runs(pilot, "run-1", LONG_ID)
        # the top kernels of a profiled run (P)
        await move_to(pilot, "run-1")
        await pilot.press("P")
        await wait_for(pilot, lambda: "cudnn::bn_fw_tr_1C11_kernel" in body(app))
        assert "21.9 %" in body(app), body(app)
        await pilot.press("P")
        if one_pane(size):
            await pilot.press("o", "o")  # the runs again
            await wait_for(pilot, lambda: "Runs (" in body(app))

        # two runs compared (space marks, v compares): their curves and figures
        await move_to(pilot, "run-1")
        await pilot.press("space")
        await move_to(pilot, LONG_ID)
        await pilot.press("space", "v")
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))
        compare = app.screen
        assert isinstance(compare, CompareScreen)
        await wait_for(pilot, lambda: len(compare.shown) == 2 and "final loss" in body(app))
        shown = body(app)
        figures = ("final loss", "throughput", "energy")
        missing = has_all(shown, "━━ run-1", f"━━ {LONG_ID}", *figures)
        assert not missing, f"{missing}\n{shown}"
        await pilot.press("x")  # the curves against time
        await wait_for(pilot, lambda: "time (s)" in body(app))
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))

        # the launch form of the first preset (l): what it will run, on which GPU
        app.screen.query_one("#runs-presets").focus()
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, LaunchDialog))
        await pilot.pause()
        dialog = app.screen
        assert isinstance(dialog, LaunchDialog)
        shown = body(app)
        # its arguments as they stand, the GPU, the command it will run
        args = [f"{k}" for k in dialog.preset.args][:3]
        missing = has_all(shown, *args, "GPU 0", "CUDA_VISIBLE_DEVICES=0", "Launch (Enter)")
        assert not missing, f"{missing}\n{shown}"
        await pilot.press("escape")


# ---- the fleet and a replay ----------------------------------------------------------


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_the_fleet_and_a_host(
    size: tuple[int, int], gpustation_dirs: dict[str, Path]
) -> None:
    fleet = FakeFleet()
    app = FleetApp([], fleet=fleet)  # type: ignore[arg-type]
    async with app.run_test(size=size) as pilot:
        await wait_for(
            pilot, lambda: isinstance(app.screen, FleetScreen) and len(app.screen.rows) == 7
        )
        await pilot.pause()
        lines = screen_lines(app)
        for state in fleet.states():
            if state.snapshot is None:
                assert any("lab-7" in line and "down" in line for line in lines), lines
                assert "Connection refused" in "\n".join(lines)
                continue
            for g in state.snapshot.gpus:
                row = next(
                    (line for line in lines if state.name in line and f" {g.index} " in line),
                    None,
                )
                assert row is not None, (state.name, g.index, lines)
                power = f"{fmt.num(g.power_w)}/{fmt.num(g.power_limit_w)}"
                vram = f"{fmt.mib(g.memory_used_mib)}/{fmt.mib(g.memory_total_mib)}"
                for figure in (short_name(g.name), fmt.num(g.temperature_c), power, vram):
                    assert figure in row, (figure, row)
        # the first host's cards (Enter)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, HostScreen))
        await wait_for(pilot, lambda: bool(app.screen.query(GpuCard)))
        await pilot.pause()
        first = fleet.states()[0].snapshot
        assert first is not None
        shown = body(app)
        for g in first.gpus:
            assert not has_all(shown, *card_figures(g)), f"GPU {g.index}\n{shown}"


@pytest.mark.parametrize("size", SIZES, ids=IDS)
async def test_a_replay(size: tuple[int, int], tmp_path: Path) -> None:
    path = tmp_path / "r.zst"
    make_recording(path, n=120)
    app = ReplayApp(ReplaySource(Recording(path), start=REC_START + 20, playing=False))
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.latest is not None and bool(app.screen.query(GpuCard)))
        await pilot.press("full_stop")  # a step on, as a user goes through it
        await wait_for(pilot, lambda: app.latest is not None and app.latest.time == REC_START + 21)
        await pilot.pause()
        snap = app.latest
        assert snap is not None
        shown = body(app)
        assert "REPLAY" in shown and "┃" in shown, shown  # the banner, the timeline's cursor
        for g in snap.gpus:
            assert not has_all(shown, *card_figures(g)), f"GPU {g.index}\n{shown}"
        keys = footer(app)
        for key in ("← -10s", "→ +10s", ". Step", ", Back"):
            assert key in keys, keys
