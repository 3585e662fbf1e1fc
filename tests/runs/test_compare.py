"""The compare table (``runs compare`` and the runs screen): formats, changes, settings, curves."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from rich.console import Console

from gpustation.runs import rundir
from gpustation.runs.compare import CompareRow, compare, row_decimals, run_settings
from gpustation.runs.curves import read_curves
from gpustation.runs.store.index import record_from_dir, sync_run
from gpustation.runs.summary import RunSummary
from tests.conftest import child_env, gpustation_cmd


def resnet(run_id: str, **kw: Any) -> RunSummary:
    base: dict[str, Any] = dict(
        preset="resnet50-bf16",
        runner="resnet",
        status="succeeded",
        steps=150,
        final_loss=0.5,
        best_throughput=1480.0,
        throughput_unit="img/s",
        work_unit="img",
        energy_per_unit_j=0.25,
        avg_power_w=300.0,
        peak_vram_mib=20480.0,
        energy_j=7200.0,
    )
    base.update(kw)
    return RunSummary(id=run_id, **base)


def lora(run_id: str, **kw: Any) -> RunSummary:
    base: dict[str, Any] = dict(
        preset="lora-tiny",
        runner="lora",
        status="succeeded",
        steps=300,
        final_loss=2.5,
        best_throughput=9000.0,
        throughput_unit="tokens/s",
        work_unit="token",
        energy_per_unit_j=0.002,
        avg_power_w=250.0,
        energy_j=3600.0,
    )
    base.update(kw)
    return RunSummary(id=run_id, **base)


def cells(
    records: list[RunSummary], settings: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """{row label: cells} of the comparison."""
    table = compare(records, settings or [{} for _ in records])
    return {row.name: row.cells() for row in table.rows}


def test_one_number_format_per_row_with_the_unit_in_the_label() -> None:
    rows = cells(
        [
            resnet("a", best_throughput=1480.0, energy_j=7200.0, peak_vram_mib=20480.0),
            resnet("b", best_throughput=12345.6, energy_j=3.6e6, peak_vram_mib=8000.0),
        ]
    )
    # The same decimals in each cell of a row, thousands separated.
    assert rows["throughput (img/s)"] == ["1,480", "12,346 (+734.2 %)"]
    # One unit for the row (not 2.0 Wh beside 1.00 kWh), named once in the label.
    assert rows["energy (kWh)"] == ["0.002", "1.000 (+49900.0 %)"]
    assert rows["peak VRAM (MiB)"] == ["20,480", "8,000 (-60.9 %)"]
    assert rows["final loss"] == ["0.5000", "="]
    for label, row in rows.items():
        for cell in row:
            assert not cell.endswith(("MiB", "W", "J", "kWh", "img/s")), (label, cell)


def test_row_decimals_keep_small_numbers_readable_and_alike() -> None:
    assert row_decimals([0.5, 0.25], 4) == 4
    assert row_decimals([0.00003, 0.00012], 4) == 5
    assert row_decimals([1480.0, 12345.0], 1) == 0
    assert row_decimals([None, None], 2) == 2


def test_every_cell_keeps_three_significant_figures() -> None:
    # A small figure beside a big one is not rounded away: 0.341 beside 19,489 is not 0.
    assert row_decimals([0.34129, 1.0, 19489.2], 3) == 0
    row = CompareRow("energy per token (J)", [0.34129, 1.0, 19489.2], digits=3)
    assert row.texts() == ["0.341", "1", "19,489"]
    assert row_decimals([0.034129, 2.5], 1) == 4  # three figures of the smallest, in each cell
    assert row_decimals([0.25, 0.5], 1) == 2  # a value with fewer figures keeps its own
    assert row_decimals([4.53571, 4.42], 4) == 4


def test_an_equal_value_is_not_a_zero_change() -> None:
    rows = cells(
        [
            resnet("a", avg_power_w=300.0, duration_s=754.0),
            resnet("b", avg_power_w=300.0, duration_s=754.0),
            resnet("c", avg_power_w=300.01, duration_s=4000.0),
        ]
    )
    assert rows["avg power (W)"] == ["300", "=", "300"]  # a change that rounds to 0.0 % is none
    assert rows["duration (h:mm:ss)"] == ["0:12:34", "=", "1:06:40 (+430.5 %)"]
    assert rows["status"] == ["succeeded", "=", "="]
    assert not any("+0.0 %" in c or "-0.0 %" in c for row in rows.values() for c in row)


def test_no_change_between_different_workloads() -> None:
    rows = cells([resnet("a"), lora("b"), resnet("c", steps=300, final_loss=0.25)])
    # A LoRA step, loss and tokens/s are not a ResNet step, loss and img/s.
    assert rows["steps"] == ["150", "300", "300 (+100.0 %)"]
    assert rows["final loss"] == ["0.5000", "2.5000", "0.2500 (-50.0 %)"]
    assert rows["throughput"] == ["1,480.0 img/s", "9,000.0 tokens/s", "="]
    assert rows["energy per unit"] == ["0.250 J/img", "0.002 J/token", "="]
    # Watts are watts: the physical rows still compare.
    assert rows["avg power (W)"] == ["300", "250 (-16.7 %)", "="]
    table = compare([resnet("a"), lora("b")], [{}, {}])
    assert table.mixed and "across workloads" in table.caption()
    steps = next(r for r in table.rows if r.name == "steps")
    assert steps.changes() == [0.0, None]


def test_settings_that_differ_are_rows_and_the_rest_is_said_once() -> None:
    records = [
        resnet("a", overrides={"batch_size": 192}),
        resnet("b"),
        resnet("c", overrides={"lr": 0.2}),
    ]
    settings = [
        {"batch_size": 192, "lr": 0.1, "precision": "bf16", "compile": True},
        {"batch_size": 256, "lr": 0.1, "precision": "bf16", "compile": True},
        {"batch_size": 256, "lr": 0.2, "precision": "bf16", "compile": True},
    ]
    table = compare(records, settings)
    rows = {row.name: row.cells() for row in table.rows}
    assert rows["set batch_size"] == ["192", "256", "256"]
    assert rows["set lr"] == ["0.1", "=", "0.2"]
    assert "set precision" not in rows and "set compile" not in rows
    assert table.same == {"precision": "bf16", "compile": True}
    assert table.same_text() == "same: precision=bf16, compile=true"
    text = _render(table)
    assert text.count("same:") == 1
    doc = table.to_json()
    assert doc["same"] == {"precision": "bf16", "compile": True}
    setting = next(r for r in doc["rows"] if r["name"] == "set batch_size")
    assert setting["setting"] and setting["values"] == [192, 256, 256]


def _render(table: Any) -> str:
    console = Console(width=160, record=True)
    console.print(table.renderable())
    return console.export_text()


def test_settings_are_read_from_run_json(tmp_path: Path) -> None:
    directory = tmp_path / "r1"
    directory.mkdir()
    rundir.write_json(
        directory / rundir.RUN_JSON,
        {"id": "r1", "preset": {"name": "p", "args": {"batch_size": 64, "lr": 0.1}}},
    )
    record = RunSummary(id="r1", run_dir=str(directory), overrides={"batch_size": 64})
    assert run_settings(record) == {"batch_size": 64, "lr": 0.1}
    gone = RunSummary(id="r2", run_dir=str(tmp_path / "gone"), overrides={"lr": 0.3})
    assert run_settings(gone) == {"lr": 0.3}


def test_untrusted_text_is_made_safe() -> None:
    records = [resnet("a\x1b[31m", overrides={"name": "x\x1b]0;owned\x07"}), resnet("b")]
    text = _render(compare(records, [{"name": "x\x1b]0;owned\x07"}, {"name": "y"}]))
    assert "\x1b" not in text and "\x07" not in text


def test_curves_by_step_and_by_time(tmp_path: Path) -> None:
    events = [
        {"t": 1.0, "step": 10, "loss": 2.0},
        {"t": 2.0, "step": 20, "loss": 1.5, "eval_loss": 1.7},
        "not json",
        {"t": 3.0, "loss": 1.2},  # no step: the last step seen
        {"t": 4.0, "step": 40, "loss": None},
    ]
    (tmp_path / rundir.METRICS_FILE).write_text(
        "".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in events)
    )
    curves = read_curves(tmp_path)
    assert curves.loss.steps == [10.0, 20.0, 20.0]
    assert curves.loss.times_s == [1.0, 2.0, 3.0]
    assert curves.loss.values == [2.0, 1.5, 1.2]
    assert curves.eval_loss.xs(by_time=True) == [2.0] and curves.eval_loss.values == [1.7]
    assert not read_curves(tmp_path / "missing").loss


def test_curves_stay_bounded(tmp_path: Path) -> None:
    lines = "".join(
        json.dumps({"t": n * 0.1, "step": n, "loss": 1.0 / n}) + "\n" for n in range(1, 5001)
    )
    (tmp_path / rundir.METRICS_FILE).write_text(lines)
    curves = read_curves(tmp_path, max_points=100)
    assert len(curves.loss.values) <= 101
    assert curves.loss.steps[-1] == 5000.0 and curves.loss.times_s[-1] == 500.0
    assert len(curves.loss.steps) == len(curves.loss.times_s) == len(curves.loss.values)


def burnin_run(
    runs_root: Path, run_id: str, card: str, verdicts: dict[str, str], tflops: float
) -> Path:
    """A finished burn-in run's directory, as the burnin runner leaves it (its summary keys)."""
    directory = runs_root / run_id
    directory.mkdir(parents=True)
    rundir.write_json(
        directory / rundir.RUN_JSON,
        {
            "id": run_id,
            "created_at": 1_700_000_000.0,
            "preset": {"name": "burnin", "runner": "burnin", "args": {"minutes": 10}},
            "gpus": [0],
        },
    )
    failed = "fail" in verdicts.values()
    summary = {
        "result": "fail" if failed else "pass",
        "checks": [
            {"name": name, "status": status, "detail": f"{name}: {status}"}
            for name, status in verdicts.items()
        ],
        "device": "cuda:0",
        "gpu": card,
        "nvml": True,
        "seconds": 600.2,
        "matmul_tflops": tflops,
        "memory_errors": 12 if failed else 0,
    }
    (directory / rundir.METRICS_FILE).write_text(json.dumps({"t": 600.0, "summary": summary}))
    rundir.write_state(
        directory,
        rundir.RunState(
            id=run_id,
            status="failed" if failed else "succeeded",
            started_at=1_700_000_000.0,
            ended_at=1_700_000_600.0,
            exit_code=1 if failed else 0,
        ),
    )
    return directory


GOOD = {"matmul results": "pass", "memory patterns": "pass", "thermal": "pass", "power": "info"}


def test_burn_ins_compare_card_result_and_each_check_as_words(tmp_path: Path) -> None:
    good = record_from_dir(burnin_run(tmp_path, "b1", "NVIDIA H200", GOOD, 610.5))
    bad = record_from_dir(
        burnin_run(
            tmp_path,
            "b2",
            "NVIDIA H200 (used)",
            {**GOOD, "memory patterns": "fail", "thermal": "warn", "XID errors": "pass"},
            590.0,
        )
    )
    table = compare([good, bad])
    rows = {row.name: row.cells() for row in table.rows}
    assert rows["card"] == ["NVIDIA H200", "NVIDIA H200 (used)"]
    assert rows["result"] == ["pass", "fail"]
    assert rows["check: matmul results"] == ["pass", "="]
    assert rows["check: memory patterns"] == ["pass", "fail"]
    assert rows["check: thermal"] == ["pass", "warn"]
    assert rows["check: power"] == ["info", "="]
    assert rows["check: XID errors"] == ["n/a", "pass"]  # a check only the second run made
    # Verdicts are words: no percentage between them.
    for name, cells_ in rows.items():
        if name.startswith("check: ") or name in ("card", "result"):
            assert not any("%" in c for c in cells_), (name, cells_)
    # Beside the figures, which still compare as numbers.
    assert rows["matmul_tflops"] == ["610.5000", "590.0000 (-3.4 %)"]
    assert rows["memory_errors"] == ["0", "12"]
    names = [row.name for row in table.rows]
    order = ("gpus", "card", "result", "check: matmul results", "matmul_tflops")
    assert [names.index(n) for n in order] == sorted(names.index(n) for n in order)
    doc = table.to_json()
    memory = next(r for r in doc["rows"] if r["name"] == "check: memory patterns")
    assert memory["values"] == ["pass", "fail"] and memory["change_pct"] == [None, None]


def test_no_verdict_rows_for_runs_that_checked_nothing(tmp_path: Path) -> None:
    names = [row.name for row in compare([resnet("a"), resnet("b")], [{}, {}]).rows]
    assert "result" not in names and "card" not in names
    assert not any(n.startswith("check: ") for n in names)
    # A burn-in beside a training run: the training run reads n/a in the burn-in's rows.
    burn = record_from_dir(burnin_run(tmp_path, "b1", "NVIDIA H200", GOOD, 610.5))
    rows = cells([burn, resnet("a")], [{}, {}])
    assert rows["result"] == ["pass", "n/a"] and rows["card"] == ["NVIDIA H200", "n/a"]


def test_runs_compare_prints_the_burn_ins_verdicts(gpustation_dirs: dict[str, Path]) -> None:
    runs_root = gpustation_dirs["data"] / "runs"
    for run_id, verdicts in (("b1", GOOD), ("b2", {**GOOD, "memory patterns": "fail"})):
        sync_run(burnin_run(runs_root, run_id, "NVIDIA H200", verdicts, 600.0))
    shown = subprocess.run(
        gpustation_cmd("runs", "compare", "b1", "b2"),
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr

    def row(label: str) -> list[str]:
        found = [line for line in shown.stdout.splitlines() if line.startswith(label + "  ")]
        assert len(found) == 1, (label, shown.stdout)
        return found[0][len(label) :].split()

    assert row("card") == ["NVIDIA", "H200", "="]
    assert row("result") == ["pass", "fail"]
    assert row("check: memory patterns") == ["pass", "fail"]
    assert row("check: matmul results") == ["pass", "="]


def test_settings_that_look_like_markup_are_printed_as_they_are() -> None:
    # A setting's value is the user's text: "[/bold]" must neither style nor break the table.
    table = compare(
        [resnet("a"), resnet("b")],
        [{"note": "[/bold]"}, {"note": "[red]x[/red]"}],
    )
    console = Console(width=200, record=True, color_system=None)
    console.print(table.renderable())
    out = console.export_text()
    assert "[/bold]" in out and "[red]x[/red]" in out
