"""One node of a multi-node run: ``python -m gpustation.runs.multinode.node_agent``.

Started over ssh on every node by the coordinator (``coordinator.py``), with
the node's Python (``--remote-python``). The first line it reads from stdin
is a JSON object: ``argv`` (torchrun's arguments), ``env`` (variables for
the run) and ``grace_s`` (the stop grace). It starts
``python -m torch.distributed.run ARGV`` in a process group of its own and
writes JSON Lines to stdout, one message each::

    {"kind": "started", "pid": 4242, "pgid": 4242, "hostname": "box2", "dir": "/tmp/..."}
    {"kind": "log", "text": "..."}          a line of torchrun's stdout and stderr
    {"kind": "metric", "line": "{...}"}     a line rank 0 wrote, when rank 0 runs here
    {"kind": "telemetry", "sample": {...}}  the node's GPUs, once a second
    {"kind": "telemetry_off", "why": "..."} when they cannot be read (energy unknown)
    {"kind": "exit", "code": 0, "signal": null, "kept": null}

The runners find ``GPUSTATION_METRICS_FILE`` and ``GPUSTATION_RUN_DIR`` in a
fresh temporary directory of the node; the agent forwards what rank 0 writes
there and removes the directory at the end unless the run left other files in
it (``kept`` names it then).

After the first line stdin is the stop channel: ``stop`` starts a graceful
stop (SIGINT, the grace, SIGTERM, the grace, SIGKILL) of torchrun's group and
of every descendant (torchrun's workers run in sessions of their own). The end
of stdin means the coordinator or the connection is gone: the node stops the
same way, at once with SIGKILL when a stop was already under way. SIGINT,
SIGTERM and SIGHUP to the agent count as ``stop``. So a node never outlives
its run, even when the machine that started it goes away. The agent exits
with torchrun's exit status.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from gpustation.pyargv import python_argv
from gpustation.runs import rundir
from gpustation.runs.gputrace import SAMPLE_INTERVAL_S, TraceSampler
from gpustation.runs.launch.stop import DEFAULT_GRACE_S, signal_name, terminate_group
from gpustation.runs.launch.supervisor import become_subreaper, live_descendants
from gpustation.runs.metrics import METRICS_ENV, RUN_DIR_ENV
from gpustation.runs.tail import Tailer

MAX_SPEC_BYTES = 1024 * 1024
#: a line of output longer than this is sent in pieces
MAX_LINE_BYTES = 64 * 1024


class _Out:
    """The message stream to the coordinator; a write that fails means it is gone."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.broken = False

    def send(self, kind: str, **fields: Any) -> None:
        line = json.dumps({"kind": kind, **fields}, separators=(",", ":")) + "\n"
        with self.lock:
            if self.broken:
                return
            try:
                os.write(1, line.encode())
            except OSError:
                self.broken = True


class _Telemetry:
    """The node's GPUs (those of CUDA_VISIBLE_DEVICES when set, else all)."""

    def __init__(self, env: dict[str, str], out: _Out) -> None:
        self.trace: TraceSampler | None = None
        self.out = out
        t0 = time.monotonic()
        visible = env.get("CUDA_VISIBLE_DEVICES")
        try:
            gpus = [int(x) for x in visible.split(",") if x.strip()] if visible else None
        except ValueError:
            gpus = None
        try:
            self.trace = TraceSampler(gpus, t0)
        except Exception as err:
            out.send("telemetry_off", why=str(err) or type(err).__name__)
            return
        if not self.trace.sampler.gpus:
            out.send("telemetry_off", why="no GPUs on this node")
            self.close()

    def sample(self, pids: set[int], final: bool = False) -> None:
        if self.trace is None:
            return
        try:
            sample = self.trace.line(pids, final)
        except Exception as err:
            self.out.send("telemetry_off", why=f"GPU readings stopped: {err}")
            self.close()
            return
        self.out.send("telemetry", sample=sample, simulated=bool(self.trace.backend.simulated))

    def close(self) -> None:
        if self.trace is not None:
            self.trace.close()
            self.trace = None


def torchrun_argv(args: list[str]) -> list[str]:
    """torchrun on this node, the working directory off its path (its workers'
    too, through the spec's environment, when they run gpustation's runner)."""
    return python_argv("-m", "torch.distributed.run", *args)


def _read_spec() -> tuple[dict[str, Any], bytes]:
    """The first line of stdin as a JSON object, and any bytes read past it."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(0, 65536)
        if not chunk:
            raise ValueError("stdin ended before the run's description")
        data += chunk
        if len(data) > MAX_SPEC_BYTES:
            raise ValueError("the run's description is too long")
    line, _, rest = data.partition(b"\n")
    spec = json.loads(line)
    if not isinstance(spec, dict):
        raise ValueError("the run's description is not a JSON object")
    argv, env = spec.get("argv"), spec.get("env") or {}
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) or not argv:
        raise ValueError("argv must be a list of strings")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError("env must map names to strings")
    return spec, rest


class _Descendants:
    """torchrun's descendants seen so far, ``[pid, create_time, start]`` (the living only)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.known: list[list[Any]] = []

    def refresh(self) -> None:
        self.known = live_descendants(self.pid, self.known)

    def pids(self) -> set[int]:
        return {self.pid, *(int(e[0]) for e in self.known)}


def _working_directory(spec: dict[str, Any], out: _Out) -> str | None:
    """Where torchrun runs: the spec's ``cwd`` if this node has it; else, unless it
    was asked for (``--node-dir``), this process's own (the remote home), said in
    the log; None (after saying why) when an asked-for one is missing."""
    wanted = spec.get("cwd")
    here = os.getcwd()
    if not isinstance(wanted, str) or not wanted:
        return here
    if os.path.isdir(wanted):
        return wanted
    host = socket.gethostname()
    if spec.get("cwd_required"):
        out.send("log", text=f"gpustation node: --node-dir {wanted}: no such directory on {host}")
        return None
    out.send(
        "log",
        text=f"gpustation node: {host} has no {wanted} (the launcher's directory); "
        f"running in {here}",
    )
    return here


def run_node() -> int:
    out = _Out()
    try:
        spec, pending = _read_spec()
    except (ValueError, OSError) as err:
        print(f"gpustation node: {err}", file=sys.stderr, flush=True)
        return 2
    grace_s = float(spec.get("grace_s") or DEFAULT_GRACE_S)
    workdir = Path(tempfile.mkdtemp(prefix="gpustation-node-"))
    metrics = workdir / rundir.METRICS_FILE
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    env.update({METRICS_ENV: str(metrics), RUN_DIR_ENV: str(workdir), "PYTHONUNBUFFERED": "1"})

    stop_asked = threading.Event()
    force = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop_asked.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    # A write to a closed connection is an error to handle, not a death.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    become_subreaper()
    cwd = _working_directory(spec, out)
    if cwd is None:
        out.send("exit", code=2, signal=None, kept=None)
        shutil.rmtree(workdir, ignore_errors=True)
        return 2
    argv = torchrun_argv(spec["argv"])
    try:
        child = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=env,
        )
    except OSError as err:
        out.send("log", text=f"gpustation node: cannot start torchrun: {err.strerror or err}")
        out.send("exit", code=127, signal=None, kept=None)
        shutil.rmtree(workdir, ignore_errors=True)
        return 127
    create_time = rundir.create_time_of(child.pid)
    start = rundir.start_of(child.pid)
    out.send(
        "started",
        pid=child.pid,
        pgid=child.pid,
        hostname=socket.gethostname(),
        dir=str(workdir),
        cwd=cwd,
    )
    descendants = _Descendants(child.pid)
    telemetry = _Telemetry(env, out)
    tail = Tailer(metrics)

    def send_metrics() -> None:
        for raw in tail.read_new():
            line = raw.decode("utf-8", errors="replace")
            if line.strip():
                out.send("metric", line=line)

    stopper: list[threading.Thread] = []

    def start_stop() -> None:
        if stopper:
            return
        descendants.refresh()
        thread = threading.Thread(
            target=terminate_group,
            args=(child.pid, child.pid, create_time, grace_s),
            kwargs={
                "force_now": force.is_set,
                "known": list(descendants.known),
                "leader_start": start,
            },
            daemon=True,
        )
        stopper.append(thread)
        thread.start()

    assert child.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(child.stdout, selectors.EVENT_READ, "out")
    with contextlib.suppress(ValueError, OSError):
        sel.register(0, selectors.EVENT_READ, "in")
    control = pending
    buffer = b""
    next_sample = time.monotonic()
    output_open = True
    swept = False
    while output_open or child.poll() is None:
        if b"\n" in control:
            *commands, control = control.split(b"\n")
            if any(c.strip() == b"stop" for c in commands):
                stop_asked.set()
        if stop_asked.is_set():
            start_stop()
        if out.broken and not stop_asked.is_set():
            stop_asked.set()
            start_stop()
        for key, _ in sel.select(timeout=0.2):
            if key.data == "in":
                chunk = b""
                with contextlib.suppress(OSError):
                    chunk = os.read(0, 4096)
                if chunk:
                    control += chunk
                    continue
                sel.unregister(0)
                # The coordinator (or the connection) is gone.
                if stop_asked.is_set():
                    force.set()
                stop_asked.set()
                start_stop()
                continue
            chunk = os.read(child.stdout.fileno(), 65536)
            if not chunk:
                sel.unregister(child.stdout)
                output_open = False
                continue
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            if len(buffer) > MAX_LINE_BYTES:
                lines.append(buffer)
                buffer = b""
            for raw in lines:
                out.send("log", text=raw.decode("utf-8", errors="replace").rstrip("\r"))
        send_metrics()
        now = time.monotonic()
        if now >= next_sample:
            descendants.refresh()
            telemetry.sample(descendants.pids())
            next_sample = now + SAMPLE_INTERVAL_S
        if not output_open:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=0.2)
        elif child.poll() is not None and not swept:
            # torchrun has ended but its output is still open: workers it left
            # behind hold it. They end with it.
            swept = True
            descendants.refresh()
            terminate_group(child.pid, None, None, grace_s=1.0, known=descendants.known)
    sel.close()
    if buffer:
        out.send("log", text=buffer.decode("utf-8", errors="replace"))
    send_metrics()
    tail.close()
    telemetry.sample(descendants.pids(), final=True)
    telemetry.close()
    # Workers left behind (their own sessions, or re-parented here) end with torchrun.
    descendants.refresh()
    terminate_group(child.pid, None, None, grace_s=1.0, known=descendants.known)
    for thread in stopper:
        thread.join(timeout=5)
    code = child.returncode
    sig_name = None
    if code < 0:
        sig_name = signal_name(-code)
    with contextlib.suppress(OSError):
        metrics.unlink()
    kept: str | None = None
    try:
        workdir.rmdir()
    except OSError:
        kept = str(workdir)  # the run left files there (a profile, an adapter...)
    out.send("exit", code=code, signal=sig_name, kept=kept)
    return code if code >= 0 else 128 + (-code)


def main() -> int:
    return run_node()


if __name__ == "__main__":
    raise SystemExit(main())
