"""Who runs a GPU process: its container, systemd unit or Slurm job, from its cgroup.

The driver lists host PIDs; ``/proc/PID/cgroup`` says where each sits, in the
names the runtimes give their cgroups (systemd and cgroupfs drivers alike)::

    system.slice/docker-<64 hex>.scope                docker/<name or short id>
    machine.slice/libpod-<64 hex>.scope               podman/<name or short id>
    kubepods.slice/...-pod<uid>.slice/cri-containerd-<id>.scope   k8s/pod-<uid>
    system.slice/containerd.service/.../<id>, crio-<id>.scope     containerd/, crio/
    system.slice/slurmstepd.scope/job_42/step_0       slurm/job_42
    system.slice/ollama.service                       systemd/ollama.service
    user.slice/user-1000.slice/user@1000.service/app.slice/x.service   user-1000/x.service

The cgroup v2 line is read where the process has one, else the v1 hierarchies
(``name=systemd`` first). Docker and Podman container ids get their names
through the runtime's API socket where this user can read it (``GET
/containers/json``, the same in both; ``DOCKER_HOST`` and ``CONTAINER_HOST``
name others), under a short deadline and a size cap; else the short id. A
login session or a terminal's scope is nobody's container: None.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Callable

from gpustation.textsafe import safe

#: a cgroup file is a few lines; a PID's is never more
_CGROUP_CAP = 64 * 1024
#: the whole answer of a runtime's container list, and how long it may take
API_CAP = 4 * 1024 * 1024
API_DEADLINE_S = 0.5
#: how often a runtime is asked again for an id it did not know (a new container)
API_RETRY_S = 10.0

DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")
PODMAN_SOCKETS = ("/run/podman/podman.sock",)

_HEX = r"[0-9a-f]{64}"
# (runtime, pattern giving the id), tried in order on the cgroup path
_CONTAINER_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("docker", re.compile(rf"(?:/docker-({_HEX})\.scope|/docker/({_HEX}))(?:/|$)")),
    ("podman", re.compile(rf"(?:/libpod-({_HEX})\.scope|/libpod-({_HEX}))(?:/|$)")),
    ("crio", re.compile(rf"/crio-({_HEX})\.scope(?:/|$)")),
    (
        "containerd",
        re.compile(rf"(?:/cri-containerd-({_HEX})\.scope|/containerd[^/]*/(?:.*/)?({_HEX}))"),
    ),
)
_POD = re.compile(r"/kubepods\b.*?[-/]pod([0-9a-f]{8}[-_][0-9a-f_-]{27})(?:\.slice)?(?:/|$)")
_SLURM = re.compile(r"/(?:slurmstepd\.scope|slurm)/(?:uid_\d+/)?job_(\d+)(?:/|$)")
_USER_UNIT = re.compile(r"/user@(\d+)\.service/(?:[^/]+\.slice/)*([^/]+\.service)(?:/|$)")
_SYSTEM_UNIT = re.compile(r"^/system\.slice/(?:[^/]+\.slice/)*([^/]+\.service)(?:/|$)")


def cgroup_path(text: str) -> str | None:
    """The path that names a process's place, from ``/proc/PID/cgroup``'s lines."""
    v1: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        number, controllers, path = parts
        if number == "0" and controllers == "":
            if path not in ("", "/"):
                return path
            continue
        v1[controllers] = path
    # cgroup v1 (or hybrid with nothing in the v2 tree): systemd's own
    # hierarchy names units; any controller's names containers.
    ordered = [v1.pop("name=systemd", ""), *sorted(v1.values(), key=len, reverse=True)]
    for path in ordered:
        if path not in ("", "/") and container_of_path(path) is not None:
            return path
    return None


def container_of_path(path: str) -> tuple[str, str] | None:
    """``(kind, id)`` of what a cgroup path says the process runs in, None for nothing."""
    path = "/" + path.strip("/")
    pod = _POD.search(path)
    if pod:
        return "k8s", pod.group(1).replace("_", "-")
    for kind, pattern in _CONTAINER_PATTERNS:
        found = pattern.search(path)
        if found:
            return kind, next(g for g in found.groups() if g)
    slurm = _SLURM.search(path)
    if slurm:
        return "slurm", f"job_{slurm.group(1)}"
    user = _USER_UNIT.search(path)
    if user:
        return f"user-{user.group(1)}", user.group(2)
    unit = _SYSTEM_UNIT.search(path)
    if unit:
        return "systemd", unit.group(1)
    return None


def _unix_path(variable: str) -> str | None:
    value = os.environ.get(variable, "")
    return value[len("unix://") :] if value.startswith("unix://") else None


def runtime_sockets(kind: str) -> list[str]:
    """The API sockets that may name a ``docker`` or ``podman`` container."""
    if kind == "docker":
        own, standard = _unix_path("DOCKER_HOST"), DOCKER_SOCKETS
    elif kind == "podman":
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        user = (f"{xdg}/podman/podman.sock",) if xdg else ()
        own, standard = _unix_path("CONTAINER_HOST"), (*PODMAN_SOCKETS, *user)
    else:
        return []
    return [p for p in dict.fromkeys([own, *standard]) if p]


def list_containers(socket_path: str, deadline_s: float = API_DEADLINE_S) -> dict[str, str]:
    """``{id: name}`` from a runtime's ``GET /containers/json`` over its Unix socket.

    Raises OSError (no socket, refused, too slow, too big) or ValueError (not
    the API's answer): the caller shows short ids.
    """

    end = time.monotonic() + deadline_s
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(deadline_s)
        sock.connect(socket_path)
        sock.sendall(b"GET /containers/json HTTP/1.0\r\nHost: localhost\r\n\r\n")
        chunks: list[bytes] = []
        size = 0
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{socket_path}: no whole answer within {deadline_s:g} s")
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > API_CAP:
                raise OSError(f"{socket_path}: answer over {API_CAP} bytes")
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or status[1] != b"200":
        raise ValueError(f"{socket_path}: answered {head[:80]!r}")
    if b"transfer-encoding: chunked" in head.lower():
        body = _unchunk(body)
    doc = json.loads(body)
    if not isinstance(doc, list):
        raise ValueError(f"{socket_path}: not a container list")
    names: dict[str, str] = {}
    for entry in doc:
        if not isinstance(entry, dict):
            continue
        cid, given = entry.get("Id"), entry.get("Names")
        if isinstance(cid, str) and isinstance(given, list) and given and isinstance(given[0], str):
            names[cid] = safe(given[0].lstrip("/"))[:128]
    return names


def _unchunk(body: bytes) -> bytes:
    out = bytearray()
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return bytes(out)


class ContainerNames:
    """A process's container as one word: ``docker/web-1``, ``slurm/job_42`` (None: none).

    Runtimes' answers are kept, so a sample asks a socket only when it meets
    an id not seen before, and no more than every :data:`API_RETRY_S`.
    """

    def __init__(
        self,
        proc_root: str = "/proc",
        lister: Callable[[str], dict[str, str]] = list_containers,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc_root = proc_root
        self._lister = lister
        self._clock = clock
        self._names: dict[str, str] = {}
        self._asked: dict[str, float] = {}

    def name(self, pid: int) -> str | None:
        try:
            with open(f"{self.proc_root}/{pid}/cgroup", "rb") as fh:
                text = fh.read(_CGROUP_CAP).decode("utf-8", "replace")
        except OSError:
            return None  # gone, or another PID namespace's
        path = cgroup_path(text)
        found = None if path is None else container_of_path(path)
        if found is None:
            return None
        kind, ident = found
        if kind in ("docker", "podman"):
            return f"{kind}/{self._resolve(kind, ident) or ident[:12]}"
        if kind in ("containerd", "crio"):
            return f"{kind}/{ident[:12]}"
        if kind == "k8s":
            return f"k8s/pod-{ident[:8]}"
        return safe(f"{kind}/{ident}")

    def _resolve(self, kind: str, ident: str) -> str | None:
        if ident in self._names:
            return self._names[ident]
        now = self._clock()
        if now - self._asked.get(kind, float("-inf")) < API_RETRY_S:
            return None
        self._asked[kind] = now
        for path in runtime_sockets(kind):
            try:
                self._names.update(self._lister(path))
            except (OSError, ValueError):
                continue
        if len(self._names) > 4096:
            self._names.clear()
        return self._names.get(ident)
