"""Regenerate the README's screenshots in gpustation/assets/.

``dashboard`` (dashboard.svg): the dashboard on two simulated RTX 4090s at
160x48, with ten minutes of history, a fixed host sample and hostname, so the
picture only changes when the dashboard does.

``runs`` (runs.svg): the runs screen at 160x48 beside the same simulated GPUs,
with a live run of the shipped ``lora-tiny`` preset on the CPU (tiny sizes,
``device=cpu``), taken once its loss curve has a few points and an eval loss;
the run is stopped afterwards. It runs in a temporary config/data/state dir
and needs the training extras (torch, peft).

    .venv/bin/python bench/make_screenshot.py [dashboard|runs] [OUT.svg]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


#: the lora-tiny preset made small enough for a CPU: a curve within seconds
LORA_ON_CPU = [
    "device=cpu",
    "model_preset=tiny",
    "precision=fp32",
    "compile=false",
    "seq_len=64",
    "batch_size=8",
    "steps=2000",
    "warmup_steps=1",
    "log_every=2",
    "eval_every=10",
    "eval_batches=2",
]
#: the picture is taken once the run has this many losses and eval losses
LOSS_POINTS, EVAL_POINTS = 20, 3


async def wait_until(pilot: Any, what: str, condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what} after {timeout:.0f} s")
        await pilot.pause(0.1)


async def shoot_runs(out: Path) -> None:
    from textual.widgets import OptionList

    from gpustation.tui.runs import LossPlot, RunsScreen

    backend = SimBackend(count=2, card="rtx4090", seed=0, state_path=None)
    source = DataSource(lambda: backend, host_source=host, hostname="workstation")
    app = DashboardApp(source, notify_alerts=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_until(pilot, "the first frame", lambda: app.frame is not None, 30)
        await pilot.press("r")
        await wait_until(pilot, "the runs screen", lambda: isinstance(app.screen, RunsScreen), 30)
        assert isinstance(app.screen, RunsScreen)
        ui = app.screen.ui
        await wait_until(pilot, "the presets", lambda: ui.presets is not None, 30)
        assert ui.presets is not None
        # The preset list's cursor on the preset that runs, as after launching it with l.
        presets = app.screen.query_one("#runs-presets", OptionList)
        await wait_until(pilot, "the preset list", lambda: presets.option_count > 0, 30)
        ids = [presets.get_option_at_index(i).id for i in range(presets.option_count)]
        presets.highlighted = ids.index("lora-tiny")
        ui.launch(ui.presets["lora-tiny"], dict(s.split("=", 1) for s in LORA_ON_CPU), [0])
        await wait_until(pilot, "the run to start", lambda: bool(ui.live_active()), 60)
        run_id = next(iter(ui.live_active())).id
        plot = app.screen.query_one("#run-plot", LossPlot)
        drawn = plot.draws

        def curve() -> bool:
            # the run's view as the controller holds it now (a refresh may replace it)
            view = ui.views.get(run_id)
            if view is None:
                return False
            losses = view.losses[0] if view.losses else []
            evals = view.evals[0] if view.evals else []
            return len(losses) >= LOSS_POINTS and len(evals) >= EVAL_POINTS

        try:
            await wait_until(pilot, "a loss curve", curve, 300)
            await wait_until(pilot, "the curve drawn", lambda: plot.draws > drawn, 30)
            await pilot.pause(0.2)
            app.save_screenshot(filename=out.name, path=str(out.parent))
        finally:
            view = ui.views[run_id]
            ui.stop(view)
            await wait_until(pilot, "the run to stop", lambda: not ui.views[run_id].active, 60)
    print(f"wrote {out}")


def main() -> None:
    args = sys.argv[1:]
    which = args.pop(0) if args and args[0] in ("dashboard", "runs") else "dashboard"
    target = Path(args[0]) if args else REPO / "gpustation" / "assets" / f"{which}.svg"
    target.parent.mkdir(parents=True, exist_ok=True)
    if which == "dashboard":
        asyncio.run(shoot(target.resolve()))
        return
    with tempfile.TemporaryDirectory(prefix="gs-shot-") as tmp:
        for kind in ("config", "data", "state"):
            Path(tmp, kind).mkdir()
            os.environ[f"GPUSTATION_{kind.upper()}_DIR"] = str(Path(tmp, kind))
        asyncio.run(shoot_runs(target.resolve()))


if __name__ == "__main__":
    main()
