"""The local side of a multi-node run: ``python -m gpustation.runs.multinode.coordinator RUN_DIR``.

The run's supervisor starts it as the run's child, so the run is supervised,
stopped and recorded like any other. It starts one ssh per node (the argv
``multinode.py`` put in ``run.json``) running ``node_agent.py``, sends each
node its description on the connection's stdin, and reads the messages the
nodes send back (one select loop, no threads; each line parsed by
``jsondoc.loads``, within a size cap):

- a node's log lines go to ``nodes/<host>/output.log`` and, prefixed
  ``[host]``, to stdout (the run's ``output.log``); what ssh or the remote
  shell say on stderr goes the same way;
- metric lines (rank 0's) are appended to the run's ``metrics.jsonl``;
- telemetry samples go to ``nodes/<host>/telemetry.jsonl``;
- starts and ends update ``nodes.json`` (see ``nodes.py``).

Stopping: SIGINT, SIGTERM or SIGHUP (``runs stop`` signals this process's
group) or the run's stop marker make it send ``stop`` to every node, whose
agent stops torchrun gracefully and reports how it ended; the ssh clients
are started with those signals ignored, so the connections stay up to carry
the last lines and exit statuses. Should the ssh clients be killed anyway,
each agent sees its stdin end and stops its node at once.

A node whose agent has not said ``started`` within the plan's
``start_timeout_s`` of its ssh starting has its ssh killed and counts as
failed (stopped, when a stop was under way), so a host that accepts ssh and
never answers cannot keep the run waiting. A node that ends with a non-zero
status while no stop was asked fails the run: it is named in ``nodes.json``'s
``reason``, the other nodes are stopped, and this process exits 1. It exits
0 when every node succeeded and 130 when the run was stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpustation import jsondoc, private
from gpustation.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK
from gpustation.redact import REDACTED
from gpustation.runs import rundir
from gpustation.runs.gputrace import write_sample
from gpustation.runs.launch.stop import signal_name
from gpustation.runs.multinode.nodes import (
    DEFAULT_START_TIMEOUT_S,
    NODE_TELEMETRY,
    NODES_JSON,
    node_dir,
)

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: a node's line longer than this is not a message (the agent cuts its log lines far shorter)
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def _ignore_stop_signals() -> None:
    # In the ssh client (before exec): OpenSSH keeps an ignored signal ignored.
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def node_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A node's spec as it is sent: the values ``run.json`` keeps as ``***`` taken
    from this process's environment, where the supervisor put them (a variable
    without one is left out, never sent as ``***``)."""
    env = {}
    for key, value in (spec.get("env") or {}).items():
        if value != REDACTED:
            env[key] = value
        elif key in os.environ:
            env[key] = os.environ[key]
    return {**spec, "env": env}


@dataclass
class Node:
    host: str
    ssh: list[str]
    spec: dict[str, Any]
    log: IO[bytes]
    telemetry: Path
    proc: subprocess.Popen[bytes] | None = None
    open_streams: int = 0
    buffers: dict[str, bytes] = field(default_factory=lambda: {"out": b"", "err": b""})
    status: str = "starting"
    exit_code: int | None = None
    signal: str | None = None
    error: str | None = None
    remote_pid: int | None = None
    remote_pgid: int | None = None
    hostname: str | None = None
    telemetry_off: str | None = None
    simulated: bool = False
    kept: str | None = None
    cwd: str | None = None
    started_at: float | None = None  # time.monotonic() when its ssh started
    reported: bool = False  # the agent sent its exit message
    stop_sent: bool = False
    last_stderr: str | None = None

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed", "stopped")

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "status": self.status,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "error": self.error,
            "remote_pid": self.remote_pid,
            "remote_pgid": self.remote_pgid,
            "hostname": self.hostname,
            "telemetry_off": self.telemetry_off,
            "simulated": self.simulated,
            "kept": self.kept,
            "cwd": self.cwd,
        }


class Coordinator:
    def __init__(self, directory: Path, run: dict[str, Any]) -> None:
        self.directory = directory
        plan = run["multinode"]
        self.hosts = list(plan["hosts"])
        self.start_timeout_s = float(plan.get("start_timeout_s") or DEFAULT_START_TIMEOUT_S)
        self.nodes: list[Node] = []
        for entry in plan["nodes"]:
            folder = node_dir(directory, entry["host"])
            folder.mkdir(parents=True, exist_ok=True)
            self.nodes.append(
                Node(
                    host=entry["host"],
                    ssh=list(entry["ssh"]),
                    spec=node_spec(entry["spec"]),
                    log=open(  # noqa: SIM115
                        folder / rundir.OUTPUT_LOG, "ab", buffering=0, opener=private.opener
                    ),
                    telemetry=folder / NODE_TELEMETRY,
                )
            )
        self.metrics = open(  # noqa: SIM115
            directory / rundir.METRICS_FILE, "ab", buffering=0, opener=private.opener
        )
        self.sel = selectors.DefaultSelector()
        self.signals: list[int] = []
        self.stopping = False
        self.failed: Node | None = None
        self.reason: str | None = None

    # -- output ------------------------------------------------------------
    def _say(self, node: Node, text: str) -> None:
        line = text.encode("utf-8", errors="replace")
        with contextlib.suppress(OSError):
            node.log.write(line + b"\n")
        with contextlib.suppress(OSError):
            os.write(1, b"[" + node.host.encode() + b"] " + line + b"\n")

    def _write_nodes(self) -> None:
        doc = {
            "hosts": self.hosts,
            "reason": self.reason,
            "failed": self.failed.host if self.failed else None,
            "nodes": [node.to_dict() for node in self.nodes],
        }
        try:
            rundir.write_json(self.directory / NODES_JSON, doc)
        except OSError as err:
            print(f"gpustation: could not write {NODES_JSON}: {err}", file=sys.stderr)

    # -- nodes ---------------------------------------------------------------
    def start(self) -> None:
        for node in self.nodes:
            try:
                node.proc = subprocess.Popen(
                    node.ssh,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    close_fds=True,
                    preexec_fn=_ignore_stop_signals,  # the coordinator has no threads
                )
            except OSError as err:
                node.error = f"cannot run {node.ssh[0]}: {err.strerror or err}"
                self._say(node, f"gpustation: {node.error}")
                self._end(node, 127)
                continue
            node.started_at = time.monotonic()
            assert node.proc.stdin and node.proc.stdout and node.proc.stderr
            self.sel.register(node.proc.stdout, selectors.EVENT_READ, (node, "out"))
            self.sel.register(node.proc.stderr, selectors.EVENT_READ, (node, "err"))
            node.open_streams = 2
            self._send(node, json.dumps(node.spec, separators=(",", ":")))
        self._write_nodes()

    def _send(self, node: Node, line: str) -> None:
        if node.proc is None or node.proc.stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):
            node.proc.stdin.write(line.encode() + b"\n")
            node.proc.stdin.flush()

    def check_starts(self, now: float) -> None:
        """A node whose agent has not started torchrun in time fails (or, while
        stopping, is stopped): its ssh is killed, which ends its streams."""
        for node in self.nodes:
            if (
                node.status != "starting"
                or node.proc is None
                or node.started_at is None
                or node.error is not None
                or now - node.started_at < self.start_timeout_s
            ):
                continue
            node.error = (
                f"no answer within {self.start_timeout_s:g} s of starting ssh (the node "
                "agent did not start torchrun; is the host up and --remote-python right?)"
            )
            self._say(node, f"gpustation: {node.error}")
            with contextlib.suppress(OSError):
                node.proc.kill()  # it ignores the stop signals; its EOF ends the node

    def stop_all(self) -> None:
        for node in self.nodes:
            if not node.done and not node.stop_sent:
                node.stop_sent = True
                self._send(node, "stop")

    def _message(self, node: Node, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        try:
            msg = jsondoc.loads(raw, MAX_MESSAGE_BYTES)
        except jsondoc.DocumentError:
            msg = None
        if not isinstance(msg, dict) or not isinstance(msg.get("kind"), str):
            if text.strip():
                self._say(node, text)  # the remote shell's own output
            return
        kind = msg["kind"]
        if kind == "log":
            self._say(node, str(msg.get("text", "")))
        elif kind == "metric":
            line = str(msg.get("line", "")).replace("\n", " ")
            with contextlib.suppress(OSError):
                self.metrics.write(line.encode() + b"\n")
        elif kind == "telemetry" and isinstance(msg.get("sample"), dict):
            node.simulated = bool(msg.get("simulated"))
            with contextlib.suppress(OSError):
                write_sample(node.telemetry, msg["sample"])
        elif kind == "telemetry_off":
            node.telemetry_off = str(msg.get("why") or "unknown")
            self._write_nodes()
        elif kind == "started":
            node.status = "running"
            node.remote_pid = _int(msg.get("pid"))
            node.remote_pgid = _int(msg.get("pgid"))
            node.hostname = str(msg["hostname"]) if msg.get("hostname") else None
            node.cwd = str(msg["cwd"]) if msg.get("cwd") else None
            self._say(
                node,
                f"gpustation: torchrun started on {node.hostname} as pid {node.remote_pid}"
                + (f" in {node.cwd}" if node.cwd else ""),
            )
            self._write_nodes()
        elif kind == "exit":
            node.reported = True
            node.signal = str(msg["signal"]) if msg.get("signal") else None
            node.exit_code = None if node.signal else _int(msg.get("code"))
            node.kept = str(msg["kept"]) if msg.get("kept") else None
            end = f"killed by {node.signal}" if node.signal else f"exited {node.exit_code}"
            self._say(node, f"gpustation: torchrun {end}")
            if node.kept:
                self._say(node, f"gpustation: the run left files on the node in {node.kept}")

    def _read(self, node: Node, which: str, fd: int) -> None:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            self.sel.unregister(fd)
            node.open_streams -= 1
            rest = node.buffers[which]
            if rest.strip():
                self._line(node, which, rest)
            if node.open_streams == 0 and node.proc is not None:
                self._end(node, node.proc.wait())
            return
        node.buffers[which] += chunk
        *lines, node.buffers[which] = node.buffers[which].split(b"\n")
        if len(node.buffers[which]) > MAX_MESSAGE_BYTES:  # no message is this long: text
            lines.append(node.buffers[which])
            node.buffers[which] = b""
        for raw in lines:
            self._line(node, which, raw)

    def _line(self, node: Node, which: str, raw: bytes) -> None:
        if which == "out":
            self._message(node, raw)
            return
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        if text.strip():
            node.last_stderr = text.strip()
            self._say(node, text)

    def _end(self, node: Node, ssh_code: int) -> None:
        if node.proc is not None and node.proc.stdin is not None:
            with contextlib.suppress(OSError):
                node.proc.stdin.close()
        if not node.reported:
            # The agent never said how torchrun ended: ssh's status is all there is.
            node.exit_code = ssh_code
            if node.error is not None:
                pass  # said already (it could not start, or not in time)
            elif ssh_code == 255:
                node.error = f"ssh failed: {node.last_stderr or 'connection lost'}"
            elif ssh_code < 0:
                node.error = f"the connection was cut (ssh killed by {signal_name(-ssh_code)})"
        ok = node.exit_code == 0 and not node.signal
        if ok:
            node.status = "succeeded"
        elif node.stop_sent or self.stopping:
            node.status = "stopped"
        else:
            node.status = "failed"
            if self.failed is None:
                self.failed = node
                self.reason = _failure_text(node)
                self._say(node, f"gpustation: {self.reason}; stopping the other nodes")
                self.stop_all()
        self._write_nodes()

    # -- the loop ------------------------------------------------------------
    def run(self) -> int:
        for sig in _STOP_SIGNALS:
            signal.signal(sig, lambda signum, _frame: self.signals.append(signum))
        if rundir.stop_requested(self.directory):
            self.stopping = True
        self.start()
        next_marker_check = 0.0
        while not all(node.done for node in self.nodes):
            now = time.monotonic()
            if not self.stopping and now >= next_marker_check:
                next_marker_check = now + 0.5
                if self.signals or rundir.stop_requested(self.directory):
                    self.stopping = True
            if self.stopping:
                self.stop_all()
            self.check_starts(now)
            for key, _ in self.sel.select(timeout=0.2):
                node, which = key.data
                self._read(node, which, key.fd)
            if self.signals and not self.stopping:
                self.stopping = True
        self.sel.close()
        self.metrics.close()
        for node in self.nodes:
            node.log.close()
        self._write_nodes()
        if self.failed is not None:
            return EXIT_FAILURE
        if self.stopping:
            return EXIT_INTERRUPTED
        return EXIT_OK if all(n.status == "succeeded" for n in self.nodes) else EXIT_FAILURE


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _failure_text(node: Node) -> str:
    if node.error:
        return f"node {node.host}: {node.error}"
    if node.signal:
        return f"node {node.host} was killed by {node.signal}"
    return f"node {node.host} exited {node.exit_code}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m gpustation.runs.multinode.coordinator RUN_DIR", file=sys.stderr)
        return 2
    directory = Path(argv[0])
    run = rundir.read_run(directory, exact=True)
    if run is None or not isinstance(run.get("multinode"), dict):
        print(f"gpustation: {directory} holds no multi-node run", file=sys.stderr)
        return 2
    return Coordinator(directory, run).run()


if __name__ == "__main__":
    raise SystemExit(main())
