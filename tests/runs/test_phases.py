"""A run recorded in phases (the contention runner's): the table ``runs show`` prints and
the runs screen draws, from the summary's ``phases``."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

from rich.console import Console

from gpustation.runs.phases import phase_cells, phase_notes, phases_table, read_phases
from gpustation.runs.presets import load_presets
from tests.conftest import child_env, gpustation_cmd
from tests.tui.pastruns import CONTENTION_PHASES, write_phased_run


def render(renderable: object, width: int = 120) -> str:
    out = io.StringIO()
    Console(width=width, file=out, color_system=None).print(renderable)
    return out.getvalue()


def test_each_phase_is_a_row_with_its_workloads_and_its_gpu() -> None:
    cells = phase_cells(CONTENTION_PHASES)
    assert cells == [
        ["train", "9,812", "n/a", "411 / 452", "98", "96 / n/a", ""],
        ["infer", "n/a", "38.5 / 41.0", "252 / 280", "61", "n/a / 42", ""],
        ["both", "7,411", "92.3 / 160.8", "440 / 472", "99", "68 / 30", "1.32x / 3.92x"],
    ]
    assert phase_notes(CONTENTION_PHASES) == []


def test_figures_not_measured_are_n_a_and_the_notes_say_why() -> None:
    cpu = [
        {"phase": "train", "train_tokens_per_s": 812.0, "power_w_mean": None,
         "power_w_peak": None, "util_pct_mean": None, "sm_pct_train": None,
         "sm_pct_infer": None, "gpu_note": "no GPU", "sm_note": "no GPU"},
        {"phase": "both", "train_tokens_per_s": 700.0, "power_w_mean": 300.0,
         "power_w_peak": 310.0, "util_pct_mean": 90.0, "sm_pct_train": None,
         "sm_pct_infer": None, "sm_note": "the driver does not report per-process utilisation"},
    ]  # fmt: skip
    cells = phase_cells(cpu)
    assert cells[0][3:6] == ["n/a", "n/a", "n/a"] and "0" not in cells[0][3:6]
    assert cells[1][3:6] == ["300 / 310", "90", "n/a"]
    assert phase_notes(cpu) == [
        "power, utilisation and SM shares: no GPU",
        "SM shares: the driver does not report per-process utilisation",
    ]


def test_hostile_phase_text_is_made_safe_and_non_numbers_are_not_numbers() -> None:
    hostile = [
        {"phase": "[red]x\x1b]0;owned\x07", "train_tokens_per_s": "[bold]9000",
         "power_w_mean": True, "power_w_peak": float("nan"), "util_pct_mean": "\x1b[2J",
         "gpu_note": "[link=http://x]y\x1b[31m"},
        "not a phase",
    ]  # fmt: skip
    assert read_phases({"phases": hostile}) == hostile[:1]
    text = render(phases_table({"phases": hostile}))
    assert "\x1b" not in text and "\x07" not in text
    assert "[red]x" in text  # shown as written, not taken as markup
    assert "[link=http://x]y" in text
    cells = phase_cells(hostile[:1])  # type: ignore[arg-type]
    assert cells[0][1:5] == ["n/a", "n/a", "n/a", "n/a"]
    assert read_phases({"phases": "both"}) is None and read_phases(None) is None
    assert phases_table({"train_slowdown": 1.2}) is None


def test_runs_show_prints_the_phases(gpustation_dirs: dict[str, Path]) -> None:
    presets, _ = load_presets()
    write_phased_run(
        gpustation_dirs["data"] / "runs", "contention-run", presets["contention"], CONTENTION_PHASES
    )
    shown = subprocess.run(
        gpustation_cmd("runs", "show", "contention-run"),
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    lines = {line.split()[0]: line for line in shown.stdout.splitlines() if line.strip()}
    assert "SM % train/infer" in lines["phase"] and "slowdown train/p99" in lines["phase"]
    assert lines["both"].split() == [
        "both", "7,411", "92.3", "/", "160.8", "440", "/", "472", "99", "68", "/", "30",
        "1.32x", "/", "3.92x",
    ]  # fmt: skip
    assert "n/a / 42" in lines["infer"]
