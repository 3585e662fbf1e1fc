"""Regenerate gpustation/assets/dashboard.svg, the README's screenshot.

The dashboard on two simulated RTX 4090s at 160x48, with ten minutes of
history, a fixed host sample and hostname, so the picture only changes when
the dashboard does:

    .venv/bin/python bench/make_screenshot.py [OUT.svg]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpustation.telemetry.model import HostSample  # noqa: E402
from gpustation.telemetry.sim import SimBackend  # noqa: E402
from gpustation.tui.app import DashboardApp  # noqa: E402
from gpustation.tui.source import DataSource  # noqa: E402

NOW = 1_000_000.0
HISTORY_S = 600


def host() -> HostSample:
    return HostSample(
        cpu_pct=41.0,
        cpu_per_core_pct=[35.0, 92.0, 18.0, 64.0, 8.0, 77.0, 40.0, 12.0] * 4,
        load_avg=[6.4, 5.9, 5.1],
        memory_used_mib=51_300.0,
        memory_total_mib=128_800.0,
        swap_used_mib=0.0,
        swap_total_mib=8192.0,
        disk_read_bytes_s=210_000_000.0,
        disk_write_bytes_s=4_100_000.0,
        net_rx_bytes_s=1_250_000.0,
        net_tx_bytes_s=96_000.0,
    )


async def shoot(out: Path) -> None:
    backend = SimBackend(count=2, card="rtx4090", seed=0, state_path=None, clock=lambda: NOW)
    source = DataSource(
        lambda: backend, host_source=host, hostname="workstation", clock=lambda: NOW
    )
    app = DashboardApp(source, notify_alerts=False)
    app.paused = True  # one pass: the picture must not depend on timing
    t = [NOW - HISTORY_S]
    past = SimBackend(count=2, card="rtx4090", seed=0, state_path=None, clock=lambda: t[0])
    past_source = DataSource(
        lambda: past, host_source=host, hostname="workstation", clock=lambda: t[0]
    )
    for _ in range(HISTORY_S):
        app.history.add(past_source.sample().snapshot)
        t[0] += 1.0
    async with app.run_test(size=(160, 48)) as pilot:
        deadline = time.monotonic() + 30
        while app.frame is None or not app.screen.query(".gpu-card"):
            if time.monotonic() > deadline:
                raise SystemExit("the dashboard did not draw its first frame")
            await pilot.pause(0.05)
        await pilot.pause()
        await pilot.pause()
        app.save_screenshot(filename=out.name, path=str(out.parent))
    print(f"wrote {out}")


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "gpustation/assets/dashboard.svg"
    target.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(shoot(target.resolve()))
