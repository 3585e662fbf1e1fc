"""The forecast model on built facts: what scales with what, what is said, what is left out."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from gpustation.runs.forecast.fit import theil_sen
from gpustation.runs.forecast.model import (
    Forecast,
    GpuRoom,
    Plan,
    RunFacts,
    forecast,
    versus,
)
from gpustation.runs.forecast.text import forecast_line, memory_text, no_history_text


def past(
    run_id: str = "r1",
    *,
    steps: int = 100,
    step_s: float = 0.5,
    overhead_s: float = 50.0,
    batch: int | None = 64,
    seq: int | None = None,
    gpus: int = 1,
    power_w: float = 300.0,
    overhead_energy_j: float = 5000.0,
    peak_mib: float = 10000.0,
    static_mib: float | None = 2000.0,
    limit_w: float | None = None,
    settings: dict[str, object] | None = None,
    probe: bool = False,
) -> RunFacts:
    """A past run whose duration and energy agree with its parts."""
    return RunFacts(
        run_id=run_id,
        duration_s=overhead_s + steps * step_s,
        steps=steps,
        batch_size=batch,
        seq_len=seq,
        gpu_count=gpus,
        power_limit_w=limit_w,
        step_s=step_s,
        overhead_s=overhead_s,
        energy_j=overhead_energy_j + power_w * steps * step_s,
        steady_power_w=power_w,
        overhead_energy_j=overhead_energy_j,
        peak_mib=peak_mib,
        static_mib=static_mib,
        settings=settings or {"precision": "bf16"},
        probe=probe,
    )


def plan(**kwargs: object) -> Plan:
    values: dict[str, object] = {
        "preset": "p",
        "steps": 100,
        "batch_size": 64,
        "gpus": (0,),
        "settings": {"precision": "bf16"},
    }
    values.update(kwargs)
    return Plan(**values)  # type: ignore[arg-type]


def test_the_same_plan_gives_the_history_back() -> None:
    fc = forecast(plan(), [past("a"), past("b"), past("c")])
    assert fc.runs == 3 and fc.duration_runs == fc.energy_runs == fc.memory_runs == 3
    assert fc.duration_s == pytest.approx(100.0)
    assert fc.energy_j == pytest.approx(5000 + 300 * 50)
    assert fc.peak_vram_mib == pytest.approx(10000)
    assert fc.extrapolated == [] and fc.notes == []


def test_twice_the_steps_doubles_only_the_per_step_part() -> None:
    fc = forecast(plan(steps=200), [past()])
    # 50 s of start-up and saving stay; 100 s of stepping become 200 s
    assert fc.duration_s == pytest.approx(50 + 200 * 0.5)
    assert fc.energy_j == pytest.approx(5000 + 300 * 100.0)
    assert fc.peak_vram_mib == pytest.approx(10000)  # steps do not change memory
    assert fc.extrapolated == ["steps 100 -> 200"]


def test_twice_the_work_with_an_exponent_fitted_on_two_sizes() -> None:
    # batch 64: 0.2 s a step, batch 128: 0.3 s: step time grows as work^0.585
    history = [past("small", batch=64, step_s=0.2), past("big", batch=128, step_s=0.3)]
    fc = forecast(plan(batch_size=256), history)
    exponent = math.log(1.5) / math.log(2)
    step_s = 0.3 * 2**exponent
    assert fc.duration_s == pytest.approx(50 + 100 * step_s)
    assert fc.energy_j == pytest.approx(5000 + 300 * 100 * step_s)
    assert not any("constant" in n for n in fc.notes)
    assert fc.extrapolated == ["batch 64,128 -> 256"]


def test_one_work_size_takes_throughput_as_constant_and_says_so() -> None:
    fc = forecast(plan(batch_size=128), [past(batch=64, step_s=0.5)])
    assert fc.duration_s == pytest.approx(50 + 100 * 1.0)  # twice the work, twice the time
    assert "throughput taken as constant: the history holds one work size" in fc.notes
    assert fc.extrapolated == ["batch 64 -> 128"]
    # the sequence length is work too: batch x sequence
    tokens = forecast(plan(batch_size=8, seq_len=1024), [past(batch=8, seq=512)])
    assert tokens.duration_s == pytest.approx(50 + 100 * 1.0)
    assert tokens.extrapolated == ["sequence 512 -> 1,024"]


def test_memory_is_the_static_part_and_the_growing_part_times_the_work() -> None:
    fc = forecast(plan(batch_size=128), [past(peak_mib=10000, static_mib=2000)])
    assert fc.peak_vram_mib == pytest.approx(2000 + 8000 * 2)
    # no static part reported: all of the peak grows, and that is said
    bare = forecast(plan(batch_size=128), [past(peak_mib=10000, static_mib=None)])
    assert bare.peak_vram_mib == pytest.approx(20000)
    assert any("no static memory reported" in n for n in bare.notes)
    # two work sizes: a line through the peaks
    two = [past("a", batch=64, peak_mib=6000), past("b", batch=128, peak_mib=10000)]
    assert forecast(plan(batch_size=256), two).peak_vram_mib == pytest.approx(18000)


def test_a_compiled_model_meets_a_new_batch_with_the_slowest_start() -> None:
    compiled = {"precision": "bf16", "compile": True}
    history = [
        past("warm1", overhead_s=40.0, overhead_energy_j=4000.0, settings=compiled),
        past("warm2", overhead_s=42.0, overhead_energy_j=4200.0, settings=compiled),
        past("cold", overhead_s=120.0, overhead_energy_j=9000.0, settings=compiled),
    ]
    same_shapes = forecast(plan(steps=200, settings=compiled), history)
    assert same_shapes.duration_s == pytest.approx(42 + 200 * 0.5)  # its cache is warm
    new_batch = forecast(plan(batch_size=128, settings=compiled), history)
    assert new_batch.duration_s == pytest.approx(120 + 100 * 1.0)
    assert new_batch.energy_j == pytest.approx(9000 + 300 * 100 * 1.0)
    assert "a new work size compiles anew: the slowest start of the history taken" in (
        new_batch.notes
    )
    eager = [replace(f, settings={"precision": "bf16"}) for f in history]
    assert forecast(plan(batch_size=128), eager).duration_s == pytest.approx(42 + 100 * 1.0)


def test_more_gpus_are_data_parallel_same_time_more_energy() -> None:
    fc = forecast(plan(gpus=(0, 1)), [past(gpus=1)])
    assert fc.duration_s == pytest.approx(100.0)
    assert fc.energy_j == pytest.approx(2 * (5000 + 300 * 50))
    assert fc.peak_vram_mib == pytest.approx(10000)  # per GPU
    assert fc.extrapolated == ["GPUs 1 -> 2 (data-parallel)"]


def test_the_median_of_the_runs_leaves_an_odd_one_out() -> None:
    history = [past("a"), past("b", step_s=5.0), past("c")]  # b: another job shared the GPU
    assert forecast(plan(), history).duration_s == pytest.approx(100.0)


def test_runs_at_the_plan_s_power_limit_are_taken_else_a_fitted_line() -> None:
    at_300 = past("at300", limit_w=300.0, step_s=0.8, power_w=290.0)
    at_450 = past("at450", limit_w=450.0, step_s=0.5, power_w=420.0)
    fc = forecast(plan(power_limit_w=300.0), [at_450, at_300])
    assert fc.run_ids == ["at300"] and fc.duration_s == pytest.approx(50 + 100 * 0.8)
    # 375 W: between the two, fitted on both
    mid = forecast(plan(power_limit_w=375.0), [at_450, at_300])
    assert mid.run_ids == ["at450", "at300"]
    assert mid.duration_s == pytest.approx(50 + 100 * 0.65)
    assert mid.energy_j == pytest.approx(5000 + 355.0 * 100 * 0.65)
    assert "power limit 375 W: fitted on 2 limits (300-450 W)" in mid.notes
    assert "power limit 300,450 -> 375 W" in mid.extrapolated
    # one limit only: the history as it is, said as not fitted
    one = forecast(plan(power_limit_w=250.0), [at_450])
    assert one.duration_s == pytest.approx(100.0)
    assert "power limit 250 W: the history ran at 450 W; not fitted" in one.notes


def test_runs_with_other_settings_are_left_out_while_like_ones_exist() -> None:
    fp32 = past("fp32", step_s=2.0, settings={"precision": "fp32"})
    bf16 = past("bf16", step_s=0.5)
    assert forecast(plan(), [fp32, bf16]).run_ids == ["bf16"]
    only = forecast(plan(settings={"precision": "fp16"}), [fp32, bf16])
    assert only.runs == 2
    assert "no past run with these settings: precision differ" in only.notes


def test_real_gpus_rest_on_real_runs_where_there_are_some() -> None:
    sim = replace(past("sim", step_s=2.0), simulated=True)
    real = past("real")
    assert forecast(plan(), [sim, real]).run_ids == ["real"]
    assert forecast(plan(simulated=True), [sim, real]).run_ids == ["sim"]
    only_sim = forecast(plan(), [sim])
    assert only_sim.run_ids == ["sim"] and only_sim.simulated  # said SIMULATED


def test_no_history_says_so_and_names_the_probe() -> None:
    fc = forecast(plan(), [])
    assert fc.runs == 0 and fc.duration_s is None and fc.energy_j is None
    assert "p never ran here" in forecast_line(fc) and "--probe" in forecast_line(fc)
    damaged = forecast(plan(), [], skipped=2)
    assert "p has no usable run here (2 damaged runs skipped)" in no_history_text(damaged)


def test_a_run_without_step_reports_answers_only_for_a_plan_like_it() -> None:
    bare = RunFacts(run_id="cmd", duration_s=42.0, steps=None, energy_j=900.0, peak_mib=500.0)
    same = forecast(Plan(preset="p"), [bare])
    assert same.duration_s == 42.0 and same.energy_j == 900.0
    longer = forecast(Plan(preset="p", steps=10), [bare])
    assert longer.duration_s is None and longer.duration_runs == 0
    assert "1 of the runs reported no steps to scale by" in longer.notes


def test_cost_fits_and_the_line() -> None:
    rooms = (GpuRoom(0, total_mib=24576.0, used_mib=4096.0),)
    fc = forecast(
        plan(steps=200, rooms=rooms, simulated=True),
        [past(probe=True)],
        price_per_kwh=0.30,
        currency="EUR",
    )
    assert fc.cost == pytest.approx(35000 / 3.6e6 * 0.30)
    assert fc.fits is True and fc.gpus[0].free_mib == 20480.0
    line = forecast_line(fc)
    assert line.startswith("about 2 min 30 s, 9.7 Wh SIMULATED (<0.01 EUR), peak 9.8 GiB: ")
    assert "fits, 9.8 GiB of 20.0 GiB free on GPU 0" in line
    assert "from 1 past run of p (1 a probe), steps 100 -> 200 extrapolated" in line
    big = forecast(plan(batch_size=256, rooms=rooms), [past()])
    assert big.fits is False
    assert "will not fit: needs about 33.2 GiB, 20.0 GiB free on GPU 0" in memory_text(big)


def test_a_stored_forecast_reads_back_and_junk_does_not() -> None:
    fc = forecast(plan(steps=200, rooms=(GpuRoom(0, 100.0, 10.0),)), [past()])
    back = Forecast.from_dict(fc.to_dict())
    assert back is not None and back.to_dict() == fc.to_dict()
    assert Forecast.from_dict("no") is None and Forecast.from_dict({"preset": 3}) is None
    odd = Forecast.from_dict({"preset": "p", "duration_s": "long", "run_ids": [1, "a"]})
    assert odd is not None and odd.duration_s is None and odd.run_ids == ["a"]
    errors = {v.figure: v.error_pct for v in versus(fc, {"duration_s": 120.0})}
    assert errors["duration_s"] == pytest.approx(25.0)  # 150 s forecast, 120 s taken
    assert errors["energy_j"] is None


def test_the_step_time_fit_shrugs_off_a_stall() -> None:
    points = [(float(s), 0.5 * s) for s in range(0, 100, 10)]
    points[4] = (40.0, 60.0)  # a checkpoint held this report up
    line = theil_sen(points)
    assert line is not None and line[0] == pytest.approx(0.5)
    assert theil_sen([(1.0, 2.0), (1.0, 3.0)]) is None
