"""The fan-curve controller in-process: decisions, emergencies, errors, restores."""

from __future__ import annotations

import io
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import pytest

from gpustation.control.fancurve import CardFans, FanController, FanState, decide
from gpustation.control.profiles import FanCurve, load_profile
from gpustation.errors import EXIT_NOT_SUPPORTED, GpustationError, NotSupportedError
from gpustation.telemetry.backend import Backend
from gpustation.telemetry.model import GpuSample
from gpustation.telemetry.nvml import NvmlBackend
from tests.control.conftest import RecordingSim, cli, journal_entries

STEP = FanCurve(
    points=((40.0, 40.0), (60.0, 55.0), (70.0, 70.0), (80.0, 90.0), (85.0, 100.0)),
    interpolate="step",
    hysteresis_c=3.0,
    spin_down_delay_s=10.0,
    emergency_margin_c=5.0,
)
CARD = CardFans(
    index=0, uuid="u", name="n", fans=2, card_min_pct=30, card_max_pct=100, lo_pct=30, hi_pct=100
)


def test_speeds_rise_at_once_and_fall_only_after_hysteresis_and_delay() -> None:
    state = FanState()
    assert decide(STEP, CARD, state, 65.0, 87.0, now=0.0) == (55, None)
    state.pct = 55
    assert decide(STEP, CARD, state, 71.0, 87.0, now=1.0) == (70, None)
    state.pct = 70
    # 68 C is below the 70 C step but within the 3 C hysteresis: stays at 70 %.
    assert decide(STEP, CARD, state, 68.0, 87.0, now=2.0) == (70, None)
    assert state.low_since is None
    # 66 C is 4 C below the step: allowed down, but only after the delay.
    assert decide(STEP, CARD, state, 66.0, 87.0, now=3.0) == (70, None)
    assert decide(STEP, CARD, state, 66.0, 87.0, now=12.9) == (70, None)
    # A warm blip restarts the delay.
    assert decide(STEP, CARD, state, 69.0, 87.0, now=13.0) == (70, None)
    assert decide(STEP, CARD, state, 66.0, 87.0, now=14.0) == (70, None)
    assert decide(STEP, CARD, state, 66.0, 87.0, now=24.0) == (55, None)


def test_emergency_and_failed_reads_go_to_the_cards_maximum() -> None:
    card = CardFans(0, "u", "n", 2, 30, 100, lo_pct=30, hi_pct=80)  # profile max 80 %
    state = FanState(pct=40)
    pct, why = decide(STEP, card, state, None, 87.0, now=0.0)
    assert pct == 100 and why == "temperature read failed"
    pct, why = decide(STEP, card, state, 82.0, 87.0, now=0.0)
    assert pct == 100 and why is not None and "within 5 C of the slowdown temperature 87 C" in why
    assert decide(STEP, card, state, 81.9, 87.0, now=0.0) == (
        80,
        None,
    )  # profile max outside emergencies


def test_never_below_the_cards_minimum() -> None:
    quiet = FanCurve(points=((30.0, 0.0), (90.0, 100.0)), min_pct=0)
    card = CardFans(0, "u", "n", 1, 30, 100, lo_pct=30, hi_pct=100)
    assert decide(quiet, card, FanState(), 20.0, 87.0, now=0.0) == (30, None)


def make_controller(
    backend: Backend, curve: FanCurve, out: io.StringIO | None = None, **kw: Any
) -> FanController:
    return FanController(
        backend=backend, indices=[0, 1], curve=curve, command="test", out=out, interval_s=0.01, **kw
    )


def fan_modes(sim: RecordingSim) -> list[list[str]]:
    return [g.fan_control for g in sim.read_gpus([0, 1], slow=False)]


def test_failed_temperature_read_sets_maximum_then_auto_on_exit(sim: RecordingSim) -> None:
    curve = load_profile("balanced").curve
    assert curve is not None
    sim.poke(0, load=0.0, temperature_c=45.0)
    sim.poke(1, load=0.0, temperature_c=45.0)
    seen: list[dict[int, tuple[float | None, int | None]]] = []
    out = io.StringIO()
    controller = make_controller(sim, curve, out, on_poll=seen.append)

    def script(report: dict[int, tuple[float | None, int | None]]) -> None:
        seen.append(report)
        if len(seen) == 2:
            sim.poke(0, temperature_fails=True)
        if len(seen) == 4:
            controller.request_stop()

    controller.on_poll = script
    assert controller.run() == 0
    assert seen[0][0][1] == 40 and seen[1][0][1] == 40
    assert seen[2][0] == (None, 100) and seen[3][0] == (None, 100)
    assert seen[3][1][1] == 40  # the other card keeps its curve
    assert ("fan", 0, 0, 100) in sim.set_calls and ("fan", 0, 1, 100) in sim.set_calls
    assert sim.set_calls[-4:] == [("auto", 0, 0), ("auto", 0, 1), ("auto", 1, 0), ("auto", 1, 1)]
    assert fan_modes(sim) == [["auto", "auto"], ["auto", "auto"]]
    assert "temperature read failed: fans to maximum" in out.getvalue()


def test_readings_recovering_leaves_the_emergency(sim: RecordingSim) -> None:
    curve = load_profile("balanced").curve
    assert curve is not None
    sim.poke(0, load=0.0, temperature_c=45.0, temperature_fails=True)
    polls = 0
    out = io.StringIO()
    controller = make_controller(sim, curve, out)

    def script(report: dict[int, tuple[float | None, int | None]]) -> None:
        nonlocal polls
        polls += 1
        if polls == 1:
            assert report[0] == (None, 100)
            sim.poke(0, temperature_fails=False)
        if polls == 2:
            controller.request_stop()

    controller.on_poll = script
    controller.run()
    assert "readings recovered" in out.getvalue()


def test_an_exception_inside_the_loop_returns_fans_to_auto_and_is_reported(
    sim: RecordingSim,
) -> None:
    curve = load_profile("balanced").curve
    assert curve is not None
    calls = 0
    real_read = sim.read_gpus

    def flaky(indices: Sequence[int], slow: bool) -> list[GpuSample]:
        nonlocal calls
        calls += 1
        if calls == 4:  # check(), then two good polls, then a crash
            raise RuntimeError("driver hiccup")
        return real_read(indices, slow)

    sim.read_gpus = flaky  # type: ignore[method-assign]
    controller = make_controller(sim, curve, io.StringIO())
    with pytest.raises(GpustationError, match="driver hiccup"):
        controller.run()
    assert any(c[0] == "fan" for c in sim.set_calls)
    assert [c for c in sim.set_calls if c[0] == "auto"] == [
        ("auto", 0, 0),
        ("auto", 0, 1),
        ("auto", 1, 0),
        ("auto", 1, 1),
    ]
    sim.read_gpus = real_read  # type: ignore[method-assign]
    assert fan_modes(sim) == [["auto", "auto"], ["auto", "auto"]]


def test_one_failed_restore_does_not_skip_the_others(sim: RecordingSim) -> None:
    curve = load_profile("balanced").curve
    assert curve is not None
    real_auto = sim.control.set_fan_auto

    def broken(index: int, fan: int) -> None:
        if (index, fan) == (0, 0):
            raise GpustationError("fan 0 stuck")
        real_auto(index, fan)

    sim.control.set_fan_auto = broken  # type: ignore[method-assign]
    controller = make_controller(sim, curve, io.StringIO())
    with pytest.raises(GpustationError, match="fan 0 stuck"):
        controller.run(once=True)
    modes = fan_modes(sim)
    assert modes[0][1] == "auto" and modes[1] == ["auto", "auto"]


def test_a_refused_takeover_leaves_no_partial_state(sim: RecordingSim) -> None:
    curve = load_profile("balanced").curve
    assert curve is not None
    real_set = sim.control.set_fan_speed

    def gpu1_refuses(index: int, fan: int, pct: int) -> None:
        if index == 1:
            raise NotSupportedError("GPU 1 cannot set a fan speed")
        real_set(index, fan, pct)

    sim.control.set_fan_speed = gpu1_refuses  # type: ignore[method-assign]
    with pytest.raises(NotSupportedError):
        make_controller(sim, curve, io.StringIO()).run()
    assert fan_modes(sim) == [["auto", "auto"], ["auto", "auto"]]


def test_takeover_and_restore_are_journalled(sim: RecordingSim) -> None:
    curve = load_profile("balanced").curve
    assert curve is not None
    make_controller(sim, curve).run(once=True)
    entries = journal_entries()
    assert [(e.gpu, e.fan, e.what) for e in entries] == [
        (0, 0, "fan_speed"),
        (0, 1, "fan_speed"),
        (1, 0, "fan_speed"),
        (1, 1, "fan_speed"),
        (0, 0, "fan_auto"),
        (0, 1, "fan_auto"),
        (1, 0, "fan_auto"),
        (1, 1, "fan_auto"),
    ]
    assert entries[0].previous["mode"] == "auto" and entries[0].simulated


def test_stop_from_another_thread(sim: RecordingSim) -> None:
    curve = load_profile("balanced").curve
    assert curve is not None
    controller = make_controller(sim, curve)
    thread = threading.Thread(target=controller.run)
    thread.start()
    deadline = 200
    while not any(c[0] == "fan" for c in sim.set_calls) and deadline:
        threading.Event().wait(0.05)
        deadline -= 1
    controller.request_stop()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert fan_modes(sim) == [["auto", "auto"], ["auto", "auto"]]


def test_a_second_controller_on_the_same_card_is_refused(sim: RecordingSim) -> None:
    curve = load_profile("balanced").curve
    assert curve is not None
    first = make_controller(sim, curve)
    second_error: list[BaseException] = []

    def start_second(report: dict[int, tuple[float | None, int | None]]) -> None:
        try:
            make_controller(sim, curve).run(once=True)
        except GpustationError as err:
            second_error.append(err)
        first.request_stop()

    first.on_poll = start_second
    first.run()
    assert second_error and "already driven by a fan controller" in str(second_error[0])


def test_no_fans_exits_5_before_touching_anything(
    capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType
) -> None:
    code, _, err = cli(capsys, "fan", "run", "balanced", "--gpus", "1", "--dry-run")
    assert code == EXIT_NOT_SUPPORTED
    assert "GPU 1 (NVIDIA H200) has no fans" in err
    code, _, err = cli(capsys, "fan", "run", "balanced", "--once")  # both cards: refused as a whole
    assert code == EXIT_NOT_SUPPORTED
    assert fake_nvml.set_calls == []
    assert journal_entries() == []


def test_dry_run_on_the_fake_driver_sets_nothing(
    capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType
) -> None:
    code, out, _ = cli(capsys, "fan", "run", "balanced", "--gpus", "0", "--dry-run")
    assert code == 0
    assert "GPU 0: 2 fans, card accepts 30-100 %" in out and "would set" in out
    assert fake_nvml.set_calls == []


def test_controller_on_the_fake_driver_restores_with_set_default_fan_speed(
    capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType
) -> None:
    code, out, _ = cli(capsys, "fan", "run", "balanced", "--gpus", "0", "--once")
    assert code == 0, out
    names = [name for name, _ in fake_nvml.set_calls]
    assert names[:2] == ["nvmlDeviceSetFanSpeed_v2"] * 2
    assert names[2:] == ["nvmlDeviceSetDefaultFanSpeed_v2"] * 2
    assert [args for _, args in fake_nvml.set_calls[2:]] == [(0, 0), (0, 1)]


def test_controller_failed_temperature_read_on_the_fake_driver(
    capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType
) -> None:
    fake_nvml.fail(0, "nvmlDeviceGetTemperature", fake_nvml.NVML_ERROR_UNKNOWN)
    backend = NvmlBackend(nvml=fake_nvml)
    try:
        curve = load_profile("balanced").curve
        assert curve is not None
        FanController(backend, [0], curve, "test", interval_s=0.01).run(once=True)
    finally:
        backend.close()
    assert fake_nvml.set_calls == [
        ("nvmlDeviceSetFanSpeed_v2", (0, 0, 100)),
        ("nvmlDeviceSetFanSpeed_v2", (0, 1, 100)),
        ("nvmlDeviceSetDefaultFanSpeed_v2", (0, 0)),
        ("nvmlDeviceSetDefaultFanSpeed_v2", (0, 1)),
    ]


def test_needs_root_on_takeover_exits_4(
    capsys: pytest.CaptureFixture[str], fake_nvml: ModuleType
) -> None:
    fake_nvml.reset(require_root=True)
    code, _, err = cli(capsys, "fan", "run", "balanced", "--gpus", "0", "--once")
    assert code == 4 and "sudo gpustation" in err
    assert fake_nvml.set_calls == []


def test_profile_without_curve_cannot_be_run(
    capsys: pytest.CaptureFixture[str], sim: RecordingSim
) -> None:
    code, _, err = cli(capsys, "fan", "run", "stock", "--simulate")
    assert code == 2 and "no curve to run" in err
