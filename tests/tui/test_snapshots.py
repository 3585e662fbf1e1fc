"""Appearance of the main and topology screens, compared with stored SVGs.

Deterministic: simulated GPUs with a frozen clock and seed, a fixed host
sample and hostname, a pre-filled history, one sampling pass and no re-arm.
Update after an intended change with ``pytest tests/tui --snapshot-update``.
"""

from __future__ import annotations

from typing import Any

import pytest
from textual.pilot import Pilot

from .conftest import first_frame, make_app

pytestmark = pytest.mark.timeout(180)


def dashboard(count: int = 2, card: str = "rtx4090"):  # type: ignore[no-untyped-def]
    app, _ = make_app(count=count, card=card, prefill=300, notify_alerts=False)
    app.paused = True  # one pass, then nothing moves
    return app


async def settle(pilot: Pilot[Any]) -> None:
    await first_frame(pilot)
    await pilot.pause()


async def on_topology(pilot: Pilot[Any]) -> None:
    await settle(pilot)
    await pilot.press("t")
    await pilot.pause()
    await pilot.pause()


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_main_screen(snap_compare, size) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(dashboard(), terminal_size=size, run_before=settle)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_topology_screen(snap_compare, size) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(dashboard(count=4), terminal_size=size, run_before=on_topology)


def test_main_screen_eight_h200(snap_compare) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(dashboard(count=8, card="h200"), terminal_size=(160, 48), run_before=settle)
