"""The process table's POWER and CONTAINER columns: each process's part of a shared
GPU's power, and the container, unit or job it runs in (real cgroups)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpustation.tui.dialogs import process_details_text
from gpustation.tui.widgets import ProcessTable, ProcList
from tests.telemetry.cgroups import process_in_cgroup

from .conftest import first_frame, make_app, wait_for

pytestmark = pytest.mark.timeout(120)

DOCKER_ID = "cd" * 32


async def test_each_process_shows_its_power_and_container(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'none.sock'}")
    with (
        process_in_cgroup(f"system.slice/docker-{DOCKER_ID}.scope") as first,
        process_in_cgroup("system.slice/slurmstepd.scope/job_5/step_0") as second,
    ):
        app, backend = make_app(count=1, card="h200")
        backend.poke(0, load=0.0, guests=[[first, 70.0, 4096.0], [second, 10.0, 2048.0]])
        async with app.run_test(size=(160, 48)) as pilot:
            await first_frame(pilot)
            table = app.screen.query_one(ProcessTable)
            await wait_for(pilot, lambda: len(table.visible_rows()) == 2)
            header = app.screen.query_one(ProcList).plain.splitlines()[0]
            assert "POWER" in header and "CONTAINER" in header
            rows = {r.pid: r for r in table.visible_rows()}
            assert rows[first].container == f"docker/{DOCKER_ID[:12]}"
            assert rows[second].container == "slurm/job_5"
            snap = app.latest
            assert snap is not None
            gpu_power = snap.gpus[0].power_w
            assert gpu_power is not None
            # SM 70 and 10, the idle 20 split between the two
            assert rows[first].power_w == pytest.approx(0.8 * gpu_power, abs=0.1)
            assert rows[second].power_w == pytest.approx(0.2 * gpu_power, abs=0.1)
            lines = app.screen.query_one(ProcList).plain.splitlines()
            line = next(ln for ln in lines if ln.startswith(str(first)))
            col = header.index("POWER")
            assert line[col:].split()[:2] == [f"{rows[first].power_w:.0f}", "W"]
            # a long name is cut to its column, an ellipsis saying so
            assert line[header.index("CONTAINER") :].split()[0] == f"docker/{DOCKER_ID[:8]}…"
            details = process_details_text(rows[first]).plain
            assert f"docker/{DOCKER_ID[:12]}" in details and "(estimated)" in details
