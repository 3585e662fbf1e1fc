"""Multi-node runs: two "hosts" behind a real sshd on loopback, torchrun's c10d
rendezvous between them, DDP with gloo on the CPU.

Each host is an ssh alias of 127.0.0.1 (tests/fleet/sshd.py); the nodes' Python
is a script that runs this checkout with the host's own directories, plus what
``hosts/<name>/env`` adds: the first host has simulated GPUs (its energy is
known), the second a driver that is not loaded (its energy is unknown).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import psutil
import pytest

from gpustation import paths
from gpustation.errors import EXIT_USAGE, UsageError
from gpustation.fleet.fleet import load_fleet_config
from gpustation.runs import rundir
from gpustation.runs.launch.stop import wait_for_end
from gpustation.runs.multinode.launch import REMOTE_PYTHON_ENV, node_argv, resolve_remote_python
from gpustation.runs.multinode.nodes import read_nodes
from gpustation.runs.presets import RunPreset
from gpustation.runs.store.index import RunStore
from tests.conftest import FAKE_NVML_DIR, run_gpustation
from tests.fleet.sshd import LoopbackSshd, free_port
from tests.runs.conftest import RunsEnv, assert_no_process, wait_until

# ssh, two torchrun agents and two workers importing torch on a loaded 2-core machine
TIMEOUT = 300.0
HOST_A, HOST_B = "box7", "box8"

TINY_RESNET = """
title = "tiny DDP ResNet on the CPU"
runner = "resnet"
launcher = "torchrun"
tags = ["test"]

[args]
device = "cpu"
model = "resnet18"
image_size = 32
num_classes = 10
batch_size = 2
steps = {steps}
warmup_steps = 1
log_every = 1
compile = false
precision = "fp32"

[env]
OMP_NUM_THREADS = "1"
HF_TOKEN = "hf_tiny_secret_0123"
"""


@pytest.fixture
def nodes(sshd: LoopbackSshd, runs_env: RunsEnv, monkeypatch: pytest.MonkeyPatch) -> LoopbackSshd:
    """The two hosts, healthy; gpustation (and its children) pointed at them."""
    monkeypatch.setenv("GPUSTATION_SSH_CONFIG", str(sshd.client_config))
    monkeypatch.setenv("GPUSTATION_REMOTE_PYTHON", str(sshd.remote_python))
    monkeypatch.delenv("GPUSTATION_SIMULATE")  # the local machine's GPUs play no part
    no_driver = sshd.root / "no-driver.json"
    no_driver.write_text(json.dumps({"no_driver": True}))
    env = {
        HOST_A: "export GPUSTATION_SIMULATE=1\n",
        HOST_B: f'export PYTHONPATH="{FAKE_NVML_DIR}:$PYTHONPATH" FAKE_NVML_SCENARIO={no_driver}\n',
    }
    for host in (HOST_A, HOST_B):
        sshd.set_mode(host, "ok")
        (sshd.host_dir(host) / "env").write_text(env[host])
    runs_env["write_preset"]("tiny-ddp", TINY_RESNET.format(steps=4))
    runs_env["write_preset"]("long-ddp", TINY_RESNET.format(steps=100000))
    return sshd


def gs(
    *args: str, timeout: float = TIMEOUT, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return run_gpustation(*args, timeout=timeout, cwd=cwd)


def _hosts() -> str:
    return f"{HOST_A},{HOST_B}"


def _only_run() -> Path:
    found = [p.parent for p in paths.runs_dir().glob("*/run.json")]
    assert len(found) == 1, found
    return found[0]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def node_processes(host: str) -> list[int]:
    """The processes a fake host of this session's sshd runs (found by the variables its
    ssh session carries: other checkouts' tests may play hosts of the same names)."""
    mark = f"GPUSTATION_FAKE_HOST={host}".encode()
    root = Path(os.environ["GPUSTATION_SSH_CONFIG"]).parent
    own = f"GPUSTATION_STATE_DIR={root / 'hosts' / host / 'state'}".encode()
    pids = []
    for proc in psutil.process_iter():
        try:
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
            if mark in environ and own in environ:
                pids.append(proc.pid)
        except OSError:
            continue
    return pids


@pytest.mark.ssh
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_nodes_run_one_ddp_job_recorded_as_one_run(nodes: LoopbackSshd, tmp_path: Path) -> None:
    port = free_port()
    here = tmp_path / "project"  # the launcher's directory, which both "hosts" have
    here.mkdir()
    result = gs(
        "run", "tiny-ddp", "--hosts", _hosts(), "--nproc-per-node", "1",
        "--rdzv-port", str(port), "--grace", "5", cwd=here,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    directory = _only_run()
    state = rundir.read_state(directory)
    assert state is not None and state.status == "succeeded", state

    # every node's log, and the combined log with each line's host
    for host in (HOST_A, HOST_B):
        log = (directory / "nodes" / host / "output.log").read_text()
        assert "gpustation: torchrun started on " in log and "torchrun exited 0" in log, log
        assert f" in {here}\n" in log  # torchrun ran in the launcher's directory
    # rank 0 talks (the runner's report): on whichever node it landed
    assert "What limits you" in result.stdout
    combined = (directory / rundir.OUTPUT_LOG).read_text().splitlines()
    assert any(line.startswith(f"[{HOST_A}] ") for line in combined)
    assert any(line.startswith(f"[{HOST_B}] ") for line in combined)
    assert f"[{HOST_A}] " in result.stdout  # `gpustation run` streamed it

    # rank 0's metrics, one stream for the two-process world
    events = [json.loads(x) for x in (directory / "metrics.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in events if "loss" in e]
    assert steps == sorted(set(steps)) and steps[-1] == 4, steps
    summary = [e["summary"] for e in events if "summary" in e]
    assert len(summary) == 1 and summary[0]["world_size"] == 2

    # the rendezvous: the first host's address, a fresh id (the run's), is_host on one node
    run = rundir.read_run(directory) or {}
    plan = run["multinode"]
    assert plan["rdzv_endpoint"] == f"127.0.0.1:{port}" and plan["rdzv_id"] == run["id"]
    conf = [n["spec"]["argv"] for n in plan["nodes"]]
    assert "--rdzv-conf=is_host=1" in conf[0] and "--rdzv-conf=is_host=0" in conf[1]
    # the preset's variables are kept by name: their values went to the nodes privately
    assert "hf_tiny_secret_0123" not in (directory / rundir.RUN_JSON).read_text()
    assert {n["spec"]["env"]["HF_TOKEN"] for n in plan["nodes"]} == {"***"}

    # each node's state and energy: known where the GPUs could be read, unknown elsewhere
    doc = read_nodes(directory) or {}
    by_host = {n["host"]: n for n in doc["nodes"]}
    assert {h: n["status"] for h, n in by_host.items()} == {
        HOST_A: "succeeded",
        HOST_B: "succeeded",
    }
    assert by_host[HOST_A]["remote_pid"] and by_host[HOST_A]["telemetry_off"] is None
    assert {n["cwd"] for n in by_host.values()} == {str(here)}
    assert "driver" in (by_host[HOST_B]["telemetry_off"] or "").lower()
    assert (directory / "nodes" / HOST_A / "telemetry.jsonl").read_text().strip()
    record = RunStore().get(run["id"])
    assert record is not None and record.status == "succeeded" and record.final_loss is not None
    assert record.energy_j is None  # one node's energy is unknown, so is the total

    shown = gs("runs", "show", run["id"])
    assert shown.returncode == 0, shown.stderr
    rows = {line.split("  ")[0].strip(): line for line in shown.stdout.splitlines()}
    assert re.search(r"succeeded, energy [0-9.]+ k?W?h?J?$", rows[f"node {HOST_A}"].strip())
    assert "succeeded, energy unknown (" in rows[f"node {HOST_B}"]
    assert "--nnodes=2" in rows["node command"]
    for host in (HOST_A, HOST_B):
        assert_no_process(node_processes(host))


@pytest.mark.ssh
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_runs_stop_ends_every_node(nodes: LoopbackSshd) -> None:
    result = gs(
        "run", "long-ddp", "--hosts", _hosts(), "--rdzv-port", str(free_port()),
        "--grace", "5", "--detach",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    run_id = result.stdout.strip()
    directory = rundir.run_dir(run_id)
    # training on both nodes: rank 0 reports steps, and both hosts run their workers
    wait_until(
        lambda: b'"loss"' in _read(directory / "metrics.jsonl"),
        TIMEOUT,
        "rank 0's first training step",
    )
    running = {host: node_processes(host) for host in (HOST_A, HOST_B)}
    assert all(running.values()), running
    doc = read_nodes(directory) or {}
    assert all(n["status"] == "running" and n["remote_pgid"] for n in doc["nodes"]), doc

    stopped = gs("runs", "stop", run_id)
    assert stopped.returncode == 0, stopped.stderr
    state = wait_for_end(directory, timeout=60)
    assert state is not None and state.status == "stopped", state
    for host in (HOST_A, HOST_B):

        def gone(h: str = host) -> bool:
            return not node_processes(h)

        wait_until(gone, 30, f"{host}'s processes to end")
    assert_no_process([pid for pids in running.values() for pid in pids])
    doc = read_nodes(directory) or {}
    assert {n["status"] for n in doc["nodes"]} == {"stopped"}, doc
    assert doc["reason"] is None


@pytest.mark.ssh
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_failing_node_fails_the_run_and_is_named(nodes: LoopbackSshd) -> None:
    nodes.set_mode(HOST_B, "fail")
    result = gs(
        "run", "long-ddp", "--hosts", _hosts(), "--rdzv-port", str(free_port()),
        "--grace", "5",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert f"node {HOST_B} exited 3" in result.stderr
    directory = _only_run()
    state = rundir.read_state(directory)
    assert state is not None and state.status == "failed"
    assert state.reason == f"node {HOST_B} exited 3"
    # the node's own words are in its log; the healthy node was stopped
    assert "test failure" in (directory / "nodes" / HOST_B / "output.log").read_text()
    doc = read_nodes(directory) or {}
    by_host = {n["host"]: n["status"] for n in doc["nodes"]}
    assert by_host == {HOST_A: "stopped", HOST_B: "failed"}
    assert doc["failed"] == HOST_B
    wait_until(lambda: not node_processes(HOST_A), 30, f"{HOST_A}'s processes to end")


@pytest.mark.ssh
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_nested_line_from_a_node_is_its_text_not_a_crash(nodes: LoopbackSshd) -> None:
    nodes.set_mode(HOST_B, "deep")  # a line of 100,000 "[", then exit 3
    result = gs(
        "run", "long-ddp", "--hosts", _hosts(), "--rdzv-port", str(free_port()),
        "--grace", "5",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr
    directory = _only_run()
    state = rundir.read_state(directory)
    assert state is not None and state.reason == f"node {HOST_B} exited 3", state
    assert "[" * 1000 in (directory / "nodes" / HOST_B / "output.log").read_text()
    doc = read_nodes(directory) or {}
    assert {n["host"]: n["status"] for n in doc["nodes"]} == {HOST_A: "stopped", HOST_B: "failed"}
    wait_until(lambda: not node_processes(HOST_A), 60, f"{HOST_A}'s processes to end")


@pytest.mark.ssh
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_node_that_never_answers_fails_the_run_after_the_start_deadline(
    nodes: LoopbackSshd,
) -> None:
    nodes.set_mode(HOST_B, "hang")  # ssh is accepted; the agent's place is taken by sleep
    try:
        result = gs(
            "run", "long-ddp", "--hosts", _hosts(), "--rdzv-port", str(free_port()),
            "--grace", "5", "--node-start-timeout", "20",
        )  # fmt: skip
        assert result.returncode == 1, result.stderr
        reason = f"node {HOST_B}: no answer within 20 s of starting ssh"
        assert reason in result.stderr
        directory = _only_run()
        state = rundir.read_state(directory)
        assert state is not None and state.status == "failed"
        assert (state.reason or "").startswith(reason), state.reason
        doc = read_nodes(directory) or {}
        by_host = {n["host"]: n for n in doc["nodes"]}
        assert by_host[HOST_B]["status"] == "failed" and doc["failed"] == HOST_B
        assert "no answer within 20 s" in by_host[HOST_B]["error"]
        assert by_host[HOST_A]["status"] == "stopped"
        assert "no answer within 20 s" in (directory / "nodes" / HOST_B / "output.log").read_text()
        wait_until(lambda: not node_processes(HOST_A), 60, f"{HOST_A}'s processes to end")
    finally:
        for pid in node_processes(HOST_B):  # the sleep that took the agent's place
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.ssh
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_cut_connection_stops_that_node_and_fails_the_run(nodes: LoopbackSshd) -> None:
    result = gs(
        "run", "long-ddp", "--hosts", _hosts(), "--rdzv-port", str(free_port()),
        "--grace", "5", "--detach",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    directory = rundir.run_dir(result.stdout.strip())
    wait_until(lambda: b'"loss"' in _read(directory / "metrics.jsonl"), TIMEOUT, "training")
    on_b = node_processes(HOST_B)
    assert on_b
    state = rundir.read_state(directory)
    assert state is not None and state.child_pid
    ssh_b = [
        p
        for p in psutil.Process(state.child_pid).children()
        if p.name() == "ssh" and HOST_B in p.cmdline()
    ]
    assert len(ssh_b) == 1, ssh_b
    ssh_b[0].kill()  # as if the network went away
    final = wait_for_end(directory, timeout=120)
    assert final is not None and final.status == "failed", final
    assert final.reason == f"node {HOST_B}: the connection was cut (ssh killed by SIGKILL)"
    # the node saw its connection end and stopped its own processes
    wait_until(lambda: not node_processes(HOST_B), 60, f"{HOST_B}'s processes to end")
    assert_no_process(on_b)
    wait_until(lambda: not node_processes(HOST_A), 60, f"{HOST_A}'s processes to end")


@pytest.mark.ssh
@pytest.mark.timeout(420)
def test_a_node_dir_no_node_has_fails_the_run_before_torchrun(
    nodes: LoopbackSshd, tmp_path: Path
) -> None:
    missing = tmp_path / "not-on-the-nodes"
    result = gs(
        "run", "long-ddp", "--hosts", _hosts(), "--rdzv-port", str(free_port()),
        "--node-dir", str(missing), "--grace", "5",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    directory = _only_run()
    state = rundir.read_state(directory)
    assert state is not None and state.status == "failed"
    assert re.fullmatch(rf"node ({HOST_A}|{HOST_B}) exited 2", state.reason or ""), state.reason
    first = (state.reason or "").split()[1]
    log = (directory / "nodes" / first / "output.log").read_text()
    assert f"--node-dir {missing}: no such directory on " in log, log
    assert "torchrun started" not in log
    assert (rundir.read_run(directory) or {})["multinode"]["node_dir"] == str(missing)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--hosts", ""], "--hosts: no host given; expected a comma-separated list"),
        (["--hosts", " , "], "--hosts: no host given"),
        (["--hosts", "box1,,box2"], "an empty host between commas"),
        (["--hosts", "box1;reboot"], "contains characters a host name cannot hold (';')"),
        (["--hosts", "box1,$(id)"], "contains characters a host name cannot hold"),
        (["--hosts=-oProxyCommand=x"], "starts with '-'; a host name cannot be an ssh option"),
        (["--hosts", "box1,box1"], "'box1' is given twice"),
        (["--hosts", "box1:99999"], "port must be 1-65535"),
        (["--hosts", "box1", "--nproc-per-node", "0"], "--nproc-per-node: between 1 and"),
        (["--hosts", "box1", "--rdzv-port", "70000"], "--rdzv-port: a port 1-65535"),
        (["--hosts", "box1", "--remote-python", " "], "--remote-python: empty"),
        (["--hosts", "box1", "--simulate", "2"], "--simulate does not go with --hosts"),
        (["--hosts", "box1", "--profile"], "--profile does not go with --hosts"),
        (["--nproc-per-node", "2"], "--nproc-per-node go with --hosts"),
        (["--node-dir", "/srv/x"], "--node-dir go with --hosts"),
        (["--node-start-timeout", "5"], "--node-start-timeout go with --hosts"),
        (["--hosts", "box1", "--node-start-timeout", "0"], "--node-start-timeout: between 1"),
        (["--hosts", "box1", "--node-start-timeout", "nan"], "--node-start-timeout: between 1"),
        (["--hosts", "box1", "--node-dir", "data/run"], "--node-dir 'data/run': an absolute path"),
    ],
)
def test_bad_multinode_options_exit_2_before_anything_starts(
    runs_env: RunsEnv, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    from gpustation.cli import main

    runs_env["write_preset"]("tiny-ddp", TINY_RESNET.format(steps=4))
    assert main(["run", "tiny-ddp", *argv]) == EXIT_USAGE
    assert says in capsys.readouterr().err
    assert not list(paths.runs_dir().glob("*/run.json"))  # no run was made


def test_the_nodes_python_from_the_option_the_environment_or_the_config(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(REMOTE_PYTHON_ENV, raising=False)
    assert resolve_remote_python(None, load_fleet_config().remote_python) == "python3"
    config = gpustation_dirs["config"] / "config.toml"
    config.write_text('[fleet]\nremote_python = "/opt/venv/bin/python"\n')
    assert resolve_remote_python(None, load_fleet_config().remote_python) == "/opt/venv/bin/python"
    monkeypatch.setenv(REMOTE_PYTHON_ENV, "env PYTHONPATH=/src python3")
    assert resolve_remote_python(None, "/opt/venv/bin/python") == "env PYTHONPATH=/src python3"
    assert resolve_remote_python("/usr/bin/python3.11", "/x") == "/usr/bin/python3.11"
    with pytest.raises(UsageError, match="not a command line"):
        resolve_remote_python("'/opt/unclosed", None)
    config.write_text("[fleet]\nremote_python = 3\n")
    with pytest.raises(UsageError, match="remote_python must be a non-empty string"):
        load_fleet_config()


def test_a_command_runs_on_every_node_as_given() -> None:
    preset = RunPreset(name="mine", command=["./train.sh", "--data", "/d"], args={"lr": 0.1})
    argv = node_argv(preset, 3, 4, "10.0.0.1:29400", "rid", is_host=False)
    assert argv[-6:] == ["--no-python", "./train.sh", "--data", "/d", "--lr", "0.1"]
    assert {"--nnodes=3", "--nproc-per-node=4", "--rdzv-conf=is_host=0"} <= set(argv)
    assert "--rdzv-endpoint=10.0.0.1:29400" in argv and "--rdzv-id=rid" in argv


class _Said:
    def __init__(self) -> None:
        self.logs: list[str] = []

    def send(self, kind: str, **fields: object) -> None:
        self.logs.append(str(fields["text"]))


def test_a_node_without_the_launchers_directory_runs_in_its_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpustation.runs.multinode.node_agent import _working_directory

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(home)
    said = _Said()
    there = tmp_path / "project"
    assert _working_directory({"cwd": str(there)}, said) == str(home)  # type: ignore[arg-type]
    assert said.logs == [f"gpustation node: {socket.gethostname()} has no {there} "
                         f"(the launcher's directory); running in {home}"]  # fmt: skip
    there.mkdir()
    assert _working_directory({"cwd": str(there)}, said) == str(there)  # type: ignore[arg-type]
    assert _working_directory({}, said) == str(home)  # type: ignore[arg-type]
    assert len(said.logs) == 1


def test_a_nodes_spec_carries_the_values_run_json_leaves_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpustation.runs.multinode.coordinator import node_spec

    monkeypatch.setenv("HF_TOKEN", "hf_real")
    monkeypatch.delenv("GONE", raising=False)
    spec = {"argv": ["torchrun"], "env": {"HF_TOKEN": "***", "GONE": "***", "OMP_NUM_THREADS": "1"}}
    assert node_spec(spec) == {
        "argv": ["torchrun"],
        "env": {"HF_TOKEN": "hf_real", "OMP_NUM_THREADS": "1"},
    }
