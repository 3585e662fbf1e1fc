"""``gpustation doctor`` on the fake pynvml and simulated GPUs: each check's
verdicts, the exit status, JSON, the support bundle; and that it changes nothing."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import zstandard

from gpustation.cli import main
from gpustation.doctor import bundle, checks
from gpustation.telemetry.nvml import NvmlBackend

#: torch as a CUDA 13.0 build that sees the fake's two cards
TORCH_OK = {
    "torch": "2.9.0",
    "cuda_built": "13.0",
    "cuda_available": True,
    "devices": ["NVIDIA GeForce RTX 4090", "NVIDIA H200"],
    "nccl": "2.27.3",
}


@pytest.fixture
def doctor(
    fake_nvml: ModuleType, gpustation_dirs: dict[str, Path], tmp_path: Path
) -> Callable[..., dict[str, checks.Check]]:
    """Run the checks on the fake driver; name -> check (of several of a name, the
    first that did not pass)."""

    def run(
        torch: dict[str, Any] | None = TORCH_OK, kernel: list[str] | None = None
    ) -> dict[str, checks.Check]:
        found = checks.diagnose(
            lambda: NvmlBackend(nvml=fake_nvml, sysfs_pci_root="/nonexistent/pci"),
            tmp_path / "runs",
            torch_probe=lambda: torch,
            kernel_log=lambda: kernel,
        )
        out: dict[str, checks.Check] = {}
        for c in found.checks:
            if c.name not in out or out[c.name].status == "pass":
                out[c.name] = c
        return out

    return run


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_ready_machine_passes_and_nothing_is_changed(
    doctor: Callable[..., dict[str, checks.Check]], fake_nvml: ModuleType
) -> None:
    found = doctor(kernel=[])
    assert found["driver"].status == "pass" and "580.159.04" in found["driver"].detail
    assert found["torch"].status == "pass" and "sees 2 GPU(s)" in found["torch"].detail
    assert found["NCCL"].detail == "NCCL 2.27.3"
    assert found["memory (ECC)"].status == "pass"
    assert found["XID events"].status == "pass"
    assert found["persistence mode"].status == "pass"
    assert found["limits"].status == "pass"
    # read only: no setter was called, and no change was journalled
    assert fake_nvml.set_calls == []
    assert not any(name.startswith("nvmlDeviceSet") for name, _ in fake_nvml.calls)


def test_torch_built_for_a_newer_cuda_than_the_driver_fails(
    doctor: Callable[..., dict[str, checks.Check]],
) -> None:
    found = doctor(torch={**TORCH_OK, "cuda_built": "13.1"})
    assert found["torch"].status == "fail"
    assert "needs CUDA 13.1, the driver gives CUDA 13.0" in found["torch"].detail


@pytest.mark.parametrize(
    ("torch", "status", "words"),
    [
        (None, "warn", "torch is not installed"),
        ({**TORCH_OK, "cuda_built": None}, "fail", "CPU-only build"),
        ({**TORCH_OK, "cuda_available": False}, "fail", "sees no GPU"),
        ({**TORCH_OK, "devices": ["NVIDIA H200"]}, "warn", "torch sees 1 GPU(s), the driver 2"),
    ],
)
def test_what_torch_sees(
    doctor: Callable[..., dict[str, checks.Check]], torch: Any, status: str, words: str
) -> None:
    found = doctor(torch=torch)
    assert found["torch"].status == status and words in found["torch"].detail


def test_persistence_off_on_a_headless_card_is_a_warning(
    doctor: Callable[..., dict[str, checks.Check]], fake_nvml: ModuleType
) -> None:
    fake_nvml.DRIVER.devices[1]["persistence"] = 0
    check = doctor()["persistence mode"]
    assert check.status == "warn" and "GPU 1" in check.detail and "nvidia-smi -pm 1" in check.fix


def test_memory_health(
    doctor: Callable[..., dict[str, checks.Check]], fake_nvml: ModuleType
) -> None:
    fake_nvml.DRIVER.devices[1]["remapped_rows"] = [0, 1, 1, 0]
    assert doctor()["memory (ECC)"].status == "warn"
    fake_nvml.DRIVER.devices[1]["remapped_rows"] = [0, 1, 0, 1]
    check = doctor()["memory (ECC)"]
    assert check.status == "fail" and "RMA" in check.fix


def test_xids_since_boot_and_an_unreadable_kernel_log(
    doctor: Callable[..., dict[str, checks.Check]],
) -> None:
    line = "[ 812.4] NVRM: Xid (PCI:0000:01:00): 79, pid=1234, GPU has fallen off the bus."
    found = doctor(kernel=["[ 1.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module", line])
    assert found["XID events"].status == "warn" and "79" in found["XID events"].detail
    check = doctor(kernel=None)["XID events"]
    assert check.status == "skip" and "sudo gpustation doctor" in check.fix


def test_a_slow_link_under_load_is_a_warning(
    doctor: Callable[..., dict[str, checks.Check]], fake_nvml: ModuleType
) -> None:
    fake_nvml.DRIVER.devices[0]["pcie_gen"] = 3  # the 4090 is 97 % busy in the fake
    found = checks.diagnose(
        lambda: NvmlBackend(nvml=fake_nvml, sysfs_pci_root="/nonexistent/pci"),
        Path("/nonexistent"),
        torch_probe=lambda: TORCH_OK,
        kernel_log=lambda: [],
    )
    (slow,) = [c for c in found.checks if "below its maximum" in c.detail]
    assert slow.name == "PCIe and topology" and slow.status == "warn" and "reseat" in slow.fix


def test_a_limit_that_drifted_is_a_warning(
    doctor: Callable[..., dict[str, checks.Check]],
    fake_nvml: ModuleType,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli(capsys, "power", "set", "300", "--gpus", "0")[0] == 0
    fake_nvml.DRIVER.devices[0]["power_limit_mw"] = 450_000  # a reboot
    check = doctor()["limits"]
    assert check.status == "warn" and check.fix == "gpustation profile apply --again"


def test_permissions_are_decided_from_who_runs_it(
    doctor: Callable[..., dict[str, checks.Check]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(checks, "_has_cap_sys_admin", lambda: False)
    found = doctor()
    assert found["power limits"].status == "warn" and "sudo" in found["power limits"].fix
    assert found["fans"].status == "warn"  # the 4090 has fans


def test_little_free_disk_for_runs(
    doctor: Callable[..., dict[str, checks.Check]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checks, "DISK_WARN_GIB", 1e9)
    assert doctor()["disk"].status == "warn"
    monkeypatch.setattr(checks, "DISK_FAIL_GIB", 1e9)
    assert doctor()["disk"].status == "fail"


# ---- the command -------------------------------------------------------------------------


@pytest.fixture
def quick_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch child and dmesg answer at once (each has a test of its own below)."""
    monkeypatch.setattr(checks, "probe_torch", lambda: TORCH_OK)
    monkeypatch.setattr(checks, "read_kernel_log", lambda: [])


def test_json_and_the_exit_status_by_the_worst_check(
    capsys: pytest.CaptureFixture[str],
    fake_nvml: ModuleType,
    gpustation_dirs: dict[str, Path],
    quick_probes: None,
) -> None:
    code, out, _ = cli(capsys, "doctor", "--json")
    doc = json.loads(out)
    assert doc["schema"] == "gpustation.doctor/1" and code == 0
    assert doc["versions"]["driver"] == "580.159.04" and doc["versions"]["nccl"] == "2.27.3"
    assert {c["status"] for c in doc["checks"]} <= {"pass", "warn", "skip"}
    fake_nvml.DRIVER.devices[1]["persistence"] = 0  # a warning: still ready
    code, out, _ = cli(capsys, "doctor")
    assert code == 0 and "WARN  persistence mode" in out and "ready, with warnings" in out
    assert cli(capsys, "doctor", "--strict")[0] == 1
    fake_nvml.DRIVER.devices[1]["remapped_rows"] = [0, 1, 0, 1]  # a failure: not ready
    code, out, _ = cli(capsys, "doctor")
    assert code == 1 and "FAIL  memory (ECC)" in out and "NOT ready" in out


def test_no_driver_is_a_failed_check_not_a_crash(
    capsys: pytest.CaptureFixture[str],
    fake_nvml: ModuleType,
    gpustation_dirs: dict[str, Path],
    quick_probes: None,
) -> None:
    fake_nvml.reset(no_driver=True)
    code, out, _ = cli(capsys, "doctor")
    assert code == 1 and "FAIL  driver" in out and "NVIDIA driver" in out


def test_simulated_gpus_say_so(
    capsys: pytest.CaptureFixture[str], gpustation_dirs: dict[str, Path], quick_probes: None
) -> None:
    code, out, _ = cli(capsys, "doctor", "--simulate", "1", "--sim-card", "h200")
    assert code == 0 and out.startswith("SIMULATED GPUs")
    assert "SKIP  torch" in out


def test_a_bundle_of_another_kind_is_refused_before_anything_is_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fake_nvml: ModuleType
) -> None:
    code, _, err = cli(capsys, "doctor", "--bundle", str(tmp_path / "b.rar"))
    assert code == 2 and "FILE.zip or FILE.tar.zst" in err
    assert fake_nvml.calls == []


# ---- the support bundle --------------------------------------------------------------


def test_other_users_command_lines_are_left_out_and_secrets_hidden() -> None:
    doc = {
        "gpus": [
            {
                "processes": [
                    {"pid": 1, "user": "me", "command": "python t.py --api-key sk-12345 --lr 1"},
                    {"pid": 2, "user": "bob", "command": "python bob_secret_project.py"},
                ],
                "device_holders": [{"pid": 3, "user": None, "command": "Xorg :0"}],
            }
        ]
    }
    procs = bundle.scrub_snapshot(doc, "me")["gpus"][0]
    assert procs["processes"][0]["command"] == "python t.py --api-key *** --lr 1"
    assert procs["processes"][1]["command"] is None
    assert procs["device_holders"][0]["command"] is None


@pytest.mark.parametrize("name", ["support.zip", "support.tar.zst"])
def test_the_bundle_holds_versions_snapshot_journal_runs_and_kernel_lines(
    name: str,
    capsys: pytest.CaptureFixture[str],
    fake_nvml: ModuleType,
    gpustation_dirs: dict[str, Path],
    quick_probes: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    line = "[ 9.1] NVRM: Xid (PCI:0000:01:00): 13, pid=99, cmd=python --hf-token hf_abcdef123456"
    monkeypatch.setattr(checks, "read_kernel_log", lambda: [line])
    assert cli(capsys, "power", "set", "300", "--gpus", "0")[0] == 0
    path = tmp_path / name
    code, _, err = cli(capsys, "doctor", "--bundle", str(path))
    assert code == 0 and f"support bundle written to {path}" in err
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    files = _read_bundle(path)
    assert set(files) == {
        "doctor.json",
        "snapshot.json",
        "control-journal-tail.jsonl",
        "runs-error-tails.txt",
        "dmesg-nvidia.txt",
    }
    assert json.loads(files["doctor.json"])["versions"]["driver"] == "580.159.04"
    snap = json.loads(files["snapshot.json"])
    assert snap["schema"] == "gpustation.snapshot/1" and "topology" in snap
    assert "gpustation power set 300 --gpus 0" in files["control-journal-tail.jsonl"]
    assert "Xid" in files["dmesg-nvidia.txt"] and "hf_abcdef123456" not in files["dmesg-nvidia.txt"]


def _read_bundle(path: Path) -> dict[str, str]:
    prefix = "gpustation-support/"
    if path.name.endswith(".zip"):
        with zipfile.ZipFile(path) as zf:
            return {n.removeprefix(prefix): zf.read(n).decode() for n in zf.namelist()}
    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(path.read_bytes())).read()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        return {
            m.name.removeprefix(prefix): (tf.extractfile(m) or io.BytesIO()).read().decode()
            for m in tf.getmembers()
        }


# ---- what the checks read: real child processes ---------------------------------------


def test_the_kernel_log_is_read_through_dmesg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin" / "dmesg"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        "echo '[ 1.0] usb 1-1: new device'\n"
        "echo '[ 2.0] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert checks.read_kernel_log() == [
        "[ 2.0] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."
    ]
    fake.write_text("#!/bin/sh\necho 'dmesg: read kernel buffer failed' >&2\nexit 1\n")
    assert checks.read_kernel_log() is None


@pytest.mark.timeout(180)
def test_torch_is_asked_in_a_child_process(gpustation_dirs: dict[str, Path]) -> None:
    probe = checks.probe_torch()
    assert probe is not None and probe["torch"]  # torch (CPU) is installed here
    assert probe["cuda_available"] is False and probe["devices"] == []
