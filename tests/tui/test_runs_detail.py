"""The selected run's detail on the runs screen: its GPUs on the loss curve's time
axis with a cursor, its top kernels, its energy and cost, and the sweeps."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Static
from textual.widgets.data_table import ColumnKey

from gpustation.runs import rundir
from gpustation.runs.gputrace import write_sample
from gpustation.runs.launch.start import launch
from gpustation.runs.launch.stop import stop_run
from gpustation.runs.presets import load_presets
from gpustation.runs.store.index import sync_run
from gpustation.runs.sweep.model import Point, Sweep
from gpustation.tui.app import DashboardApp
from gpustation.tui.runs import LossPlot, RunsScreen
from gpustation.tui.runs.logpane import LogPane
from gpustation.tui.runs.profile import ProfilePane
from gpustation.tui.runs.sweeps import SweepsScreen
from gpustation.tui.runs.timeline import GpuPlot

from .conftest import runs_ui, wait_for
from .pastruns import CONTENTION_PHASES, write_phased_run, write_run
from .test_runs_screen import make_app, open_runs, plain

pytestmark = pytest.mark.timeout(120)

START = 1_700_000_000.0


def power(t: int) -> float:
    return 100.0 + 10.0 * t


def write_timeline(directory: Path, seconds: int = 20) -> None:
    """1 Hz telemetry (throttled from 12 s to 14 s) and a loss every 2 s, both with ``time``."""
    telemetry = directory / rundir.TELEMETRY_FILE
    for t in range(seconds + 1):
        gpu = {
            "index": 0,
            "power_w": power(t),
            "temperature_c": 40 + t,
            "memory_used_mib": 8000,
            "utilization_gpu_pct": 50 + 2 * t,
            "energy_j": None,
            "throttle": ["sw_power_cap"] if 12 <= t <= 14 else [],
        }
        write_sample(telemetry, {"t": float(t), "time": START + t, "gpus": [gpu]})
    events = [
        {
            "t": 2.0 * k,
            "time": START + 2 * k,
            "step": 10 * k,
            "loss": round(5.0 - 0.2 * k, 4),
            "throughput": 100.0,
            "unit": "img/s",
            "total_steps": 100,
        }
        for k in range(1, seconds // 2 + 1)
    ]
    (directory / rundir.METRICS_FILE).write_text("".join(json.dumps(e) + "\n" for e in events))


def finished_run(gpustation_dirs: dict[str, Path], run_id: str = "timeline-run") -> Path:
    presets, _ = load_presets()
    directory = write_run(
        gpustation_dirs["data"] / "runs",
        run_id,
        presets["resnet50-bf16"],
        started_at=START,
        duration_s=20.0,
        steps=100,
    )
    write_timeline(directory)
    sync_run(directory)  # the history row has the energy now
    return directory


async def select(pilot: Pilot[Any], run_id: str) -> None:
    app = pilot.app
    assert isinstance(app, DashboardApp)
    ui = runs_ui(app)
    await wait_for(pilot, lambda: run_id in ui.history_ids)
    table = app.screen.query_one("#runs-table", DataTable)
    table.focus()
    table.move_cursor(row=table.get_row_index(run_id), animate=False)
    await wait_for(pilot, lambda: ui.selected == run_id and ui.views[run_id].loaded)


async def test_a_finished_run_plays_its_telemetry_beside_its_loss(
    gpustation_dirs: dict[str, Path],
) -> None:
    directory = finished_run(gpustation_dirs)
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        ui = await open_runs(pilot)
        await select(pilot, directory.name)
        view = ui.views[directory.name]
        await wait_for(
            pilot, lambda: len(view.timeline.gpu) == 21 and len(view.timeline.loss) == 10
        )
        gpu_plot = app.screen.query_one("#run-telemetry", GpuPlot)
        loss_plot = app.screen.query_one("#run-plot", LossPlot)
        await wait_for(pilot, lambda: gpu_plot.draws >= 1 and loss_plot.draws >= 1)
        # Both on the same axis: seconds since the start, not steps.
        assert "seconds since the start" in str(gpu_plot.render())
        assert "power W" in str(gpu_plot.render()) and "util %" in str(gpu_plot.render())
        assert "step" not in str(loss_plot.render())
        # At first the cursor stands at the end: the last sample and the last loss.
        await wait_for(pilot, lambda: "at the end 0:20" in plain(app, "#run-cursor"))
        line = plain(app, "#run-cursor")
        assert "step 100 · loss 3.0000" in line and f"{power(20):.0f} W" in line, line
        assert "60 °C" in line and "util 90 %" in line and "not throttled" in line, line
        # { goes back a tenth of the run (2 s), [ a sample (1 s) at a time: to 13 s.
        await pilot.press("left_curly_bracket")
        await wait_for(pilot, lambda: "▶ 0:18" in plain(app, "#run-cursor"))
        await pilot.press(*["left_square_bracket"] * 5)
        await wait_for(pilot, lambda: "▶ 0:13" in plain(app, "#run-cursor"))
        line = plain(app, "#run-cursor")
        # the sample at 13 s, and the last loss reported by then (at 12 s)
        assert "step 60 · loss 3.8000" in line, line
        assert "230 W" in line and "53 °C" in line and "util 76 %" in line, line
        assert "throttled: power cap" in line, line
        # The cursor is drawn on both plots.
        assert loss_plot.draws >= 2 and gpu_plot.draws >= 2
        # ] steps on; past the last sample it follows the end again.
        await pilot.press("right_square_bracket")
        await wait_for(pilot, lambda: "▶ 0:14" in plain(app, "#run-cursor"))
        await pilot.press("right_curly_bracket", "right_curly_bracket", "right_curly_bracket")
        await wait_for(pilot, lambda: "at the end 0:20" in plain(app, "#run-cursor"))


async def test_a_live_run_s_telemetry_grows_and_the_plot_follows(
    gpustation_dirs: dict[str, Path], tmp_path: Path
) -> None:
    trainer = tmp_path / "trainer.py"
    trainer.write_text(
        "import time\nfrom gpustation.runs.metrics import MetricsWriter\n"
        "with MetricsWriter.from_env() as m:\n"
        "    for step in range(1, 100000):\n"
        "        m.log(step=step, loss=2.0 / step, throughput=50.0, unit='img/s')\n"
        "        time.sleep(0.2)\n"
    )
    preset_dir = gpustation_dirs["config"] / "presets" / "runs"
    preset_dir.mkdir(parents=True)
    (preset_dir / "a-live.toml").write_text(f'command = ["{sys.executable}", "{trainer}"]\n')
    presets, _ = load_presets()
    handle = launch(presets["a-live"], {}, [0], simulate=1)
    try:
        app, _ = make_app(count=1)
        async with app.run_test(size=(160, 48)) as pilot:
            ui = await open_runs(pilot)
            await wait_for(pilot, lambda: ui.selected == handle.id, timeout=30)
            view = ui.views[handle.id]
            await wait_for(pilot, lambda: len(view.timeline.gpu) >= 2, timeout=30)
            gpu_plot = app.screen.query_one("#run-telemetry", GpuPlot)
            await wait_for(pilot, lambda: gpu_plot.draws >= 1)
            seen, drawn = len(view.timeline.gpu), gpu_plot.draws
            end = view.timeline.end_s()
            # More samples come in; the plot is drawn again and the cursor follows the end.
            await wait_for(pilot, lambda: len(view.timeline.gpu) >= seen + 2, timeout=30)
            await wait_for(pilot, lambda: gpu_plot.draws > drawn, timeout=10)
            assert view.timeline.end_s() > end
            line = plain(app, "#run-cursor")
            assert line.startswith("at the end"), line
            assert "energy so far" in plain(app, "#run-header")
    finally:
        stop_run(handle.run_dir, grace_s=1.0, wait_s=20.0)


TOP_OPS = {
    "profiled_steps": 5,
    "step_ms": 37.0,
    "gpu_idle_pct": 23.4,
    "cuda_kernels": [
        {"name": "cudnn::bn_fw_tr_1C11_kernel", "self_ms": 40.5, "calls": 265, "share": 0.219},
        {"name": "sm90_xmma_gemm_bf16", "self_ms": 30.1, "calls": 100, "share": 0.163},
    ],
    "cpu_ops": [{"name": "cudaLaunchKernel", "self_ms": 12.0, "calls": 900, "share": 0.065}],
}


async def test_the_profile_pane_shows_the_top_kernels_or_how_to_record_them(
    gpustation_dirs: dict[str, Path],
) -> None:
    profiled = finished_run(gpustation_dirs, "profiled-run")
    (profiled / "profile").mkdir()
    (profiled / "profile" / "top_ops.json").write_text(json.dumps(TOP_OPS))
    plain_run = finished_run(gpustation_dirs, "plain-run")
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        ui = await open_runs(pilot)
        await select(pilot, profiled.name)
        await wait_for(pilot, lambda: bool(ui.views[profiled.name].profile))
        await pilot.press("P")
        pane = app.screen.query_one("#run-profile", ProfilePane)
        await wait_for(pilot, lambda: "cudnn::bn_fw_tr_1C11_kernel" in pane.plain)
        assert pane.display and not app.screen.query_one(LogPane).display
        text = pane.plain
        assert "GPU idle 23.4 %" in text and "21.9 %" in text, text
        assert "sm90_xmma_gemm_bf16" in text and "16.3 %" in text, text
        assert "cudaLaunchKernel" in text and "6.5 %" in text, text
        # Another run, never profiled: the pane says so and how.
        await select(pilot, plain_run.name)
        await wait_for(pilot, lambda: "not profiled" in pane.plain)
        assert "--profile" in pane.plain
        # P again: the plots and the log come back.
        await pilot.press("P")
        await pilot.pause()
        assert not pane.display and app.screen.query_one(LogPane).display


def write_price(gpustation_dirs: dict[str, Path]) -> None:
    (gpustation_dirs["config"] / "config.toml").write_text(
        '[energy]\nprice_per_kwh = 0.5\ncurrency = "EUR"\n'
    )


@pytest.mark.parametrize("priced", [True, False], ids=["with a price", "without"])
async def test_energy_and_cost_in_the_header_and_the_table(
    gpustation_dirs: dict[str, Path], priced: bool
) -> None:
    if priced:
        write_price(gpustation_dirs)
    directory = finished_run(gpustation_dirs)
    # power 100 + 10 t W over 20 s: (100 + 300) / 2 * 20 = 4000 J; 100 img/s for 20 s
    energy_j, work = 4000.0, 2000.0
    app, _ = make_app(count=1)
    # wide enough for the table's energy column
    async with app.run_test(size=(240, 70)) as pilot:
        await open_runs(pilot)
        await select(pilot, directory.name)
        await wait_for(pilot, lambda: "energy" in plain(app, "#run-header"))
        header = plain(app, "#run-header")
        assert f"energy {energy_j / 3600:.1f} Wh" in header, header
        # figures of simulated GPUs say so
        per_unit = f"{energy_j / work:.3f} J/img · {work / energy_j:.2f} img/J SIMULATED"
        assert per_unit in header, header
        table = app.screen.query_one("#runs-table", DataTable)
        label = str(table.columns[ColumnKey("energy")].label)
        cell = str(table.get_cell(directory.name, "energy"))
        if priced:  # 4000 J at 0.5 EUR/kWh: 0.00056 EUR
            assert "cost <0.01 EUR" in header, header
            assert label == "energy · cost" and cell == "1.1 Wh SIMULATED · <0.01 EUR", cell
        else:
            assert "cost" not in header and "EUR" not in header, header
            assert label == "energy" and cell == "1.1 Wh SIMULATED", cell
        # the table keeps its step and loss
        assert str(table.get_cell(directory.name, "step")) == "100/100"


def write_sweep(gpustation_dirs: dict[str, Path]) -> Sweep:
    """A finished sweep of three points on simulated GPUs, its figures recorded."""
    figures = [
        {"throughput": 1000.0, "energy_per_unit_j": 0.30, "avg_power_w": 300.0},
        {"throughput": 980.0, "energy_per_unit_j": 0.22, "avg_power_w": 215.6},
        {"throughput": 700.0, "energy_per_unit_j": 0.25, "avg_power_w": 175.0},
    ]
    points = []
    for n, (power_limit, f) in enumerate(zip(("100%", "80%", "60%"), figures, strict=True)):
        full = {
            **f,
            "unit": "img/s",
            "work_unit": "img",
            "peak_power_w": f["avg_power_w"] + 20,
            "peak_temp_c": 70.0 - 5 * n,
            "throttled_s": 0.0,
            "peak_vram_mib": 8000.0,
        }
        points.append(Point(n, {"batch_size": "64"}, power_limit, 0, f"run-{n}", "succeeded",
                            figures=full))  # fmt: skip
    sweep = Sweep(
        id="20231114-221320-sweep-resnet50-bf16",
        preset="resnet50-bf16",
        axes={"batch_size": ["64"]},
        power_limits=["100%", "80%", "60%"],
        gpus=[0],
        created_at=START,
        ended_at=START + 600,
        status="finished",
        simulated=True,
        points=points,
    )
    sweep.save()
    return sweep


async def test_the_sweeps_show_their_points_plot_and_recommendation(
    gpustation_dirs: dict[str, Path],
) -> None:
    sweep = write_sweep(gpustation_dirs)
    member = finished_run(gpustation_dirs, "run-1")
    # the run is one of the sweep's points (the sweep tags it so)
    annotations = member / rundir.ANNOTATIONS_JSON
    annotations.write_text(json.dumps({"tags": [f"sweep:{sweep.id}"]}))
    sync_run(member)
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_runs(pilot)
        await select(pilot, member.name)
        await pilot.press("S")
        await wait_for(pilot, lambda: isinstance(app.screen, SweepsScreen))
        shown = app.screen
        assert isinstance(shown, SweepsScreen)
        await wait_for(pilot, lambda: shown.shown == sweep.id)
        # The setting every point shares once, above the points; each point its own.
        shared = str(shown.query_one("#sweep-shared", Static).render())
        assert shared == "every point: batch_size=64", shared
        table = shown_text(shown.query_one("#sweep-points", Static))
        lines = [line.split() for line in table.splitlines() if line.strip()]
        assert lines[0][:5] == ["#", "point", "status", "throughput", "(img/s)"], table
        rows = {line[0]: line for line in lines if line[0].isdigit()}
        assert rows["2"][1:4] == ["power=80%", "succeeded", "[SIMULATED]"], table
        assert rows["2"][4:6] == ["980.0", "0.22"] and rows["2"][-1] == "run-1", table
        assert "batch_size" not in table, table
        advice = str(shown.query_one("#sweep-advice", Static).render())
        # within 5 % of the fastest (100 %), 80 % uses the least energy per image
        assert "Fastest: batch_size=64 power=100%" in advice, advice
        assert "Least energy within 5 % of that: batch_size=64 power=80%" in advice, advice
        plot = shown.query_one("#sweep-plot", Static)
        await wait_for(pilot, lambda: "Pareto front" in str(plot.render()))
        figure = str(plot.render())
        assert "#2 recommended" in figure and "#1 fastest" in figure, figure
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))


async def test_a_contention_run_shows_its_phases_in_place_of_the_loss_curve(
    gpustation_dirs: dict[str, Path],
) -> None:
    presets, _ = load_presets()
    directory = write_phased_run(
        gpustation_dirs["data"] / "runs",
        "contention-run",
        presets["contention"],
        CONTENTION_PHASES,
        started_at=START,
    )
    plain_run = finished_run(gpustation_dirs)
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_runs(pilot)
        await select(pilot, directory.name)
        loss_plot = app.screen.query_one("#run-plot", LossPlot)
        await wait_for(pilot, lambda: "phases" in shown_text(loss_plot))
        text = shown_text(loss_plot)
        lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
        assert "SM % train/infer" in text and "W avg/peak" in text
        # train alone, infer alone, both: each workload's figures and the GPU's
        assert "9,812" in lines["train"] and "411 / 452" in lines["train"]
        assert "96 / n/a" in lines["train"]
        assert "38.5 / 41.0" in lines["infer"] and "n/a / 42" in lines["infer"]
        both = lines["both"]
        assert "7,411" in both and "92.3 / 160.8" in both and "440 / 472" in both
        assert "68 / 30" in both and "1.32x / 3.92x" in both
        assert "No loss reported" not in text
        # A run with a loss still has its curve there.
        drawn = loss_plot.draws
        await select(pilot, plain_run.name)
        await wait_for(pilot, lambda: loss_plot.draws > drawn)
        assert "phases" not in shown_text(loss_plot)
        assert "loss" in shown_text(loss_plot)  # its curve


def shown_text(widget: Static) -> str:
    """What a Static shows (a Rich renderable), as plain text at its width."""
    import io

    from rich.console import Console

    content = widget.content
    if isinstance(content, str):
        return content
    out = io.StringIO()
    Console(width=max(40, widget.content_region.width), color_system=None, file=out).print(content)
    return out.getvalue()


async def test_the_profile_pane_shows_the_top_15_kernels_and_scrolls(
    gpustation_dirs: dict[str, Path],
) -> None:
    profiled = finished_run(gpustation_dirs, "many-kernels")
    (profiled / "profile").mkdir()
    many = [
        {"name": f"kernel_{k:02d}", "self_ms": 40.0 - k, "calls": 10, "share": 0.01}
        for k in range(20)
    ]
    (profiled / "profile" / "top_ops.json").write_text(
        json.dumps({**TOP_OPS, "cuda_kernels": many})
    )
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 30)) as pilot:
        await open_runs(pilot)
        await select(pilot, profiled.name)
        await wait_for(pilot, lambda: bool(runs_ui(app).views[profiled.name].profile))
        await pilot.press("P")
        pane = app.screen.query_one("#run-profile", ProfilePane)
        await wait_for(pilot, lambda: "kernel_00" in pane.plain)
        # The same top 15 as `runs show`.
        assert "kernel_14" in pane.plain and "kernel_15" not in pane.plain
        # More rows than the pane has: it scrolls to the last line (the trace's path).
        await wait_for(pilot, lambda: pane.max_scroll_y > 0)
        assert pane.content_region.height < len(pane.plain.splitlines())
        pane.scroll_end(animate=False)
        await wait_for(pilot, lambda: pane.scroll_y == pane.max_scroll_y > 0)


async def test_the_sweeps_overlay_tells_a_dead_sweep_and_the_limits_it_left(
    gpustation_dirs: dict[str, Path],
) -> None:
    """A sweep SIGKILLed mid-point reads "running" in its file: the dashboard
    says it is dead and how to put its limits back, as `sweeps list` does."""
    import subprocess

    sweep = write_sweep(gpustation_dirs)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid whose process has ended
    sweep.status = "running"
    sweep.pid = gone.pid
    sweep.original_limits_w = {0: 450.0}
    sweep.save()
    member = finished_run(gpustation_dirs, "run-1")
    sync_run(member)
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_runs(pilot)
        await pilot.press("S")
        await wait_for(pilot, lambda: isinstance(app.screen, SweepsScreen))
        shown = app.screen
        assert isinstance(shown, SweepsScreen)
        await wait_for(pilot, lambda: shown.shown == sweep.id)
        head = str(shown.query_one("#sweep-head", Static).render())
        assert "running" not in head and f"dead: its process (pid {gone.pid}" in head, head
        assert f"gpustation sweeps restore {sweep.id}" in head, head
