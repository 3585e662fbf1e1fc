"""A run's cost from [energy], and the energy report per day and per preset."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpustation.errors import UsageError
from gpustation.runs.cost import Price, load_price
from gpustation.runs.store.index import RunStore
from gpustation.runs.summary import RunSummary
from tests.control.conftest import cli


def test_the_price_comes_from_the_energy_table(gpustation_dirs: dict[str, Path]) -> None:
    config = gpustation_dirs["config"] / "config.toml"
    assert load_price() is None
    config.write_text('[energy]\nprice_per_kwh = 0.30\ncurrency = "EUR"\n')
    price = load_price()
    assert price == Price(0.30, "EUR")
    assert price.cost(3.6e6) == pytest.approx(0.30) and price.cost(None) is None
    assert price.text(7.2e6) == "0.60 EUR"
    config.write_text('[energy]\nprice_per_kwh = "cheap"\nextra = 1\n')
    with pytest.raises(UsageError, match="price_per_kwh"):
        load_price()


def test_the_energy_report_sums_runs_per_preset_with_their_cost(
    gpustation_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    (gpustation_dirs["config"] / "config.toml").write_text(
        '[energy]\nprice_per_kwh = 0.5\ncurrency = "EUR"\n'
    )
    store = RunStore()
    now = time.time()
    for i, (preset, joules) in enumerate([("a", 3.6e6), ("a", 1.8e6), ("b", None)]):
        store.upsert(
            RunSummary(
                id=f"r{i}",
                preset=preset,
                status="succeeded",
                started_at=now - 60 * i,
                duration_s=3600.0,
                gpus=[0, 1],
                energy_j=joules,
            )
        )
    store.upsert(RunSummary(id="old", preset="a", started_at=now - 90 * 86400, energy_j=1e9))
    code, out, err = cli(capsys, "energy", "--by", "preset", "--json")
    assert code == 0, err
    rows = {r["preset"]: r for r in json.loads(out)}
    assert rows["a"]["runs"] == 2 and rows["a"]["kwh"] == pytest.approx(1.5)
    assert rows["a"]["cost"] == pytest.approx(0.75) and rows["a"]["gpu_hours"] == 4.0
    assert rows["b"]["unmeasured"] == 1
    code, out, _ = cli(capsys, "energy", "--since", "7d")
    assert code == 0 and "total" in out and "EUR" in out
    code, _, err = cli(capsys, "energy", "--since", "lately")
    assert code == 2 and "--since" in err


def test_runs_list_show_and_compare_give_the_cost(
    gpustation_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    (gpustation_dirs["config"] / "config.toml").write_text(
        '[energy]\nprice_per_kwh = 0.25\ncurrency = "EUR"\n'
    )
    store = RunStore()
    store.upsert(RunSummary(id="r1", preset="a", status="succeeded", energy_j=7.2e6))
    store.upsert(RunSummary(id="r2", preset="a", status="succeeded", energy_j=3.6e6))
    code, out, _ = cli(capsys, "runs", "list")
    assert code == 0 and "COST" in out and "0.50 EUR" in out and "0.25 EUR" in out
    code, out, _ = cli(capsys, "runs", "show", "r1")
    assert code == 0 and "0.50 EUR" in out
    code, out, _ = cli(capsys, "runs", "compare", "r1", "r2")
    # The currency once, in the row's label.
    assert code == 0 and "cost (EUR)" in out and "0.25 (-50.0 %)" in out


@pytest.mark.parametrize("value", ['"0.30"', "1e308", "-0.1", "inf"])
def test_a_bad_price_is_named_once_and_the_history_still_shows(
    gpustation_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str], value: str
) -> None:
    config = gpustation_dirs["config"] / "config.toml"
    config.write_text(f'[energy]\nprice_per_kwh = {value}\ncurrency = "EUR"\n')
    with pytest.raises(UsageError, match="price_per_kwh"):
        load_price()
    RunStore().upsert(RunSummary(id="r1", preset="a", status="succeeded", energy_j=7.2e6))
    for argv in (("runs", "list"), ("runs", "show", "r1")):
        code, out, err = cli(capsys, *argv)
        assert code == 0, err
        assert "r1" in out and "EUR" not in out  # the run, without a made-up cost
        assert err.count("warning:") == 1 and "price_per_kwh" in err and str(config) in err


def test_since_takes_a_span_a_date_or_a_relative_time(
    gpustation_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from gpustation.cli import main

    assert main(["energy", "--since", "-5m"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no runs since 20") and "ago" not in out
    assert main(["energy", "--since", "2026-12-01"]) == 0
    assert "no runs since 2026-12-01 00:00:00" in capsys.readouterr().out
    assert main(["energy", "--since", "soon"]) == 2
    err = capsys.readouterr().err
    assert "--since: a span (90s, 5m, 2h, 3d, 1w) back from now" in err and "-5m" in err
