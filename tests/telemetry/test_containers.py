"""Each GPU process's container, systemd unit or Slurm job, from its real cgroup."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpustation.telemetry import containers
from gpustation.telemetry.containers import ContainerNames, cgroup_path, list_containers

from .cgroups import container_api, process_in_cgroup

DOCKER_ID = "4f1c" + "0123456789abcdef" * 3 + "a1b2c3d4e5f6"
POD_UID = "1d2e3f4a-5b6c-4d7e-8f90-a1b2c3d4e5f6"


@pytest.fixture
def no_runtime(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No daemon's socket is asked but the test's own."""
    monkeypatch.setattr(containers, "DOCKER_SOCKETS", ())
    monkeypatch.setattr(containers, "PODMAN_SOCKETS", ())
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("CONTAINER_HOST", raising=False)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'docker.sock'}")
    return tmp_path / "docker.sock"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (f"system.slice/docker-{DOCKER_ID}.scope", "docker/trainer"),
        (f"machine.slice/libpod-{DOCKER_ID}.scope", f"podman/{DOCKER_ID[:12]}"),
        (
            "kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{POD_UID.replace('-', '_')}.slice/"
            f"cri-containerd-{DOCKER_ID}.scope",
            f"k8s/pod-{POD_UID[:8]}",
        ),
        (
            "user.slice/user-1000.slice/user@1000.service/app.slice/ollama.service",
            "user-1000/ollama.service",
        ),
        ("system.slice/slurmstepd.scope/job_42/step_0", "slurm/job_42"),
        ("system.slice/gpustation-test-infer.service", "systemd/gpustation-test-infer.service"),
        ("user.slice/user-1000.slice/session-7.scope", None),
    ],
)
def test_a_process_in_a_runtime_s_cgroup_is_named_by_it(
    no_runtime: Path, path: str, expected: str | None
) -> None:
    with (
        container_api(no_runtime, [{"Id": DOCKER_ID, "Names": ["/trainer"]}]),
        process_in_cgroup(path) as pid,
    ):
        assert ContainerNames().name(pid) == expected


def test_a_cgroup_v1_layout_is_read_too(no_runtime: Path) -> None:
    with process_in_cgroup("system.slice/slurmstepd.scope/job_7/step_0", v1=True) as pid:
        assert ContainerNames().name(pid) == "slurm/job_7"
    text = f"12:pids:/docker/{DOCKER_ID}\n1:name=systemd:/docker/{DOCKER_ID}\n0::/\n"
    assert cgroup_path(text) == f"/docker/{DOCKER_ID}"


def test_without_a_runtime_socket_a_container_is_its_short_id(no_runtime: Path) -> None:
    with process_in_cgroup(f"system.slice/docker-{DOCKER_ID}.scope") as pid:
        assert ContainerNames().name(pid) == f"docker/{DOCKER_ID[:12]}"
    assert ContainerNames().name(2**22 + 1) is None  # no such process


def test_a_silent_runtime_costs_no_more_than_the_deadline(
    no_runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(containers, "API_DEADLINE_S", 0.3)
    with (
        container_api(no_runtime, []) as api,
        process_in_cgroup(f"system.slice/docker-{DOCKER_ID}.scope") as pid,
    ):
        api.silent = True
        names = ContainerNames(lister=lambda p: list_containers(p, containers.API_DEADLINE_S))
        start = time.monotonic()
        assert names.name(pid) == f"docker/{DOCKER_ID[:12]}"
        assert time.monotonic() - start < 2.0
        # not asked again at the next sample
        start = time.monotonic()
        assert names.name(pid) == f"docker/{DOCKER_ID[:12]}"
        assert time.monotonic() - start < 0.2 and len(api.requests) == 1


def test_a_runtime_answer_over_the_cap_or_not_a_list_is_refused(
    no_runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(containers, "API_CAP", 64 * 1024)
    many = [{"Id": f"{n:064x}", "Names": [f"/c{n}"]} for n in range(2000)]
    with container_api(no_runtime, many), pytest.raises(OSError, match="over"):
        list_containers(str(no_runtime))
    no_runtime.unlink()
    with (
        container_api(no_runtime, {"message": "page not found"}),  # type: ignore[arg-type]
        pytest.raises(ValueError, match="not a container list"),
    ):
        list_containers(str(no_runtime))
    no_runtime.unlink()
    with container_api(no_runtime, [{"Id": DOCKER_ID, "Names": ["/evil\x1b]0;x\x07"]}]):
        name = list_containers(str(no_runtime))[DOCKER_ID]
        assert name.startswith("evil") and "\x1b" not in name and "\x07" not in name
