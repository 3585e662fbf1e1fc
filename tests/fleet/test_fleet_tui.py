"""The fleet screen and the per-host drill-down, driven with Textual's Pilot."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from gpustation.fleet.fleet import Fleet
from gpustation.telemetry.model import GpuSample, Snapshot
from gpustation.tui.fleet.screen import FleetApp, FleetScreen, FleetTable, HostScreen
from gpustation.tui.keyids import known_binding_ids
from gpustation.tui.keys import load_keymap
from gpustation.tui.widgets import GpuCard

pytestmark = pytest.mark.timeout(180)
TIMEOUT_S = 60.0


def _line(host: str, temps: list[float]) -> str:
    gpus = [
        GpuSample(index=i, name="Test GPU", temperature_c=t, power_w=100.0 + i, power_limit_w=450.0)
        for i, t in enumerate(temps)
    ]
    return json.dumps(Snapshot(hostname=host, time=1.0, simulated=True, gpus=gpus).to_dict())


def _argv_for(tmp: Path) -> Callable[[str], list[str]]:
    """Hosts played by local commands: fixed temperatures, and one host that fails."""
    temps = {"a": [40.0, 70.0], "b": [55.0]}

    def argv_for(host: str) -> list[str]:
        if host == "down":
            return [
                "sh",
                "-c",
                "echo 'ssh: connect to host down port 22: Connection refused' >&2; exit 255",
            ]
        f = tmp / f"{host}.json"
        f.write_text(_line(host, temps[host]) + "\n")
        # repeat the line so the stream stays fresh, as a real host would
        return ["sh", "-c", f"while :; do cat {f}; sleep 0.3; done"]

    return argv_for


async def _wait(pilot: Pilot[Any], condition: Callable[[], bool]) -> None:
    for _ in range(int(TIMEOUT_S / 0.1)):
        if condition():
            return
        await pilot.pause(0.1)
    raise AssertionError("condition not met in time")


def _keys(screen: FleetScreen) -> list[str]:
    return [r.key for r in screen.rows]


def test_rows_sorting_and_drill_down(tmp_path: Path) -> None:
    asyncio.run(_rows_sorting_and_drill_down(tmp_path))


async def _rows_sorting_and_drill_down(tmp_path: Path) -> None:
    fleet = Fleet(
        ["a", "b", "down"], interval=0.3, argv_for=_argv_for(tmp_path), backoff_initial_s=5
    )
    app = FleetApp([], fleet=fleet)
    async with app.run_test(size=(160, 40)) as pilot:
        await _wait(
            pilot, lambda: isinstance(app.screen, FleetScreen) and len(app.screen.rows) == 4
        )
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        await _wait(pilot, lambda: "down" in {r.status for r in screen.rows})
        # each host's row appears when its first snapshot arrives, in any order
        await _wait(pilot, lambda: _keys(screen) == ["a#0", "a#1", "b#0", "down#-"])
        table = screen.query_one(FleetTable)
        assert table.keys == ["a#0", "a#1", "b#0", "down#-"]
        down_row = table.row_text("down#-")
        assert down_row[0] == "down" and "Connection refused" in down_row[-1]
        assert table.row_text("a#1")[3] == "70"

        # sort by temperature: hottest first, the host without GPUs last
        screen.sort_by("temp")
        await pilot.pause(0.1)
        assert _keys(screen) == ["a#1", "b#0", "a#0", "down#-"]
        assert table.keys == _keys(screen)
        await pilot.press("r")
        await pilot.pause(0.1)
        assert _keys(screen) == ["a#0", "b#0", "a#1", "down#-"]
        # "s" moves on to the next column (power)
        await pilot.press("s")
        await pilot.pause(0.1)
        assert screen.sort_key == "power"
        # a click on a column header sorts by that column
        x = sum(w + 2 for w in table.widths[:2]) + 1  # inside the third column, GPU
        await pilot.click(FleetTable, offset=(x, 0))
        await pilot.pause(0.1)
        assert screen.sort_key == "gpu"

        # Enter on b's row opens b
        table.action_cursor_to(table.keys.index("b#0"))
        row = screen.selected_row()
        assert row is not None and row.key == "b#0"
        await pilot.press("enter")
        await _wait(pilot, lambda: isinstance(app.screen, HostScreen))
        host_screen = app.screen
        assert isinstance(host_screen, HostScreen) and host_screen.host == "b"
        await _wait(pilot, lambda: len(host_screen.query(GpuCard)) == 1)
        await pilot.press("escape")
        await _wait(pilot, lambda: isinstance(app.screen, FleetScreen))
    assert all(s._proc is None for s in fleet.streams.values())


def test_real_streams_from_simulated_hosts(tmp_path: Path) -> None:
    asyncio.run(_real_streams_from_simulated_hosts(tmp_path))


async def _real_streams_from_simulated_hosts(tmp_path: Path) -> None:
    # the real remote command, run locally (the ssh tests cover the transport)
    def argv_for(host: str) -> list[str]:
        state = tmp_path / host
        return [
            "env",
            f"GPUSTATION_STATE_DIR={state}",
            sys.executable,
            "-m",
            "gpustation",
            "snapshot",
            "--json",
            "--watch",
            "0.5",
            "--simulate",
            "2",
        ]

    fleet = Fleet(["h1", "h2"], interval=0.5, argv_for=argv_for)
    app = FleetApp([], fleet=fleet)
    async with app.run_test(size=(160, 40)) as pilot:
        await _wait(
            pilot,
            lambda: (
                isinstance(app.screen, FleetScreen)
                and sum(1 for r in app.screen.rows if r.gpu is not None) == 4
            ),
        )
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        first = screen.histories["h1"]
        await _wait(pilot, lambda: len(first._times.get(0, ())) >= 2)


def test_app_takes_interval_and_ssh_config_from_config_unless_given(
    gpustation_dirs: dict[str, Path],
) -> None:
    (gpustation_dirs["config"] / "config.toml").write_text(
        "[fleet]\ninterval = 2\n"
        'remote_command = "/opt/gs/bin/gpustation"\nssh_config = "/etc/lab"\n'
    )
    app = FleetApp(["box1"], refresh_s=1.0)
    assert isinstance(app.fleet, Fleet)
    argv = app.fleet.streams["box1"].argv
    assert app.fleet.interval == 2.0
    assert argv[1:3] == ["-F", "/etc/lab"]
    assert argv[-5:] == ["/opt/gs/bin/gpustation", "snapshot", "--json", "--watch", "2"]
    given = FleetApp(["box1"], refresh_s=0.5, ssh_config="/mine")
    assert isinstance(given.fleet, Fleet)
    argv = given.fleet.streams["box1"].argv
    assert given.fleet.interval == 0.5
    assert argv[1:3] == ["-F", "/mine"] and argv[-1] == "0.5"


def test_the_fleet_takes_its_keys_from_config(
    tmp_path: Path, gpustation_dirs: dict[str, Path]
) -> None:
    (gpustation_dirs["config"] / "config.toml").write_text('[keys]\n"fleet.sort" = "o"\n')

    async def scenario() -> None:
        fleet = Fleet(["a"], interval=0.3, argv_for=_argv_for(tmp_path), backoff_initial_s=5)
        app = FleetApp([], fleet=fleet, keymap=load_keymap(known_binding_ids))
        async with app.run_test(size=(160, 40)) as pilot:
            await _wait(pilot, lambda: isinstance(app.screen, FleetScreen))
            screen = app.screen
            assert isinstance(screen, FleetScreen)
            assert screen.sort_key == "host"
            await pilot.press("s")  # replaced by the remapped key
            await pilot.pause()
            assert screen.sort_key == "host"
            await pilot.press("o")
            await _wait(pilot, lambda: screen.sort_key != "host")

    asyncio.run(scenario())
