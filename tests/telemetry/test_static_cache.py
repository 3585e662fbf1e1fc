"""Static values kept between one-shot snapshots, and what the table reads."""

from __future__ import annotations

import contextlib
import json
import marshal
import random
import resource
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from gpustation.cli import main
from gpustation.paths import state_dir
from gpustation.telemetry.model import STATIC, GpuSample, PcieInfo, specs
from gpustation.telemetry.nvml import NvmlBackend
from gpustation.telemetry.nvml.backend import CACHED_KEYS
from gpustation.telemetry.nvml.static_cache import STATIC_CACHE_FILE, StaticCache
from gpustation.telemetry.sampler import Sampler

# The getters whose answers cannot change while the machine is up.
STATIC_GETTERS = (
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetPowerManagementDefaultLimit",
    "nvmlDeviceGetPowerManagementLimitConstraints",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetNumFans",
    "nvmlDeviceGetMinMaxFanSpeed",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
)


def static_calls(fake: ModuleType) -> list[str]:
    return [name for name, _ in fake.calls if name in STATIC_GETTERS]


pytestmark = pytest.mark.skipif(
    not Path("/proc/sys/kernel/random/boot_id").exists(),
    reason="the cache is keyed by the Linux boot id",
)


def one_shot(fake: ModuleType, path: Path) -> list[GpuSample]:
    """What `gpustation snapshot` does: open a one-shot backend, read every GPU, close."""
    backend = NvmlBackend(nvml=fake, one_shot=True, static_cache=str(path))
    samples = backend.read_gpus(range(backend.device_count()), slow=False)
    backend.close()
    return samples


def test_second_one_shot_run_reads_static_values_from_the_file(
    fake_nvml: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / STATIC_CACHE_FILE
    first = one_shot(fake_nvml, path)
    assert static_calls(fake_nvml).count("nvmlDeviceGetMaxClockInfo") == 4  # 2 GPUs x SM, memory
    assert path.exists()
    fake_nvml.calls.clear()
    second = one_shot(fake_nvml, path)
    assert static_calls(fake_nvml) == []
    assert second == first  # the same samples, limits and maxima included
    assert second[0].power_max_w == 600 and second[0].temperature_slowdown_c is not None


def test_file_of_another_boot_or_driver_is_not_used(fake_nvml: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "cache.json"
    backend = NvmlBackend(nvml=fake_nvml)
    try:

        def cache(driver: str = "580.159.04", boot: str = "boot-1") -> StaticCache:
            return StaticCache(str(path), driver, CACHED_KEYS, boot_id=boot)

        gpu, other = backend._gpus
        first = cache()
        first.remember(gpu.uuid, gpu.pci_bus_id, {**gpu.static, "num_fans": gpu.num_fans})
        first.save()
        assert cache().get(gpu.uuid, gpu.pci_bus_id) == {**gpu.static, "num_fans": 2}
        assert cache(boot="boot-2").get(gpu.uuid, gpu.pci_bus_id) is None
        assert cache(driver="590.10").get(gpu.uuid, gpu.pci_bus_id) is None
        assert cache().get(other.uuid, other.pci_bus_id) is None
    finally:
        backend.close()


@pytest.mark.parametrize(
    "damage",
    [
        lambda doc: doc["gpus"].clear(),
        lambda doc: [e.update(temperature_slowdown_c="hot") for e in doc["gpus"].values()],
        lambda doc: [e.pop("clock_sm_max_mhz") for e in doc["gpus"].values()],
        lambda doc: [e.update(pci_bus_id="00000000:99:00.0") for e in doc["gpus"].values()],
    ],
    ids=["empty", "wrong-type", "missing-field", "moved-gpu"],
)
def test_damaged_or_stale_entries_go_back_to_the_driver(
    fake_nvml: ModuleType, tmp_path: Path, damage: object
) -> None:
    path = tmp_path / STATIC_CACHE_FILE
    first = one_shot(fake_nvml, path)
    doc = marshal.loads(path.read_bytes())
    damage(doc)  # type: ignore[operator]
    path.write_bytes(marshal.dumps(doc))
    fake_nvml.calls.clear()
    assert one_shot(fake_nvml, path) == first
    assert static_calls(fake_nvml).count("nvmlDeviceGetMaxClockInfo") == 4  # asked again


def test_garbage_file_is_ignored(fake_nvml: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / STATIC_CACHE_FILE
    path.write_bytes(b"\x00not marshal")
    first = one_shot(fake_nvml, path)
    assert first and marshal.loads(path.read_bytes())["gpus"]  # rewritten


def test_a_gpu_whose_static_read_failed_is_not_kept(fake_nvml: ModuleType, tmp_path: Path) -> None:
    fake_nvml.fail(1, "nvmlDeviceGetMaxClockInfo", fake_nvml.NVML_ERROR_UNKNOWN)
    path = tmp_path / STATIC_CACHE_FILE
    one_shot(fake_nvml, path)
    kept = marshal.loads(path.read_bytes())["gpus"]
    assert len(kept) == 1  # GPU 0 only: GPU 1's answer was an error, not a value


def test_long_lived_backends_always_ask_the_driver(fake_nvml: ModuleType) -> None:
    path = state_dir() / STATIC_CACHE_FILE  # where a one-shot run keeps it
    one_shot(fake_nvml, path)
    fake_nvml.calls.clear()
    NvmlBackend(nvml=fake_nvml).close()  # as control and the dashboard open it
    assert static_calls(fake_nvml).count("nvmlDeviceGetMaxClockInfo") == 4


def test_table_reads_no_slow_field_and_no_topology_but_json_does(
    fake_nvml: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = (
        "nvmlDeviceGetTotalEccErrors",  # not slow, but the table does not print it
        "nvmlDeviceGetPcieThroughput",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetNvLinkState",
    )
    assert main(["snapshot"]) == 0
    table = capsys.readouterr().out
    assert "H200" in table and "RTX 4090" in table
    assert not [name for name, _ in fake_nvml.calls if name in slow]
    fake_nvml.calls.clear()
    assert main(["snapshot", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {name for name, _ in fake_nvml.calls if name in slow} == set(slow)
    assert doc["gpus"][1]["pcie"]["tx_kib_s"] == 732
    assert doc["gpus"][0]["ecc_uncorrected"] is not None
    assert doc["topology"]["links"]


def test_sampler_without_topology_reads_none(fake_nvml: ModuleType) -> None:
    backend = NvmlBackend(nvml=fake_nvml)
    try:
        snap = Sampler(backend, with_topology=False).sample(slow=False)
        assert snap.topology.links == [] and snap.gpus[0].pcie.tx_kib_s is None
    finally:
        backend.close()


def test_the_file_keeps_the_fields_declared_static(fake_nvml: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / STATIC_CACHE_FILE
    one_shot(fake_nvml, path)
    declared = [n for n, s in specs(GpuSample).items() if s.cost == STATIC]
    declared += [f"pcie.{n}" for n, s in specs(PcieInfo).items() if s.cost == STATIC]
    assert "power_max_w" in declared and "pcie.max_gen" in declared
    for entry in marshal.loads(path.read_bytes())["gpus"].values():
        assert set(entry) == {*declared, "num_fans", "pci_bus_id"}


@contextlib.contextmanager
def address_space_headroom(extra_bytes: int) -> Iterator[None]:
    """Cap this process's address space a little above what it maps now, so that a
    huge allocation fails as it would on a machine short of memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/status") as fh:
        size_kib = next(int(line.split()[1]) for line in fh if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (size_kib * 1024 + extra_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize(
    "content",
    [
        b"[\xff\xff\xff\x7f",  # a list of 2**31 - 1 items declared in five bytes
        b"s\xff\xff\xff\x7f",  # bytes of 2 GiB declared the same way
        bytes(random.Random(7).randrange(256) for _ in range(4096)),
        marshal.dumps({"key": 1, "gpus": ["not", "entries"]}),
    ],
    ids=["huge-list", "huge-bytes", "random", "wrong-shape"],
)
def test_a_damaged_cache_is_ignored_and_rewritten(
    fake_nvml: ModuleType, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    path = state_dir() / STATIC_CACHE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    with address_space_headroom(1 << 30):
        assert main(["snapshot"]) == 0
    assert "H200" in capsys.readouterr().out
    kept = marshal.loads(path.read_bytes())
    assert len(kept["gpus"]) == 2  # rewritten with what the driver said
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_cache_too_large_to_be_one_is_not_read(fake_nvml: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / STATIC_CACHE_FILE
    first = one_shot(fake_nvml, path)
    path.write_bytes(path.read_bytes() + b"\0" * (2 << 20))
    fake_nvml.calls.clear()
    assert one_shot(fake_nvml, path) == first
    assert static_calls(fake_nvml).count("nvmlDeviceGetMaxClockInfo") == 4  # asked again
