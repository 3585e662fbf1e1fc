"""A real OpenSSH server on loopback, with simulated-GPU "hosts" behind it.

Used by the fleet tests and by ``bench/fleet_bench.py``. Everything lives in
one directory: host and user keys (made fresh by ``ssh-keygen`` each time), an
``sshd_config`` on a free port, a client ``ssh_config`` (pass it with
``GPUSTATION_SSH_CONFIG``), a remote command script (``GPUSTATION_REMOTE_COMMAND``)
and the nodes' Python for multi-node runs (``GPUSTATION_REMOTE_PYTHON``).

Every host alias (``box1``...) is 127.0.0.1 with ``SetEnv GPUSTATION_FAKE_HOST``;
sshd accepts that one variable, so the remote script knows which fake host it
plays and gives each its own state directory. A host's behaviour is set by the
file ``hosts/<name>/mode``: ``ok`` (default), ``garbage`` (prints non-JSON
lines), ``trickle`` (a byte a second, never a whole line) or ``fail`` (exits
with an error). The remote gpustation writes its PID
to ``hosts/<name>/pid`` so a test can kill it mid-stream.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
REPO = Path(__file__).resolve().parents[2]


def sshd_available() -> bool:
    return (
        Path(SSHD).exists() and shutil.which("ssh") is not None and bool(shutil.which("ssh-keygen"))
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_REMOTE = """#!/bin/sh
# Plays one fake host: picks its directory from GPUSTATION_FAKE_HOST (sent by
# the client's SetEnv), then behaves as hosts/<name>/mode says.
name="${{GPUSTATION_FAKE_HOST:-default}}"
dir="{root}/hosts/$name"
mkdir -p "$dir/state" "$dir/config" "$dir/data"
mode=$(cat "$dir/mode" 2>/dev/null || echo ok)
echo $$ > "$dir/pid"
case "$mode" in
  garbage)
    while :; do echo "<html>this is not a snapshot</html>"; sleep 0.3; done ;;
  trickle)
    while :; do printf '{{'; sleep 1; done ;;
  fail)
    echo "gpustation: cannot start on $name (test failure)" >&2; exit 3 ;;
esac
export GPUSTATION_STATE_DIR="$dir/state" GPUSTATION_CONFIG_DIR="$dir/config"
export GPUSTATION_DATA_DIR="$dir/data" GPUSTATION_SIMULATE="${{GPUSTATION_SIM_COUNT:-2}}"
export PYTHONPATH="{repo}" PYTHONDONTWRITEBYTECODE=1
exec "{python}" -m gpustation "$@"
"""


_REMOTE_PYTHON = """#!/bin/sh
# The nodes' Python for multi-node runs: this checkout's gpustation, the fake
# host's own directories, then what hosts/<name>/env adds (sourced). Mode
# ``fail`` makes the node fail before its Python starts, ``hang`` makes it
# accept the connection and never answer, ``deep`` sends a line of 100,000 ``[``
# and fails.
name="${{GPUSTATION_FAKE_HOST:-default}}"
dir="{root}/hosts/$name"
mkdir -p "$dir/state" "$dir/config" "$dir/data"
export GPUSTATION_STATE_DIR="$dir/state" GPUSTATION_CONFIG_DIR="$dir/config"
export GPUSTATION_DATA_DIR="$dir/data"
export PYTHONPATH="{repo}" PYTHONDONTWRITEBYTECODE=1
if [ -f "$dir/env" ]; then . "$dir/env"; fi
mode=$(cat "$dir/mode" 2>/dev/null || echo ok)
if [ "$mode" = fail ]; then
  echo "cannot start on $name (test failure)" >&2; exit 3
fi
if [ "$mode" = hang ]; then
  exec sleep 3600
fi
if [ "$mode" = deep ]; then
  head -c 100000 /dev/zero | tr '\\0' '['; echo; exit 3
fi
exec "{python}" "$@"
"""


class LoopbackSshd:
    """sshd on 127.0.0.1:<free port> serving fake hosts ``box1``..``boxN``."""

    def __init__(self, root: Path, aliases: int = 8) -> None:
        self.root = Path(root)
        self.aliases = [f"box{i}" for i in range(1, aliases + 1)]
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.user = getpass.getuser()

    # paths
    @property
    def client_config(self) -> Path:
        return self.root / "ssh_config"

    @property
    def remote_command(self) -> Path:
        return self.root / "remote-gpustation"

    @property
    def remote_python(self) -> Path:
        """The nodes' Python for multi-node runs (``GPUSTATION_REMOTE_PYTHON``)."""
        return self.root / "remote-python"

    def env(self) -> dict[str, str]:
        """Environment for a local gpustation that should read these hosts."""
        return {
            "GPUSTATION_SSH_CONFIG": str(self.client_config),
            "GPUSTATION_REMOTE_COMMAND": str(self.remote_command),
        }

    def host_dir(self, name: str) -> Path:
        d = self.root / "hosts" / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def set_mode(self, name: str, mode: str) -> None:
        (self.host_dir(name) / "mode").write_text(mode + "\n")

    def kill_remote(self, name: str) -> int:
        """Kill the remote gpustation of ``name`` (as if it crashed); return its PID."""
        pid = int((self.host_dir(name) / "pid").read_text().strip())
        os.kill(pid, signal.SIGKILL)
        return pid

    # lifecycle
    def start(self, timeout: float = 20.0) -> LoopbackSshd:
        self.root.mkdir(parents=True, exist_ok=True)
        for key in ("host_key", "user_key"):
            path = self.root / key
            if not path.exists():
                subprocess.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                    check=True,
                    stdin=subprocess.DEVNULL,
                )
        shutil.copy(self.root / "user_key.pub", self.root / "authorized_keys")
        os.chmod(self.root / "authorized_keys", 0o600)
        script = _REMOTE.format(root=self.root, repo=REPO, python=sys.executable)
        self.remote_command.write_text(script)
        self.remote_command.chmod(0o755)
        script = _REMOTE_PYTHON.format(root=self.root, repo=REPO, python=sys.executable)
        self.remote_python.write_text(script)
        self.remote_python.chmod(0o755)
        if os.geteuid() == 0:
            # sshd's privilege separation directory
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self.port = free_port()
        (self.root / "sshd_config").write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {self.root / 'host_key'}",
                    f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "PermitRootLogin yes",
                    f"PidFile {self.root / 'sshd.pid'}",
                    "AcceptEnv GPUSTATION_FAKE_HOST",
                    "PrintMotd no",
                    # many hosts connect at once in the benchmark
                    "MaxStartups 64",
                    "MaxSessions 64",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        blocks = []
        for alias in self.aliases:
            blocks += [f"Host {alias}", f"  SetEnv GPUSTATION_FAKE_HOST={alias}", ""]
        blocks += [
            "Host *",
            "  HostName 127.0.0.1",
            f"  Port {self.port}",
            f"  User {self.user}",
            f"  IdentityFile {self.root / 'user_key'}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {self.root / 'known_hosts'}",
            "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking no",
            "",
        ]
        self.client_config.write_text("\n".join(blocks))
        log = open(self.root / "sshd.log", "ab")  # noqa: SIM115 - lives as long as sshd
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"sshd exited with {self.proc.returncode}: "
                    + (self.root / "sshd.log").read_text(errors="replace")
                )
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1),
            ):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"sshd did not listen on port {self.port} within {timeout} s")

    def remote_pids(self) -> list[int]:
        """PIDs of the fake hosts' remote commands that are still running."""
        pids = []
        for pid_file in (self.root / "hosts").glob("*/pid"):
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text().strip())
                # only a process that is still one of ours (PIDs get reused)
                environ = Path(f"/proc/{pid}/environ").read_bytes()
                if b"GPUSTATION_FAKE_HOST=" in environ:
                    pids.append(pid)
        return pids

    def stop(self) -> None:
        """Stop sshd, then any remote command still running.

        sshd starts each session in a session of its own, so ending sshd's
        process group does not reach them; a remote command would end at its
        next write anyway, but nothing should outlive the server.
        """
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        self.proc = None
        for pid in self.remote_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while self.remote_pids() and time.monotonic() < deadline:
            time.sleep(0.05)

    def __enter__(self) -> LoopbackSshd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
