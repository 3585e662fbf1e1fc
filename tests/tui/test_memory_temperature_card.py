"""Memory temperature on the GPU card and in the snapshot table; a card with no
memory sensor is named once in the alerts screen, not shown as a gap."""

from __future__ import annotations

import pytest

from gpustation.telemetry.model import GpuSample, Snapshot
from gpustation.telemetry.table import gpu_lines
from gpustation.tui.app import DashboardApp
from gpustation.tui.cards import card_text
from gpustation.tui.widgets import GpuCard, LiveText

from .conftest import first_frame, make_app, wait_for

pytestmark = pytest.mark.timeout(120)


def card(index: int = 0, **kw: object) -> GpuSample:
    return GpuSample(index=index, name="NVIDIA H200", temperature_c=50.0, **kw)  # type: ignore[arg-type]


def test_the_card_shows_memory_temperature_coloured_by_its_distance_to_the_maximum() -> None:
    cool = card_text(card(memory_temperature_c=41.0, memory_temperature_max_c=95.0), 120)
    assert "Mem 41 C (max 95)" in cool.plain
    hot = card_text(card(memory_temperature_c=92.0, memory_temperature_max_c=95.0), 120)
    styles = {str(span.style) for span in hot.spans if "92 C" in hot.plain[span.start : span.end]}
    assert "bold white on red" in styles
    assert len(hot.plain.splitlines()) == 7  # the card keeps its height


def test_a_card_without_a_memory_sensor_shows_no_gap() -> None:
    text = card_text(card(), 120).plain
    assert "Mem " not in text.split("\n")[1] and "n/a" not in text.split("\n")[1]


def test_the_snapshot_table_has_a_memory_column_only_where_a_card_reports_it() -> None:
    gddr = Snapshot(hostname="h", time=0.0, gpus=[card(index=0)])
    assert "MemT" not in gpu_lines(gddr)[0]
    mixed = Snapshot(
        hostname="h",
        time=0.0,
        gpus=[card(memory_temperature_c=40.0, memory_temperature_max_c=95.0), card(index=1)],
    )
    header, hbm, other = gpu_lines(mixed)
    assert "MemT °C" in header
    assert "40/95" in hbm and "not reported" in other


async def test_the_alerts_screen_says_once_that_a_gddr_card_has_no_memory_sensor() -> None:
    app, _ = make_app(count=2, card="rtx4090", refresh_s=0.5)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        await wait_for(pilot, lambda: app.passes >= 3)
        notes = [a.message for a in app.alerts.notes]
        assert notes == [
            "GPU 0 (RTX 4090 (sim)): memory temperature not reported by this card",
            "GPU 1 (RTX 4090 (sim)): memory temperature not reported by this card",
        ]
        await pilot.press("a")
        await wait_for(pilot, lambda: "not reported by this card" in _alerts_text(app))
        assert _alerts_text(app).count("memory temperature not reported") == 2


async def test_an_hbm_card_gets_no_such_note() -> None:
    app, _ = make_app(count=1, card="h200", refresh_s=0.5)
    async with app.run_test(size=(160, 48)) as pilot:
        await first_frame(pilot)
        await wait_for(pilot, lambda: app.passes >= 2)
        assert app.alerts.notes == []
        assert "Mem " in app.screen.query(".gpu-card").first(GpuCard).plain


def _alerts_text(app: DashboardApp) -> str:
    return app.screen.query_one("#alert-log", LiveText).plain
