"""The dashboard driven through its keys with Textual's pilot."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Select

from gpustation.errors import NoDriverError
from gpustation.telemetry.registry import open_backend
from gpustation.tui.app import DashboardApp
from gpustation.tui.dialogs import KillDialog
from gpustation.tui.keys import KeymapConfig
from gpustation.tui.screens import DashboardScreen
from gpustation.tui.source import DataSource
from gpustation.tui.widgets import GpuCard, HistoryGraph, LiveText, ProcessTable
from tests.receiver import Receiver

from .conftest import Clock, RealLookingSim, first_frame, make_app, notifications, wait_for

pytestmark = pytest.mark.timeout(120)


def text_of(app: DashboardApp, selector: str) -> str:
    return app.screen.query_one(selector, LiveText).plain


async def test_first_frame_shows_every_gpu_and_the_simulated_banner() -> None:
    app, _ = make_app(count=2)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        cards = list(app.screen.query(GpuCard))
        assert [c.index for c in cards] == [0, 1]
        assert "RTX 4090" in cards[0].plain and "Throttle" in cards[0].plain
        assert "SIMULATED" in text_of(app, "#banner")
        assert "workstation" in text_of(app, "#banner")
        host = text_of(app, "#host")
        assert "CPU" in host and "38 %" in host and "40.2G/125.8G" in host and "load 3.10" in host


async def test_switching_screens_with_keys() -> None:
    app, _ = make_app(count=2)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        await pilot.press("t")
        await wait_for(pilot, lambda: "GPU interconnect" in text_of(app, "#topology"))
        assert app.current_mode == "topology"
        assert "PIX" in text_of(app, "#topology")
        await pilot.press("t")  # the same key goes back
        assert app.current_mode == "dashboard"
        await pilot.press("a")
        assert app.current_mode == "alerts"
        await pilot.press("question_mark")
        assert app.current_mode == "help"
        assert "Topology" in text_of(app, "#help")
        await pilot.press("escape")
        assert app.current_mode == "dashboard"
        assert isinstance(app.screen, DashboardScreen)


async def test_m_cycles_the_graphed_metric_and_the_select_follows() -> None:
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        graph = app.screen.query_one(HistoryGraph)
        assert "GPU utilisation" in graph.plain
        await pilot.press("m")
        await pilot.pause()
        assert app.metric == "power"
        assert "GPU 0 power" in graph.plain and " W" in graph.plain
        assert app.screen.query_one("#metric", Select).value == "power"
        # and back from the select to the app
        app.screen.query_one("#metric", Select).value = "temp"
        await pilot.pause()
        assert app.metric == "temp"
        assert "temperature" in graph.plain


async def test_plus_and_minus_change_the_refresh_within_limits() -> None:
    app, _ = make_app(count=1, refresh_s=1.0)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        await pilot.press("minus")
        assert app.refresh_s == 0.5
        for _ in range(5):
            await pilot.press("minus")
        assert app.refresh_s == 0.25
        for _ in range(10):
            await pilot.press("plus")
        assert app.refresh_s == 10.0
        await pilot.pause()
        assert "every 10 s" in text_of(app, "#status")


async def test_p_pauses_and_resumes_sampling() -> None:
    app, _ = make_app(count=1, refresh_s=0.25)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        await wait_for(pilot, lambda: app.passes >= 2)
        await pilot.press("p")
        assert app.paused
        await pilot.pause(0.3)  # a pass already running may still land
        stopped_at = app.passes
        await pilot.pause(1.0)
        assert app.passes == stopped_at
        assert "PAUSED" in text_of(app, "#status")
        await pilot.press("p")
        await wait_for(pilot, lambda: app.passes > stopped_at + 1)


class FakeKill:
    def __init__(self, error: BaseException | None = None) -> None:
        self.calls: list[tuple[int, int]] = []
        self.error = error

    def __call__(self, pid: int, sig: int) -> None:
        self.calls.append((pid, sig))
        if self.error is not None:
            raise self.error


async def open_kill_dialog(app: DashboardApp, pilot: Pilot[int]) -> int:
    await first_frame(pilot)
    table = app.screen.query_one(ProcessTable)
    await wait_for(pilot, lambda: table.selected() is not None)
    pid = table.selected().pid  # type: ignore[union-attr]
    await pilot.press("k")
    await wait_for(pilot, lambda: isinstance(app.screen, KillDialog))
    return pid


@pytest.mark.parametrize(("key", "sig"), [("t", signal.SIGTERM), ("K", signal.SIGKILL)])
async def test_kill_dialog_names_the_process_and_sends_the_chosen_signal(
    key: str, sig: signal.Signals
) -> None:
    kill = FakeKill()
    app, _ = make_app(count=2, backend_cls=RealLookingSim, kill=kill)
    async with app.run_test(size=(160, 48)) as pilot:
        pid = await open_kill_dialog(app, pilot)
        dialog = app.screen
        labels = " ".join(str(w.render()) for w in dialog.query("Label"))
        assert str(pid) in labels and "user sim" in labels and "python" in labels
        await pilot.press(key)
        await wait_for(pilot, lambda: not isinstance(app.screen, KillDialog))
        assert kill.calls == [(pid, int(sig))]
        assert any(f"Sent {sig.name} to PID {pid}" in m for m in notifications(app))


async def test_kill_dialog_cancel_sends_nothing() -> None:
    kill = FakeKill()
    app, _ = make_app(count=2, backend_cls=RealLookingSim, kill=kill)
    async with app.run_test(size=(160, 48)) as pilot:
        await open_kill_dialog(app, pilot)
        await pilot.press("enter")  # the focused button is Cancel
        await wait_for(pilot, lambda: not isinstance(app.screen, KillDialog))
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, KillDialog))
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, KillDialog))
        assert kill.calls == []


async def test_kill_permission_denied_says_whose_process_it_is() -> None:
    kill = FakeKill(PermissionError(1, "Operation not permitted"))
    app, _ = make_app(count=2, backend_cls=RealLookingSim, kill=kill)
    async with app.run_test(size=(160, 48)) as pilot:
        pid = await open_kill_dialog(app, pilot)
        await pilot.press("t")
        await wait_for(pilot, lambda: bool(kill.calls))
        await pilot.pause()
        expected = (
            f"not permitted: PID {pid} belongs to sim; run gpustation as that user or as root"
        )
        assert expected in notifications(app)


async def test_kill_of_a_vanished_process_says_already_gone() -> None:
    kill = FakeKill(ProcessLookupError())
    app, _ = make_app(count=2, backend_cls=RealLookingSim, kill=kill)
    async with app.run_test(size=(160, 48)) as pilot:
        pid = await open_kill_dialog(app, pilot)
        await pilot.press("K")
        await wait_for(pilot, lambda: bool(kill.calls))
        await pilot.pause()
        assert f"PID {pid} is already gone." in notifications(app)


async def test_simulated_processes_are_never_signalled() -> None:
    kill = FakeKill()
    app, _ = make_app(count=2, kill=kill)
    async with app.run_test(size=(160, 48)) as pilot:
        pid = await open_kill_dialog(app, pilot)
        await pilot.press("K")
        await wait_for(pilot, lambda: not isinstance(app.screen, KillDialog))
        await pilot.pause()
        assert kill.calls == []
        assert f"PID {pid} is a simulated process: no signal was sent." in notifications(app)


async def test_simulated_throttling_raises_alerts_in_the_status_line_and_log() -> None:
    clock = Clock()
    app, backend = make_app(count=2, clock=clock, refresh_s=0.25)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        backend.poke(0, load=1.0, ambient_c=70.0)
        backend.poke(1, load=0.0)
        clock.t += 120.0  # two minutes of heat at full load
        await wait_for(pilot, lambda: "GPU0 power cap" in text_of(app, "#status"))
        status = text_of(app, "#status")
        assert "GPU0 thermal throttle" in status and "GPU0 hot" in status
        assert "GPU1" not in status
        rules = {(a.rule, a.gpu) for a in app.alerts.log}
        assert {("power_cap", 0), ("thermal_throttle", 0), ("temp_near_slowdown", 0)} <= rules
        await pilot.press("a")
        await wait_for(pilot, lambda: "held back by its power limit" in text_of(app, "#alert-log"))


async def test_a_lost_gpu_is_an_alert_and_its_card_says_so() -> None:
    clock = Clock()
    app, backend = make_app(count=2, clock=clock, refresh_s=0.25)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        backend.poke(1, lost=True)
        await wait_for(pilot, lambda: "GPU1 LOST" in text_of(app, "#status"))
        assert "LOST" in app.screen.query_one("#gpu-1", GpuCard).plain


async def test_a_lost_gpu_is_notified_through_the_shared_alert_notifier(
    receiver: Receiver, gpustation_dirs: dict[str, Path]
) -> None:
    (gpustation_dirs["config"] / "config.toml").write_text(
        f'[notify]\nurls = ["{receiver.url}"]\nbell = false\nevents = ["gpu_lost"]\n'
    )
    clock = Clock()
    app, backend = make_app(count=2, clock=clock, refresh_s=0.25)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        backend.poke(0, load=1.0, ambient_c=70.0)  # hot, which [notify] leaves out
        backend.poke(1, lost=True)
        clock.t += 120.0
        await wait_for(pilot, lambda: "GPU1 LOST" in text_of(app, "#status"))
        await wait_for(pilot, receiver.got.is_set)
    (message,) = receiver.messages
    assert message["title"] == "gpustation: GPU1 LOST on workstation"
    assert "GPU 1 is lost" in message["message"]


async def test_a_notify_url_apprise_cannot_use_is_said_on_the_dashboard_redacted(
    gpustation_dirs: dict[str, Path],
) -> None:
    (gpustation_dirs["config"] / "config.toml").write_text(
        '[notify]\nurls = ["mailto://alice:hunter2-horse@"]\nbell = false\n'
    )
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        await wait_for(pilot, lambda: any("apprise cannot use" in n for n in notifications(app)))
    (said,) = [n for n in notifications(app) if "apprise cannot use" in n]
    assert "mailto://alice:***@" in said and "hunter2" not in said


async def test_when_nvml_cannot_start_the_dashboard_runs_on_simulated_gpus_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gpustation.telemetry.nvml.backend as nvml

    def no_driver(**_: object) -> None:
        raise NoDriverError(
            "NVML could not start: libnvidia-ml.so.1: cannot open shared object file."
        )

    # the registry opens the NVML backend through its module's NvmlBackend
    monkeypatch.setattr(nvml, "NvmlBackend", no_driver)
    source = DataSource(lambda: open_backend(fallback_to_sim=True), hostname="laptop")
    app = DashboardApp(source, refresh_s=10.0)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        banner = text_of(app, "#banner")
        assert "SIMULATED" in banner
        assert "libnvidia-ml.so.1: cannot open shared object file" in banner
        assert "Showing simulated GPUs" in banner
        assert app.screen.query_one("#banner").size.height == 2
    source.close()


async def test_the_nvml_note_shrinks_to_the_banner_s_one_line_after_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gpustation.telemetry.nvml as nvml

    def no_driver(**_: object) -> None:
        raise NoDriverError("NVML could not start: " + "a long reason " * 20)

    monkeypatch.setattr(nvml, "NvmlBackend", no_driver)
    source = DataSource(lambda: open_backend(fallback_to_sim=True), hostname="laptop")
    app = DashboardApp(source, refresh_s=10.0)
    app.note_full_s = 3600.0  # the test says when the while is over
    async with app.run_test(size=(100, 30)) as pilot:
        await first_frame(pilot)
        banner = app.screen.query_one("#banner")
        assert banner.size.height >= 3  # in full at first
        assert not app.note_collapsed
        app.collapse_note()  # what the timer does when note_full_s has passed
        await wait_for(pilot, lambda: banner.size.height == 1)
        line = text_of(app, "#banner")
        assert "SIMULATED" in line and "NVML could not start" in line and line.endswith("…")
        # the rows it gave back go to the screen: the process table is still in view
        table = app.screen.query_one("#proc-table")
        assert table.region.bottom <= app.screen.size.height - 2
    source.close()


async def test_the_nvml_note_collapses_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpustation.telemetry.nvml as nvml

    def no_driver(**_: object) -> None:
        raise NoDriverError("NVML could not start: " + "a long reason " * 20)

    monkeypatch.setattr(nvml, "NvmlBackend", no_driver)
    source = DataSource(lambda: open_backend(fallback_to_sim=True), hostname="laptop")
    app = DashboardApp(source, refresh_s=10.0)
    app.note_full_s = 0.2  # the timer armed by the first frame, not the test, collapses it
    async with app.run_test(size=(100, 30)) as pilot:
        await first_frame(pilot)
        await wait_for(pilot, lambda: app.note_collapsed)
        banner = app.screen.query_one("#banner")
        await wait_for(pilot, lambda: banner.size.height == 1)
    source.close()


async def test_process_table_sorts_and_filters() -> None:
    app, backend = make_app(count=2)
    for i in (0, 1):
        backend.poke(i, load=1.0)  # a job on each GPU
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        table = app.screen.query_one(ProcessTable)
        await wait_for(pilot, lambda: len(table.visible_rows()) >= 1)
        rows = table.visible_rows()
        mems = [r.gpu_memory_mib or 0 for r in rows]
        assert mems == sorted(mems, reverse=True)  # default: most GPU memory first
        await pilot.press("s")
        assert table.sort_key == "sm"
        await pilot.press("s")
        assert table.sort_key == "power"
        await pilot.press("s", "s")
        assert table.sort_key == "cpu"
        await pilot.press("s", "s", "s", "s")
        assert table.sort_key == "user"
        pids = [r.pid for r in table.visible_rows()]
        assert len(pids) == 2
        # a click on a header sorts by that column; a second click reverses
        await pilot.click("#proc-table", offset=(2, 0))
        assert table.sort_key == "pid" and not table.sort_reverse
        assert [r.pid for r in table.visible_rows()] == sorted(pids)
        await pilot.click("#proc-table", offset=(2, 0))
        assert [r.pid for r in table.visible_rows()] == sorted(pids, reverse=True)
        target = rows[-1]
        await pilot.press("slash")
        await pilot.press(*str(target.pid))
        await pilot.pause()
        assert [r.pid for r in table.visible_rows()] == [target.pid]
        await pilot.press("escape")
        await pilot.pause()
        assert len(table.visible_rows()) == len(rows)


@pytest.mark.parametrize(
    ("size", "count", "compact", "columns"),
    [
        ((80, 24), 2, True, 1),
        ((160, 48), 2, False, 2),
        ((160, 48), 8, True, 1),
        ((200, 50), 8, True, 2),
    ],
)
async def test_layout_adapts_to_terminal_size_and_gpu_count(
    size: tuple[int, int], count: int, compact: bool, columns: int
) -> None:
    app, _ = make_app(count=count)
    async with app.run_test(size=size) as pilot:
        await first_frame(pilot)
        cards = list(app.screen.query(GpuCard))
        assert len(cards) == count
        assert all(c.compact == compact for c in cards)
        xs = {c.region.x for c in cards}
        assert len(xs) == columns
        # every card shows its own GPU's name and temperature, not a placeholder
        assert all(("RTX 4090" in c.plain and " C" in c.plain) or "C " in c.plain for c in cards)


@pytest.mark.parametrize("size", [(80, 24), (100, 30), (160, 48), (220, 60)])
async def test_the_process_table_and_the_screen_s_keys_stay_in_view(size: tuple[int, int]) -> None:
    from textual.widgets._footer import FooterKey

    from gpustation.tui.modes import SCREENS_BY_MODE

    app, _ = make_app(count=2, screens=SCREENS_BY_MODE)
    async with app.run_test(size=size) as pilot:
        await first_frame(pilot)
        await pilot.pause()
        table = app.screen.query_one("#proc-table")
        # the header and the first process row are above the status line
        assert table.region.y + 2 <= size[1] - 2
        keys = [k.key for k in app.screen.query(FooterKey) if not k.has_class("-command-palette")]
        assert keys[:3] == ["k", "slash", "s"]  # the screen's own keys first
        footer_w = sum(k.outer_size.width for k in app.screen.query(FooterKey))
        if size[0] >= 100:
            # every screen switch fits (at 100x30 c and r used to drop off the end)
            assert {"c", "r", "t", "a", "p", "q"} <= set(keys)
            assert footer_w <= size[0]


async def test_command_palette_lists_the_dashboard_actions() -> None:
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        titles = {c.title for c in app.get_system_commands(app.screen)}
        for title in (
            "Show topology",
            "Show alerts",
            "Show help",
            "Graph power",
            "Refresh slower",
            "Refresh faster",
            "Pause / resume sampling",
            "Kill selected process",
            "Filter processes",
        ):
            assert title in titles
        # every app binding has an id (so keys can be remapped)
        assert all(b.id for b in DashboardApp.BINDINGS)  # type: ignore[union-attr]


@pytest.mark.parametrize(("size", "count"), [((160, 48), 2), ((80, 24), 2)])
async def test_clicking_a_card_shows_the_power_limit_range(
    size: tuple[int, int], count: int
) -> None:
    app, _ = make_app(count=count)
    async with app.run_test(size=size) as pilot:
        await first_frame(pilot)
        card = app.screen.query_one("#gpu-1", GpuCard)
        assert "150-600 W" not in card.plain
        await pilot.click("#gpu-1")
        await pilot.pause()
        assert card.has_focus
        assert "default 450, 150-600 W" in card.plain


async def test_typing_in_the_filter_does_not_trigger_dashboard_keys() -> None:
    app, _ = make_app(count=1)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        await pilot.press("slash", "q", "t", "m", "p")
        await pilot.pause()
        assert app.is_running and app.current_mode == "dashboard"
        assert app.metric == "util" and not app.paused
        assert app.screen.query_one(ProcessTable).filter_text == "qtmp"


async def test_a_gpu_index_the_machine_lacks_is_reported_not_retried() -> None:
    from gpustation.telemetry.sim import SimBackend

    backend = SimBackend(count=2, seed=0, state_path=None, clock=Clock())
    app = DashboardApp(DataSource(lambda: backend, gpus=[5]), refresh_s=0.25)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.error is not None)
        assert "no GPU 5" in text_of(app, "#banner")
        await pilot.pause(0.6)
        assert app.passes == 0 and app.next_pass_s is None


def test_run_dashboard_hands_hosts_to_the_fleet_view(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    import gpustation.tui.fleet.screen as fleet
    from gpustation.commands.dashboard import run as run_dashboard

    seen: list[list[str]] = []

    def fake_run_fleet(
        hosts: list[str], refresh_s: float, ssh_config: str | None, keymap: KeymapConfig
    ) -> int:
        seen.append(hosts)
        assert keymap.problems == []  # read from config.toml (none here) and handed over
        return 7

    monkeypatch.setattr(fleet, "run_fleet", fake_run_fleet)
    args = argparse.Namespace(gpus=None, simulate=None, sim_card=None, refresh=1.0, host=["a", "b"])
    assert run_dashboard(args) == 7
    assert seen == [["a", "b"]]


def test_run_dashboard_rejects_a_bad_gpu_list_before_starting() -> None:
    import argparse

    from gpustation.commands.dashboard import run as run_dashboard
    from gpustation.errors import UsageError

    args = argparse.Namespace(gpus="zero", simulate=1, sim_card=None, refresh=1.0, host=[])
    with pytest.raises(UsageError, match="--gpus"):
        run_dashboard(args)


async def test_the_kill_dialog_targets_the_row_chosen_with_mouse_or_keys() -> None:
    kill = FakeKill()
    app, backend = make_app(count=2, backend_cls=RealLookingSim, kill=kill)
    for i in (0, 1):
        backend.poke(i, load=1.0)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        table = app.screen.query_one(ProcessTable)
        await wait_for(pilot, lambda: len(table.visible_rows()) == 2)
        first, second = table.visible_rows()
        await pilot.click("#proc-table", offset=(3, 2))  # the second row
        assert table.selected() == second
        await pilot.press("up")
        assert table.selected() == first
        await pilot.press("down", "k")
        await wait_for(pilot, lambda: isinstance(app.screen, KillDialog))
        await pilot.press("t")
        await wait_for(pilot, lambda: bool(kill.calls))
        assert kill.calls == [(second.pid, int(signal.SIGTERM))]


async def test_a_hanging_driver_call_is_shown_and_the_ui_keeps_answering() -> None:
    import threading

    from gpustation.tui.source import Frame

    release = threading.Event()

    class HangingSource(DataSource):
        calls = 0

        def sample(self) -> Frame:
            frame = super().sample()
            if self.calls > 0:
                release.wait(30)  # a driver call that does not return
            self.calls += 1
            return frame

    _, backend = make_app(count=1)
    source = HangingSource(lambda: backend, hostname="workstation")
    app = DashboardApp(source, refresh_s=0.25)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await first_frame(pilot)
            await wait_for(pilot, lambda: "waiting for the driver" in text_of(app, "#status"))
            await pilot.press("m")  # keys still work while the worker hangs
            assert app.metric == "power"
            release.set()
            await wait_for(pilot, lambda: "waiting for the driver" not in text_of(app, "#status"))
    finally:
        release.set()


def test_dashboard_source_does_not_read_energy() -> None:
    from gpustation.telemetry.sim import SimBackend

    backend = SimBackend(count=1, card="h200", seed=0, state_path=None)
    source = DataSource(lambda: backend, hostname="box")
    try:
        frame = source.sample()
        assert backend.read_energy is False
        assert frame.snapshot.gpus[0].energy_j is None  # not shown, so not read
        assert frame.snapshot.gpus[0].power_w is not None
    finally:
        source.close()


async def test_fans_left_manual_with_no_controller_are_an_alert() -> None:
    app, backend = make_app(count=2)
    backend.control.set_fan_speed(1, 0, 80)  # as a controller killed with SIGKILL leaves them
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.passes >= 1)
        await wait_for(
            pilot,
            lambda: any(a.rule == "fans_unattended" and a.gpu == 1 for a in app.alerts.active),
        )
        backend.control.set_fan_auto(1, 0)
        app.sample_now()
        await wait_for(
            pilot, lambda: not any(a.rule == "fans_unattended" for a in app.alerts.active)
        )


async def test_shift_s_reverses_the_process_table_s_order() -> None:
    app, _ = make_app(count=2)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.passes >= 1)
        table = app.screen.query_one(ProcessTable)
        key, before = table.sort_key, table.sort_reverse
        await pilot.press("S")
        await wait_for(pilot, lambda: table.sort_reverse is not before)
        assert table.sort_key == key
        await pilot.press("S")
        await wait_for(pilot, lambda: table.sort_reverse is before)


async def test_toasts_are_plain_text_whatever_they_quote() -> None:
    """A note, a run title or a command line with ``[/]`` in it shows as written."""
    app, _ = make_app(count=1)
    async with app.run_test(size=(120, 40)) as pilot:
        await first_frame(pilot)
        app.notify("run [/] lr [red]x ended")
        app.screen.notify("host [bold]box")
        await pilot.pause()
        shown = list(app._notifications)  # what the toasts are drawn from
        assert [n.message for n in shown] == ["run [/] lr [red]x ended", "host [bold]box"]
        assert [n.markup for n in shown] == [False, False]
