"""Memory (HBM) temperature and the newer temperature sensors: read through the
field declarations by the NVML backend and the simulator."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

from gpustation.telemetry.model import GpuSample
from gpustation.telemetry.nvml import NvmlBackend
from gpustation.telemetry.sim import SimBackend


@pytest.fixture
def open_backend(fake_nvml: ModuleType) -> Iterator[Callable[..., NvmlBackend]]:
    opened: list[NvmlBackend] = []

    def make(**kwargs: Any) -> NvmlBackend:
        kwargs.setdefault("sysfs_pci_root", "/nonexistent/pci")
        backend = NvmlBackend(nvml=fake_nvml, **kwargs)
        opened.append(backend)
        return backend

    yield make
    for backend in opened:
        backend.close()


def read(backend: NvmlBackend) -> list[GpuSample]:
    return backend.read_gpus(range(backend.device_count()), slow=False)


def test_hbm_card_reports_memory_temperature_and_its_maximum(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    # A driver that refuses the GPU maximum threshold still gives the memory's.
    fake_nvml.DRIVER.devices[1]["gpu_max"] = None
    rtx, h200 = read(open_backend())
    assert (h200.memory_temperature_c, h200.memory_temperature_max_c) == (40, 95)
    assert h200.memory_temperature_margin_c == 55
    # GDDR6X: NVML has no such field; nothing is guessed.
    assert (rtx.memory_temperature_c, rtx.memory_temperature_max_c) == (None, None)
    assert rtx.memory_temperature_margin_c is None
    asked = fake_nvml.calls_of("nvmlDeviceGetFieldValues")
    assert (1,) in asked


def test_memory_temperature_follows_the_card(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    backend = open_backend()
    assert read(backend)[1].memory_temperature_c == 40
    fake_nvml.DRIVER.devices[1]["memory_temp"] = 71
    assert read(backend)[1].memory_temperature_c == 71


def test_a_card_without_the_field_is_not_asked_again(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    backend = open_backend()
    for _ in range(3):
        rtx, h200 = read(backend)
        assert rtx.memory_temperature_c is None and h200.memory_temperature_c == 40
    asked = fake_nvml.calls_of("nvmlDeviceGetFieldValues")
    assert asked.count((0,)) == 1 and asked.count((1,)) == 3
    # NotSupported is an answer, not an error to show.
    assert backend.errors == {}


def test_margin_to_the_slowdown_limit_and_a_refused_gpu_maximum(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.DRIVER.devices[0]["gpu_max"] = None  # a driver that refuses it
    rtx, h200 = read(open_backend())
    assert (rtx.temperature_margin_c, h200.temperature_margin_c) == (23, 53)
    assert rtx.temperature_gpu_max_c is None
    assert h200.temperature_gpu_max_c == 87  # as an H200 on driver 580.159.04 answers


def test_an_older_driver_without_the_margin_function(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.function_not_found("nvmlDeviceGetMarginTemperature")
    backend = open_backend()
    for _ in range(2):
        rtx, h200 = read(backend)
        assert rtx.temperature_margin_c is None and h200.temperature_margin_c is None
        assert h200.memory_temperature_c == 40
    assert len(fake_nvml.calls_of("nvmlDeviceGetMarginTemperature")) == 1
    assert backend.errors == {}


def test_an_old_pynvml_without_the_margin_function_or_the_field_id(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.remove_function("nvmlDeviceGetMarginTemperature")
    fake_nvml.remove_function("NVML_FI_DEV_MEMORY_TEMP")
    _, h200 = read(open_backend())
    assert h200.temperature_margin_c is None and h200.memory_temperature_c is None
    assert h200.temperature_c == 36 and h200.memory_temperature_max_c == 95
    assert fake_nvml.calls_of("nvmlDeviceGetFieldValues") == []


def test_a_field_error_other_than_not_supported_is_kept_and_retried(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.fail(1, "nvmlDeviceGetFieldValues", fake_nvml.NVML_ERROR_UNKNOWN)
    backend = open_backend()
    assert read(backend)[1].memory_temperature_c is None
    assert (1, "memory_temperature_c") in backend.errors
    fake_nvml.heal(1, "nvmlDeviceGetFieldValues")
    assert read(backend)[1].memory_temperature_c == 40


# ---- the simulator -------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _settle(sim: SimBackend, clock: Clock, load: float | None, seconds: float = 600.0) -> GpuSample:
    sim.poke(0, load=load)
    clock.t += seconds
    return sim.read_gpus([0], slow=False)[0]


def test_simulated_hbm_rises_with_power_and_dram_load() -> None:
    clock = Clock()
    sim = SimBackend(count=1, card="h200", clock=clock)
    idle = _settle(sim, clock, 0.0)
    busy = _settle(sim, clock, 1.0)
    assert idle.memory_temperature_c is not None and busy.memory_temperature_c is not None
    assert 36 <= idle.memory_temperature_c <= 44  # as an idle H200 reads
    assert busy.memory_temperature_c > idle.memory_temperature_c + 20
    assert busy.memory_temperature_c < 95 == busy.memory_temperature_max_c
    assert busy.temperature_gpu_max_c == 87  # as an H200 reads
    assert busy.temperature_c is not None
    assert busy.temperature_margin_c == pytest.approx(89 - busy.temperature_c, abs=0.11)


def test_simulated_gddr_card_reports_no_memory_temperature() -> None:
    clock = Clock()
    g = _settle(SimBackend(count=1, card="rtx4090", clock=clock), clock, 1.0)
    assert g.memory_temperature_c is None and g.memory_temperature_max_c is None
    assert g.temperature_margin_c is not None


# ---- the health rule and its alert ------------------------------------------------------


def _hbm(temp: float | None, max_c: float | None = 95.0) -> GpuSample:
    return GpuSample(
        index=0,
        temperature_c=60.0,
        temperature_slowdown_c=89.0,
        memory_temperature_c=temp,
        memory_temperature_max_c=max_c,
    )


@pytest.mark.parametrize(
    ("temp", "band"),
    [(40.0, "cool"), (71.0, "warm"), (86.0, "hot"), (90.0, "critical"), (97.0, "critical")],
)
def test_memory_band_by_distance_to_the_memory_maximum(temp: float, band: str) -> None:
    from gpustation.telemetry import health

    assert health.memory_temperature_band(_hbm(temp)) == band


def test_no_band_without_a_reading_or_a_maximum() -> None:
    from gpustation.telemetry import health

    assert health.memory_temperature_band(_hbm(None)) is None
    assert health.memory_temperature_band(_hbm(90.0, None)) is None


def test_memory_near_its_maximum_is_an_alert_raised_once() -> None:
    from gpustation.telemetry.alerts import conditions, evaluate
    from gpustation.telemetry.model import Snapshot

    def snap(temp: float, t: float) -> Snapshot:
        return Snapshot(hostname="h", time=t, gpus=[_hbm(temp)])

    cool, hot, hotter = snap(70.0, 1.0), snap(91.0, 2.0), snap(93.0, 3.0)
    assert [a.rule for a in conditions(cool)] == []
    raised = evaluate(cool, hot)
    assert [a.rule for a in raised] == ["memory_temp_near_max"]
    assert raised[0].message == "GPU 0 memory at 91 C, 4 C from its maximum 95 C"
    assert raised[0].short == "GPU0 memory hot"
    assert evaluate(hot, hotter) == []


# ---- recorded and replayed -------------------------------------------------------------


def test_a_recording_replays_the_memory_temperature(tmp_path: Any) -> None:
    from gpustation.telemetry.recording.file import Recording
    from gpustation.telemetry.recording.recorder import Recorder
    from gpustation.telemetry.sampler import Sampler

    clock = Clock()
    sampler = Sampler(SimBackend(count=1, card="h200", state_path=None, clock=clock), clock=clock)
    path = tmp_path / "r.zst"
    with Recorder(path, clock=clock, flush_s=0.0) as rec:
        live = sampler.sample()
        rec.add(live)
    replayed = Recording(path).snapshot_at(live.time).gpus[0]
    assert replayed.memory_temperature_c == live.gpus[0].memory_temperature_c is not None
    assert replayed.memory_temperature_max_c == 95
    assert replayed.temperature_margin_c == live.gpus[0].temperature_margin_c
