"""The dashboard says on its banner which simulated machine it reused from last time."""

from __future__ import annotations

import pytest

from gpustation.errors import NoDriverError
from gpustation.telemetry.registry import open_backend
from gpustation.tui.app import DashboardApp
from gpustation.tui.source import DataSource, dashboard_backend
from gpustation.tui.widgets import LiveText

from .conftest import first_frame


def text_of(app: DashboardApp, selector: str) -> str:
    return app.screen.query_one(selector, LiveText).plain


@pytest.fixture
def no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpustation.telemetry.nvml as nvml

    def fail(**_: object) -> None:
        raise NoDriverError("NVML could not start: no driver.")

    monkeypatch.setattr(nvml, "NvmlBackend", fail)


async def test_a_plain_dashboard_after_one_simulated_gpu_says_it_shows_the_kept_machine(
    no_driver: None,
) -> None:
    open_backend(simulate=1).close()  # what `gpustation run --simulate 1 ...` leaves behind
    source = DataSource(lambda: dashboard_backend(None, None), hostname="laptop")
    app = DashboardApp(source, refresh_s=10.0)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        banner = text_of(app, "#banner")
        assert "1 simulated RTX 4090, as last time; --simulate N to change" in banner
        assert len(app.screen.query(".gpu-card")) == 1
    source.close()


async def test_a_dashboard_given_its_flags_says_nothing_was_kept(no_driver: None) -> None:
    open_backend(simulate=1, sim_card="h200").close()
    source = DataSource(lambda: dashboard_backend(3, "rtx4090"), hostname="laptop")
    app = DashboardApp(source, refresh_s=10.0)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        assert "as last time" not in text_of(app, "#banner")
        assert len(app.screen.query(".gpu-card")) == 3
    source.close()
