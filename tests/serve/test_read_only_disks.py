"""The readers (``serve``, ``snapshot``) start on read-only data and state
directories, as under systemd's ``ProtectHome=read-only`` or in a read-only
container, and say what they cannot keep there.

The directories are made read-only by a read-only bind mount in a mount
namespace of the child's own (``unshare --mount``): root ignores mode bits,
but not a read-only mount.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import FAKE_NVML_DIR, REPO, child_env, gpustation_cmd
from tests.fleet.sshd import free_port
from tests.tools import missing, tool

_MOUNT_READ_ONLY = (
    'IFS=:; for d in $RO_DIRS; do mount --bind "$d" "$d" && mount -o remount,bind,ro "$d" '
    '|| exit 97; done; unset IFS; exec "$@"'
)


def _on_read_only(dirs: list[Path], argv: list[str]) -> list[str]:
    """``argv`` run with ``dirs`` mounted read-only for it alone."""
    unshare = tool("unshare", "Debian: util-linux")
    probe = subprocess.run(
        [unshare, "--mount", "sh", "-c", "mount --bind / /mnt"], capture_output=True, timeout=30
    )
    if probe.returncode != 0:
        missing("a mount namespace of one's own (unshare --mount, as root)")
    return [unshare, "--mount", "--", "sh", "-c", _MOUNT_READ_ONLY, "sh", *argv]


def _env(dirs: list[Path]) -> dict[str, str]:
    # the fake driver, so that snapshot takes the NVML path with its static cache
    return child_env(
        PYTHONPATH=os.pathsep.join([str(FAKE_NVML_DIR), str(REPO)]),
        RO_DIRS=":".join(map(str, dirs)),
    )


def test_snapshot_starts_on_read_only_dirs_and_says_the_static_values_are_not_kept(
    gpustation_dirs: dict[str, Path],
) -> None:
    dirs = [gpustation_dirs["data"], gpustation_dirs["state"]]
    result = subprocess.run(
        _on_read_only(dirs, gpustation_cmd("snapshot")),
        env=_env(dirs),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "NVIDIA H200" in result.stdout
    assert f"{gpustation_dirs['state']} is read-only" in result.stderr
    assert "not kept between snapshots" in result.stderr
    assert list(gpustation_dirs["state"].iterdir()) == []
    # on a writable directory the same command keeps them, and says nothing
    again = subprocess.run(
        gpustation_cmd("snapshot"), env=_env(dirs), capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0 and "read-only" not in again.stderr
    assert [p.name for p in gpustation_dirs["state"].iterdir()] == ["nvml-static.marshal"]


def test_serve_starts_on_read_only_dirs_serves_and_says_it_does_not_record(
    gpustation_dirs: dict[str, Path], tmp_path: Path
) -> None:
    (gpustation_dirs["config"] / "config.toml").write_text("[record]\nenabled = true\n")
    dirs = [gpustation_dirs["data"], gpustation_dirs["state"]]
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            _on_read_only(dirs, gpustation_cmd("serve", "--listen", f"127.0.0.1:{port}")),
            env=_env(dirs),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 60
        while b"serving" not in log.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"serve did not start ({proc.poll()}): {log.read_text()}")
            time.sleep(0.05)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
            assert b"DCGM_FI_DEV_GPU_TEMP" in resp.read()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = log.read_text()
    assert "not recording" in text and "Read-only file system" in text, text
    assert "Traceback" not in text
    assert list(gpustation_dirs["data"].iterdir()) == []


def test_snapshot_starts_where_its_dirs_are_missing_under_a_read_only_home(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    data, state = home / ".local/share/gpustation", home / ".local/state/gpustation"
    env = _env([home])
    env.update(GPUSTATION_DATA_DIR=str(data), GPUSTATION_STATE_DIR=str(state))
    result = subprocess.run(
        _on_read_only([home], gpustation_cmd("snapshot", "--json")),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert '"gpus"' in result.stdout
    assert f"{state} is read-only" in result.stderr
    assert list(home.iterdir()) == []


def test_simulated_gpus_on_a_read_only_state_dir_are_kept_in_memory(
    gpustation_dirs: dict[str, Path],
) -> None:
    dirs = [gpustation_dirs["data"], gpustation_dirs["state"]]
    result = subprocess.run(
        _on_read_only(dirs, gpustation_cmd("snapshot", "--simulate", "2")),
        env=_env(dirs),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "SIMULATED" in result.stdout and "Traceback" not in result.stderr
    assert "the simulated GPUs' state is not kept" in result.stdout
