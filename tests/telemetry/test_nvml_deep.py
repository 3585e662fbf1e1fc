"""The deep NVML readings (XID events, GPM, NVLink, MIG, remapped rows,
per-process SM) against the fake pynvml, and the host fields the sampler adds."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gpustation.telemetry.holders import device_node_holders
from gpustation.telemetry.model import GpuSample, ProcessInfo, Snapshot
from gpustation.telemetry.nvml import NvmlBackend, deep
from gpustation.telemetry.sampler import Sampler, unowned_memory
from tests.conftest import XID_TIMINGS

REPO = Path(__file__).resolve().parents[2]


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


def read(backend: NvmlBackend, slow: bool = True) -> list[GpuSample]:
    return backend.read_gpus(range(backend.device_count()), slow=slow)


def until(condition: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Poll ``condition`` until it holds (the watcher is a thread of its own)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("condition never held")


def nvlinked(fake: ModuleType) -> None:
    """Two H200s joined by two NVLinks each."""
    a, b = "00000000:01:00.0", "00000000:41:00.0"
    fake.reset(
        devices=[
            {
                "card": "h200",
                "bus_id": a,
                "nvlinks": [b, b],
                "nvlink_rates": [[1000, 4000], [500, 250]],
                "nvlink_errors": {1: [3, 1, 2, 5]},
                "errors": {},
            },
            {
                "card": "h200",
                "bus_id": b,
                "nvlinks": [a, a],
                "nvlink_rates": [[4000, 1000], [250, 500]],
                "minor": 1,
                "errors": {},
            },
        ]
    )


# ---- GPM ----------------------------------------------------------------------------------


def test_gpm_is_computed_from_two_samples_where_the_card_has_it(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deep, "GPM_MIN_WINDOW_S", 0.0)  # reads as fast as the test goes
    backend = open_backend()
    backend.read_gpm = True
    rtx, h200 = read(backend, slow=False)
    # As the H200 answered under a bf16 matmul.
    assert h200.sm_active_pct == pytest.approx(92.7)
    assert h200.sm_occupancy_pct == pytest.approx(15.6)
    assert h200.tensor_active_pct == pytest.approx(87.8)
    assert h200.dram_active_pct == pytest.approx(17.0)
    # An Ada card has no GPM: unknown, never 0.
    assert (rtx.sm_active_pct, rtx.tensor_active_pct) == (None, None)
    # The next read pairs its sample with the last one: a change in load shows.
    fake_nvml.DRIVER.devices[1]["gpm"]["tensor"] = 0.0
    assert read(backend, slow=False)[1].tensor_active_pct == pytest.approx(0.0)
    assert backend.errors == {}


def test_the_first_gpm_reading_waits_for_a_window_and_a_quick_reread_keeps_it(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    backend = open_backend()
    waits: list[float] = []
    reader = deep.GpmReader(backend.q, wait=waits.append)
    h200 = backend._gpus[1]
    values = reader.read(h200)
    assert values is not None and values["tensor_active_pct"] == pytest.approx(87.8)
    assert len(waits) == 1 and 0 < waits[0] <= deep.GPM_MIN_WINDOW_S
    fake_nvml.DRIVER.devices[1]["gpm"]["tensor"] = 0.0
    taken = len(fake_nvml.calls_of("nvmlGpmSampleGet"))
    assert reader.read(h200) == values  # within the window: the last values stand
    assert len(fake_nvml.calls_of("nvmlGpmSampleGet")) == taken and len(waits) == 1
    assert reader.read(backend._gpus[0]) is None  # no GPM on the RTX 4090
    reader.close()


def test_gpm_is_not_read_unless_asked_and_its_samples_are_freed(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    backend = open_backend()
    _, h200 = read(backend)
    assert h200.sm_active_pct is None and h200.tensor_active_pct is None
    assert fake_nvml.calls_of("nvmlGpmSampleGet") == []
    backend.read_gpm = True
    assert read(backend)[1].sm_active_pct is not None
    backend.read_gpm = False
    taken = len(fake_nvml.calls_of("nvmlGpmSampleGet"))
    assert read(backend)[1].sm_active_pct is None
    assert len(fake_nvml.calls_of("nvmlGpmSampleGet")) == taken
    backend.close()
    assert fake_nvml.DRIVER.gpm_samples_alive == 0


# ---- XID events ---------------------------------------------------------------------------


def test_an_xid_is_gathered_by_the_watcher_with_its_meaning(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    backend = open_backend()
    rtx, h200 = read(backend, slow=False)
    assert rtx.xid_events == [] and h200.xid_events == []  # watched, none yet
    fake_nvml.push_xid(1, 79)
    events = until(lambda: read(backend, slow=False)[1].xid_events)
    assert [(e.code, e.meaning) for e in events] == [(79, "GPU has fallen off the bus")]
    assert read(backend, slow=False)[0].xid_events == []  # the other GPU's is its own
    # Only the last ones are kept.
    for _ in range(20):
        fake_nvml.push_xid(1, 13)
    until(
        lambda: (
            len(read(backend, slow=False)[1].xid_events or ()) == 16
            and all(e.code == 13 for e in read(backend, slow=False)[1].xid_events or ())
        )
    )


def test_xid_registration_refused_is_none_not_an_empty_list(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.fail(0, "nvmlDeviceRegisterEvents", fake_nvml.NVML_ERROR_NOT_SUPPORTED)
    backend = open_backend()
    rtx, h200 = read(backend)
    assert rtx.xid_events is None and h200.xid_events == []
    assert rtx.power_w is not None and backend.errors == {}


def test_a_one_shot_read_does_not_watch_and_close_stops_the_watcher(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend], tmp_path: Path
) -> None:
    one_shot = open_backend(one_shot=True, static_cache=str(tmp_path / "cache"))
    assert [g.xid_events for g in read(one_shot)] == [None, None]
    one_shot.close()
    assert not fake_nvml.calls_of("nvmlEventSetCreate")
    backend = open_backend()
    assert any(t.name == "gpustation-xid" for t in threading.enumerate())
    backend.close()
    assert not any(t.name == "gpustation-xid" for t in threading.enumerate())
    assert all(s.freed for s in fake_nvml.DRIVER.event_sets)
    assert len(fake_nvml.calls_of("nvmlShutdown")) == 2


def test_the_watcher_waits_long_in_the_driver_and_closing_does_not_wait_for_it(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in XID_TIMINGS.items():  # the shipped timings, not the tests' short ones
        monkeypatch.setattr(deep, name, value)
    waits: list[int] = []
    wait_in_driver = fake_nvml.nvmlEventSetWait_v2

    def wait(event_set: Any, timeout_ms: int) -> Any:
        waits.append(timeout_ms)
        return wait_in_driver(event_set, timeout_ms)

    monkeypatch.setattr(fake_nvml, "nvmlEventSetWait_v2", wait)
    backend = open_backend()
    until(lambda: waits)
    # An idle watcher wakes once per wait: a long one costs next to nothing.
    assert waits[0] >= 5000
    start = time.monotonic()
    backend.close()
    assert time.monotonic() - start < 1.0  # not held up by the wait in progress
    # Neither the event set nor NVML goes while the driver's wait may use them ...
    assert any(t.name == "gpustation-xid" for t in threading.enumerate())
    assert not fake_nvml.calls_of("nvmlShutdown")
    assert not any(s.freed for s in fake_nvml.DRIVER.event_sets)
    fake_nvml.push_xid(1, 79)  # ... and both go as soon as it returns
    until(lambda: not any(t.name == "gpustation-xid" for t in threading.enumerate()))
    until(lambda: fake_nvml.calls_of("nvmlShutdown"))
    assert all(s.freed for s in fake_nvml.DRIVER.event_sets)
    assert len(waits) == 1


def test_a_failing_wait_does_not_spin_or_hide_anything(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.fail(None, "nvmlEventSetWait_v2", fake_nvml.NVML_ERROR_UNKNOWN)
    backend = open_backend()
    until(lambda: any(k == (-1, "xid_events") for k in backend.errors))
    rtx, h200 = read(backend)
    assert rtx.power_w is not None and h200.xid_events == []


# ---- NVLink ---------------------------------------------------------------------------------


def test_nvlink_state_throughput_and_errors_per_link(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    nvlinked(fake_nvml)
    backend = open_backend()
    first = read(backend)[0].nvlink
    assert [(x.link, x.active) for x in first or ()] == [(0, True), (1, True)]
    # One reading of a counter gives no rate yet.
    assert first is not None and first[0].tx_kib_s is None
    links = read(backend)[0].nvlink
    assert links is not None
    assert (links[0].tx_kib_s, links[0].rx_kib_s) == (1000, 4000)
    assert (links[1].tx_kib_s, links[1].rx_kib_s) == (500, 250)
    assert (links[1].replay_errors, links[1].recovery_errors, links[1].crc_errors) == (3, 1, 7)
    assert (links[0].replay_errors, links[0].crc_errors) == (0, 0)
    assert backend.errors == {}


def test_no_nvlink_on_a_one_gpu_machine_is_an_empty_list(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    # The H200 answers NotSupported, as measured; the RTX 4090 has no link 0.
    fake_nvml.reset(devices=[{"card": "h200"}])
    backend = open_backend()
    assert read(backend)[0].nvlink == []
    assert read(backend)[0].nvlink == []
    assert len(fake_nvml.calls_of("nvmlDeviceGetNvLinkState")) == 1  # not asked again
    assert backend.errors == {}


# ---- remapped rows, per-process SM, MIG ---------------------------------------------------------


def test_remapped_rows_and_per_process_sm(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.DRIVER.devices[0]["remapped_rows"] = [2, 1, 1, 0]
    backend = open_backend()
    rtx, h200 = read(backend)
    rows = rtx.remapped_rows
    assert (rows.correctable, rows.uncorrectable, rows.pending, rows.failure) == (2, 1, True, False)
    assert h200.remapped_rows.pending is False
    by_pid = {p.pid: p.sm_pct for p in rtx.processes}
    assert by_pid == {4242: 88.0, 1234: 0.0}  # no sample for the display process: it idled
    # No samples at all since the last read (NotFound): every process idled.
    fake_nvml.DRIVER.devices[0]["process_util"] = []
    assert {p.sm_pct for p in read(backend)[0].processes} == {0.0}


def test_per_process_sm_is_read_on_slow_passes_and_kept_between_them(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    backend = open_backend()
    assert {p.pid: p.sm_pct for p in read(backend)[0].processes} == {4242: 88.0, 1234: 0.0}
    asked = len(fake_nvml.calls_of("nvmlDeviceGetProcessUtilization"))
    fake_nvml.DRIVER.devices[0]["process_util"] = []
    for _ in range(3):  # fast passes: the last slow pass's shares stand
        rtx = read(backend, slow=False)[0]
        assert {p.pid: p.sm_pct for p in rtx.processes} == {4242: 88.0, 1234: 0.0}
    assert len(fake_nvml.calls_of("nvmlDeviceGetProcessUtilization")) == asked
    # A process that started since the last slow pass has no share until the next.
    fake_nvml.DRIVER.devices[0]["compute_procs"].append([777, 10 * 1024 * 1024])
    fresh = {p.pid: p.sm_pct for p in read(backend, slow=False)[0].processes}
    assert fresh == {4242: 88.0, 1234: 0.0, 777: None}
    assert {p.sm_pct for p in read(backend)[0].processes} == {0.0}  # read anew


def test_mig_mode_and_instances_are_read_and_never_changed(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.mig_scenario(1)
    backend = open_backend()
    rtx, h200 = read(backend)
    assert rtx.mig is None  # no MIG on a consumer card
    mig = h200.mig
    assert mig is not None and mig.enabled and mig.pending
    assert [(i.gpu_instance_id, i.profile) for i in mig.instances] == [
        (1, "3g.71gb"),
        (2, "3g.71gb"),
    ]
    first = mig.instances[0]
    assert (first.memory_used_mib, first.memory_total_mib) == (20480, 71 * 1024)
    assert [p.pid for p in first.processes] == [5151]
    assert [p.pid for p in mig.instances[1].processes] == [6262]
    assert h200.utilization_gpu_pct is None and h200.power_w is not None
    doc = Snapshot(hostname="h", time=0, gpus=[h200]).to_dict()
    again = Snapshot.from_dict(doc).gpus[0]
    assert again.mig == mig
    # Nothing ever asks the driver to change MIG mode.
    assert not [name for name, _ in fake_nvml.calls if name.startswith("nvmlDeviceSetMig")]
    assert not fake_nvml.set_calls


def test_no_code_calls_a_mig_setter() -> None:
    sources = [p for p in (REPO / "gpustation").rglob("*.py")]
    assert sources
    for path in sources:
        assert "nvmlDeviceSetMig" not in path.read_text(), path
        assert "nvmlGpuInstanceDestroy" not in path.read_text(), path


# ---- each new reading failing alone --------------------------------------------------------------

# reading -> (its functions, a check that it is missing, a check that it is there)
DEEP: dict[str, tuple[list[str], Callable[[GpuSample], bool]]] = {
    "gpm": (["nvmlGpmQueryDeviceSupport"], lambda g: g.tensor_active_pct is not None),
    "gpm_sample": (["nvmlGpmSampleGet"], lambda g: g.tensor_active_pct is not None),
    "gpm_metrics": (["nvmlGpmMetricsGet"], lambda g: g.tensor_active_pct is not None),
    "xid": (["nvmlDeviceRegisterEvents"], lambda g: g.xid_events is not None),
    "nvlink": (["nvmlDeviceGetNvLinkState"], lambda g: bool(g.nvlink)),
    "nvlink_throughput": (
        ["nvmlDeviceGetFieldValues"],
        lambda g: bool(g.nvlink) and g.nvlink[0].tx_kib_s is not None,  # type: ignore[index]
    ),
    "nvlink_errors": (
        ["nvmlDeviceGetNvLinkErrorCounter"],
        lambda g: bool(g.nvlink) and g.nvlink[0].replay_errors is not None,  # type: ignore[index]
    ),
    "remapped_rows": (["nvmlDeviceGetRemappedRows"], lambda g: g.remapped_rows.pending is not None),
    "mig": (["nvmlDeviceGetMigMode"], lambda g: g.mig is not None),
    "process_sm": (
        ["nvmlDeviceGetProcessUtilization"],
        lambda g: bool(g.processes) and g.processes[0].sm_pct is not None,
    ),
    "minor": (["nvmlDeviceGetMinorNumber"], lambda g: g.minor_number is not None),
}


_GPM = {"gpm", "gpm_sample", "gpm_metrics"}
SYSTEM_CALLS = {"nvmlGpmMetricsGet"}
#: what else goes with a reading (one failing GPM call leaves no metric)
DEPENDS = {
    **{name: _GPM for name in _GPM},
    "nvlink": {"nvlink", "nvlink_throughput", "nvlink_errors"},
}


@pytest.mark.parametrize("reading", list(DEEP))
@pytest.mark.parametrize("how", ["NVML_ERROR_NOT_SUPPORTED", "function_not_found"])
def test_one_deep_reading_failing_leaves_every_other(
    fake_nvml: ModuleType,
    open_backend: Callable[..., NvmlBackend],
    monkeypatch: pytest.MonkeyPatch,
    reading: str,
    how: str,
) -> None:
    nvlinked(fake_nvml)
    for dev in fake_nvml.DRIVER.devices:
        dev["compute_procs"] = [[4242, 1024 * 1024 * 1024]]
        dev["process_util"] = [[4242, 50, 10]]
    monkeypatch.setattr(deep, "GPM_MIN_WINDOW_S", 0.0)
    functions, _ = DEEP[reading]
    for name in functions:
        if how == "function_not_found":
            fake_nvml.function_not_found(name)
        else:
            # A call without a GPU handle fails for every GPU.
            index = None if name in SYSTEM_CALLS else 0
            fake_nvml.fail(index, name, fake_nvml.NVML_ERROR_NOT_SUPPORTED)
    backend = open_backend()
    backend.read_gpm = True
    read(backend)
    gpu, other = read(backend)
    gone = DEPENDS.get(reading, {reading})
    for name, (_, check) in DEEP.items():
        assert check(gpu) is (name not in gone), name
        if how == "NVML_ERROR_NOT_SUPPORTED" and not set(functions) & SYSTEM_CALLS:
            assert check(other), name  # the other GPU does not notice
    assert gpu.power_w is not None and gpu.memory_used_mib is not None and not gpu.lost
    assert backend.errors == {}


# ---- device holders and unowned memory ---------------------------------------------------


def fake_proc(root: Path, holders: dict[int, list[str]], unreadable: list[int] = ()) -> None:  # type: ignore[assignment]
    """A /proc tree: each pid's fd directory with links to what it holds open."""
    (root / "self").mkdir(parents=True)
    (root / "uptime").write_text("1.0 1.0\n")
    for pid, targets in holders.items():
        fd = root / str(pid) / "fd"
        fd.mkdir(parents=True)
        for n, target in enumerate(targets):
            os.symlink(target, fd / str(n))
    for pid in unreadable:
        (root / str(pid)).mkdir()  # no fd directory we may list


def test_device_node_holders_from_a_proc_tree(tmp_path: Path) -> None:
    fake_proc(
        tmp_path,
        {
            100: ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/null"],
            200: ["/dev/nvidia1", "socket:[123]"],
            300: ["/dev/nvidia0", "/dev/nvidia1"],
            400: ["/dev/nvidiactl"],  # the control node names no GPU
            os.getpid(): ["/dev/nvidia0"],
        },
        unreadable=[500],
    )
    found = device_node_holders(str(tmp_path), skip=os.getpid())
    assert found == {0: {100, 300}, 1: {200, 300}}
    assert device_node_holders(str(tmp_path / "absent")) is None


def test_the_sampler_adds_unowned_memory_and_holders_nvml_does_not_list(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend], tmp_path: Path
) -> None:
    # 4242 (compute) and 1234 (graphics) are in NVML's list for GPU 0.
    fake_proc(
        tmp_path,
        {
            4242: ["/dev/nvidia0"],
            1234: ["/dev/nvidia0"],
            777: ["/dev/nvidia0"],
            888: ["/dev/nvidia1"],
        },
    )
    sampler = Sampler(open_backend(), with_host=False, with_topology=False, proc_root=str(tmp_path))
    rtx, h200 = sampler.sample().gpus
    assert [p.pid for p in rtx.device_holders or ()] == [777]
    assert rtx.device_holders is not None and rtx.device_holders[0].kind == "holder"
    assert [p.pid for p in h200.device_holders or ()] == [888]
    # 8192 MiB used, 7680 + 210 held by the listed processes.
    assert rtx.unowned_memory_mib == pytest.approx(8192 - 7680 - 210)
    assert h200.unowned_memory_mib == 0
    doc = sampler.sample().to_dict()
    assert doc["gpus"][0]["device_holders"][0]["pid"] == 777


def test_unowned_memory_is_unknown_when_a_process_share_is() -> None:
    gpu = GpuSample(index=0, memory_used_mib=1000.0, processes=[ProcessInfo(pid=1)])
    assert unowned_memory(gpu) is None
    gpu.processes[0].gpu_memory_mib = 1200.0  # never below 0
    assert unowned_memory(gpu) == 0.0
    assert unowned_memory(GpuSample(index=0)) is None


# ---- the snapshot command -------------------------------------------------------------------


def test_snapshot_json_reads_gpm_and_the_table_does_not(tmp_path: Path) -> None:
    import json
    import subprocess

    from tests.conftest import FAKE_NVML_DIR, child_env, gpustation_cmd

    path = tmp_path / "scenario.json"
    path.write_text(json.dumps({"devices": [{"card": "rtx4090"}, {"card": "h200"}]}))
    env = child_env(
        PYTHONPATH=os.pathsep.join([str(FAKE_NVML_DIR), str(REPO)]), FAKE_NVML_SCENARIO=str(path)
    )

    def snapshot(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            gpustation_cmd("snapshot", *args), capture_output=True, text=True, env=env, timeout=60
        )

    result = snapshot("--json")
    assert result.returncode == 0, result.stderr
    rtx, h200 = json.loads(result.stdout)["gpus"]
    assert h200["tensor_active_pct"] == pytest.approx(87.8)
    assert h200["sm_active_pct"] == pytest.approx(92.7)
    assert rtx["tensor_active_pct"] is None  # no GPM on the card: null, never 0
    assert rtx["processes"][0]["sm_pct"] == 88
    assert rtx["remapped_rows"]["pending"] is False
    assert h200["nvlink"] == [] and h200["mig"]["enabled"] is False and rtx["mig"] is None
    assert rtx["xid_events"] is None  # a one-shot read does not watch
    assert rtx["unowned_memory_mib"] == pytest.approx(8192 - 7680 - 210)
    assert isinstance(rtx["device_holders"], list)
    table = snapshot()
    assert table.returncode == 0, table.stderr
    assert "SM %" in table.stdout


def test_not_supported_past_the_last_link_ends_the_list_and_is_asked_again(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    nvlinked(fake_nvml)
    real = fake_nvml.nvmlDeviceGetNvLinkState

    def state(handle: Any, link: int) -> int:
        if link >= 2:
            fake_nvml.calls.append(("nvmlDeviceGetNvLinkState", (handle.index, link)))
            raise fake_nvml.NVMLError(fake_nvml.NVML_ERROR_NOT_SUPPORTED)
        return int(real(handle, link))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fake_nvml, "nvmlDeviceGetNvLinkState", state)
        backend = open_backend()
        for _ in range(2):
            assert [x.link for x in read(backend)[0].nvlink or ()] == [0, 1]
    assert backend.errors == {}


def test_a_wait_the_driver_does_not_support_ends_the_watcher(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    fake_nvml.fail(None, "nvmlEventSetWait_v2", fake_nvml.NVML_ERROR_NOT_SUPPORTED)
    fake_nvml.remove_function("nvmlEventSetWait")
    backend = open_backend()
    until(lambda: not any(t.name == "gpustation-xid" for t in threading.enumerate()))
    rtx, h200 = read(backend)
    assert (rtx.xid_events, h200.xid_events) == (None, None)  # no longer watched
    assert rtx.power_w is not None and backend.errors == {}


def test_a_gpu_lost_while_gpm_is_read_is_marked_and_the_other_reports(
    fake_nvml: ModuleType, open_backend: Callable[..., NvmlBackend]
) -> None:
    backend = open_backend()
    backend.read_gpm = True
    fake_nvml.fail(1, "nvmlGpmQueryDeviceSupport", fake_nvml.NVML_ERROR_GPU_IS_LOST)
    rtx, h200 = read(backend)
    assert h200.lost and not rtx.lost and rtx.power_w is not None
