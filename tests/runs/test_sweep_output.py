"""What ``sweeps show`` prints: the settings every point shares once, whole run
ids, and colour only on a terminal that did not ask for none."""

from __future__ import annotations

import re
from pathlib import Path

from gpustation.runs.sweep import model as sweep
from tests.conftest import child_env, gpustation_cmd, run_gpustation
from tests.ptyterm import PtyProgram

#: an SGR sequence that sets a colour (30-37, 38;..., 90-97): bold alone is not colour
COLOUR = re.compile(rb"\x1b\[(?:[0-9;]*;)?(?:3[0-8]|9[0-7])(?:;[0-9;]*)?m")


def _saved_sweep() -> sweep.Sweep:
    points = [
        sweep.Point(
            index=i,
            overrides={"batch_size": bs, "steps": "200", "lr": "3e-4"},
            power=power,
            run_id=f"20261202-0134{i}5-resnet50-bf16-with-a-long-name-{i:04x}",
            status="succeeded",
            figures={
                "throughput": 1000.0 + 100 * i,
                "energy_per_unit_j": 0.5 - 0.02 * i,
                "unit": "img/s",
                "work_unit": "img",
            },
        )
        for i, (bs, power) in enumerate([("8", "300W"), ("16", "300W"), ("8", "400W")])
    ]
    s = sweep.Sweep(
        id=sweep.new_sweep_id("resnet50"),
        preset="resnet50",
        axes={"batch_size": ["8", "16"], "steps": ["200"], "lr": ["3e-4"]},
        power_limits=["300W", "400W"],
        gpus=[0],
        points=points,
        created_at=1.7e9,
    )
    s.save()
    return s


def test_sweeps_show_prints_the_shared_settings_once_and_whole_run_ids(
    gpustation_dirs: dict[str, Path],
) -> None:
    s = _saved_sweep()
    shown = run_gpustation("sweeps", "show", "last")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "every point: steps=200 lr=3e-4" in out
    rows = [line for line in out.splitlines() if "succeeded" in line]
    assert len(rows) == 3
    assert not any("steps=" in row or "lr=" in row for row in rows)
    assert "batch_size=16 power=300W" in rows[1]
    for point, row in zip(s.points, rows, strict=True):
        assert row.rstrip().endswith(str(point.run_id)), row
    # piped: not one escape sequence, the plot included
    assert "\x1b" not in out and "Pareto front" in out


def _on_a_terminal(**env: str) -> bytes:
    program = PtyProgram(gpustation_cmd("sweeps", "show", "last"), child_env(**env), cols=200)
    assert program.wait_exit() == 0, program.screen()
    return program.bytes()


def test_colour_only_on_a_terminal_and_never_with_no_color(
    gpustation_dirs: dict[str, Path],
) -> None:
    _saved_sweep()
    assert COLOUR.search(_on_a_terminal())  # the plot's marks are coloured on a terminal
    plain = _on_a_terminal(NO_COLOR="1")
    assert b"Pareto front" in plain and not COLOUR.search(plain)
