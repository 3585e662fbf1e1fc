"""Appearance of every screen at four terminal sizes, compared with stored SVGs.

Deterministic: simulated GPUs with a frozen clock and seed, a fixed host
sample and hostname, a pre-filled history, one sampling pass and no re-arm;
the runs screen reads past runs written with fixed files (times in UTC); the
fleet is a fake one with fixed host states. Update after an intended change
with ``pytest tests/tui/test_snapshots.py --snapshot-update``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable

from gpustation.fleet.ssh import DOWN, UP, HostState
from gpustation.runs.presets import load_presets
from gpustation.telemetry.model import Snapshot
from gpustation.telemetry.sim import SimBackend
from gpustation.tui.app import DashboardApp
from gpustation.tui.fleet.screen import FleetApp, FleetScreen
from gpustation.tui.modes import SCREENS_BY_MODE
from gpustation.tui.runs import LossPlot
from gpustation.tui.runs.timeline import GpuPlot
from gpustation.tui.source import DataSource

from .conftest import BUILTIN_SCREENS, Clock, first_frame, fixed_host, make_app, runs_ui, wait_for
from .pastruns import write_run

pytestmark = pytest.mark.timeout(180)

SIZES = [(80, 24), (100, 30), (160, 48), (220, 60)]
IDS = ["80x24", "100x30", "160x48", "220x60"]
ENTRY = {e.mode: e for e in SCREENS_BY_MODE}

#: pytest-textual-snapshot's fixture: app (or path), terminal_size=, run_before=... -> bool
SnapCompare = Callable[..., bool]


def dashboard(count: int = 2, card: str = "rtx4090", screens: Any = None) -> DashboardApp:
    app, _ = make_app(
        count=count, card=card, prefill=300, notify_alerts=False, screens=screens or BUILTIN_SCREENS
    )
    app.paused = True  # one pass, then nothing moves
    return app


async def settle(pilot: Pilot[Any]) -> None:
    await first_frame(pilot)
    await pilot.pause()


def after(key: str) -> Callable[[Pilot[Any]], Awaitable[None]]:
    async def run_before(pilot: Pilot[Any]) -> None:
        await settle(pilot)
        await pilot.press(key)
        await pilot.pause()
        await pilot.pause()

    return run_before


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_main_screen(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    assert snap_compare(dashboard(), terminal_size=size, run_before=settle)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_topology_screen(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    assert snap_compare(dashboard(count=4), terminal_size=size, run_before=after("t"))


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_help_screen(snap_compare: SnapCompare, size: tuple[int, int]) -> None:
    app = dashboard(screens=[*BUILTIN_SCREENS, ENTRY["control"], ENTRY["runs"]])
    assert snap_compare(app, terminal_size=size, run_before=after("question_mark"))


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_control_screen(
    snap_compare: SnapCompare, size: tuple[int, int], gpustation_dirs: dict[str, Path]
) -> None:
    app = dashboard(screens=[*BUILTIN_SCREENS, ENTRY["control"]])
    assert snap_compare(app, terminal_size=size, run_before=after("c"))


@pytest.fixture
def past_runs(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[str]]:
    """Three finished runs of shipped presets, with fixed files; local time is UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    presets, _ = load_presets()
    root = gpustation_dirs["data"] / "runs"
    ids = []
    for n, (name, overrides, status, code) in enumerate(
        [
            ("resnet50-bf16", {"batch_size": 192}, "failed", 75),
            ("lora-tiny", {}, "succeeded", 0),
            ("resnet50-bf16", {}, "succeeded", 0),
        ]
    ):
        run_id = f"{name}-2023111{4 + n}-2213{20 + n}-ab1{n}"
        write_run(
            root,
            run_id,
            presets[name],
            overrides=overrides,
            gpus=[n % 2],
            status=status,
            exit_code=code,
            started_at=1_700_000_000.0 + n * 86_400,
            steps=150 if status == "succeeded" else 60,
            telemetry=True,
        )
        ids.append(run_id)
    yield ids
    monkeypatch.delenv("TZ")
    time.tzset()


async def on_runs(pilot: Pilot[Any]) -> None:
    await settle(pilot)
    app = pilot.app
    await pilot.press("r")
    ui = runs_ui(app)
    await wait_for(pilot, lambda: ui.presets is not None and len(ui.history_ids) == 3)
    # the newest run is selected: its log and curve are read
    await wait_for(pilot, lambda: ui.selected is not None and ui.views[ui.selected].loaded)
    view = ui.views[ui.selected]  # type: ignore[index]
    await wait_for(pilot, lambda: bool(view.lines) and bool(view.losses[0]))
    await wait_for(pilot, lambda: len(view.timeline.gpu) == 76)
    plot = app.screen.query_one(LossPlot)
    gpus = app.screen.query_one(GpuPlot)
    await wait_for(pilot, lambda: plot.draws >= 1 or not plot.size.height)
    await wait_for(pilot, lambda: gpus.draws >= 1 or not gpus.size.height)
    # A table measures the rows and cells it was given when it is next idle: until
    # then its columns are as wide as their labels (the picture waits for that).
    table = app.screen.query_one("#runs-table", DataTable)
    await wait_for(pilot, lambda: not table._require_update_dimensions and not table._updated_cells)
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_runs_screen(
    snap_compare: SnapCompare, size: tuple[int, int], past_runs: list[str]
) -> None:
    app = dashboard(screens=[*BUILTIN_SCREENS, ENTRY["runs"]])
    assert snap_compare(app, terminal_size=size, run_before=on_runs)


# ---- the fleet ----------------------------------------------------------------------------

NOW = 1_000_000.0


def _snapshot(host: str, count: int, card: str) -> Snapshot:
    clock = Clock()
    backend = SimBackend(count=count, card=card, seed=0, state_path=None, clock=clock)
    source = DataSource(lambda: backend, host_source=fixed_host, hostname=host, clock=clock)
    return source.sample().snapshot


class FakeFleet:
    """A fleet with fixed states: two hosts up (simulated GPUs), one down."""

    def __init__(self) -> None:
        up = {"gpu-a": _snapshot("gpu-a", 2, "rtx4090"), "gpu-b": _snapshot("gpu-b", 4, "h200")}
        self._states = [
            HostState(name, UP, snap, None, NOW - 1, NOW - 60, None, 1, 1.0)
            for name, snap in up.items()
        ] + [
            HostState(
                "lab-7",
                DOWN,
                None,
                "ssh: connect to host lab-7 port 22: Connection refused",
                None,
                None,
                NOW + 12,
                3,
                1.0,
            )
        ]

    @property
    def hosts(self) -> list[str]:
        return [st.name for st in self._states]

    def start(self) -> FakeFleet:
        return self

    def close(self) -> None:
        pass

    def states(self) -> list[HostState]:
        return list(self._states)

    def state(self, host: str) -> HostState:
        return next(st for st in self._states if st.name == host)

    def rows(self, now: float | None = None) -> list[Any]:
        from gpustation.fleet.fleet import rows_from_states

        return rows_from_states(self._states, NOW)


async def on_fleet(pilot: Pilot[Any]) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, FleetScreen) and len(app.screen.rows) == 7)
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_fleet_screen(
    snap_compare: SnapCompare, size: tuple[int, int], gpustation_dirs: dict[str, Path]
) -> None:
    app = FleetApp([], fleet=FakeFleet())  # type: ignore[arg-type]
    assert snap_compare(app, terminal_size=size, run_before=on_fleet)


def test_main_screen_eight_h200(snap_compare: SnapCompare) -> None:
    assert snap_compare(dashboard(count=8, card="h200"), terminal_size=(160, 48), run_before=settle)


def test_main_screen_with_a_device_node_holder(snap_compare: SnapCompare) -> None:
    # VRAM no listed process holds and the process keeping its device node open
    app, backend = make_app(count=2, prefill=300, notify_alerts=False, screens=BUILTIN_SCREENS)
    backend.poke(0, orphaned_mib=3277, holders=[(31337, "python -c import torch; torch.zeros(1)")])
    app.paused = True
    assert snap_compare(app, terminal_size=(160, 48), run_before=settle)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_launch_form(
    snap_compare: SnapCompare, size: tuple[int, int], gpustation_dirs: dict[str, Path]
) -> None:
    from .test_launch_form import FormApp, preset

    async def opened(pilot: Pilot[Any]) -> None:
        from gpustation.tui.runs import LaunchDialog

        await wait_for(pilot, lambda: isinstance(pilot.app.screen, LaunchDialog))
        # the forecast line, made in a worker: the preset never ran here
        line = pilot.app.screen.query_one("#launch-forecast")
        await wait_for(pilot, lambda: "never ran here" in str(line.render()))
        await pilot.pause()

    assert snap_compare(FormApp(preset()), terminal_size=size, run_before=opened)


async def on_compare(pilot: Pilot[Any]) -> None:
    """The runs screen with the three past runs marked, then compared."""
    from gpustation.tui.runs import CompareScreen
    from gpustation.tui.runs.overlay import OverlayPlot

    await on_runs(pilot)
    app = pilot.app
    table = app.screen.query_one("#runs-table", DataTable)
    table.focus()
    for row in range(table.row_count):
        table.move_cursor(row=row)
        await pilot.pause()
        await pilot.press("space")
    # the last row's run is now selected: the screen behind the overlay (its GPU
    # plot shows at the edge) is drawn for it before the overlay opens
    ui = runs_ui(app)
    await wait_for(pilot, lambda: ui.selected is not None and ui.views[ui.selected].loaded)
    view = ui.views[ui.selected]  # type: ignore[index]
    plots = [app.screen.query_one(LossPlot), app.screen.query_one(GpuPlot)]
    await wait_for(pilot, lambda: all(p.shows(view) or not p.size.height for p in plots))
    await pilot.press("v")
    await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))
    compare = app.screen
    await wait_for(pilot, lambda: len(compare.shown) == 3)  # type: ignore[attr-defined]
    plot = compare.query_one("#compare-plot", OverlayPlot)
    await wait_for(pilot, lambda: plot.draws >= 1 or not plot.size.height)
    await pilot.pause()


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_compare_screen(
    snap_compare: SnapCompare, size: tuple[int, int], past_runs: list[str]
) -> None:
    app = dashboard(screens=[*BUILTIN_SCREENS, ENTRY["runs"]])
    assert snap_compare(app, terminal_size=size, run_before=on_compare)
