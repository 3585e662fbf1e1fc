"""`gpustation snapshot` end to end, in a child process as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from gpustation.telemetry.model import SCHEMA, Snapshot
from tests.conftest import FAKE_NVML_DIR, REPO, child_env, gpustation_cmd


def run(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        gpustation_cmd(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(**env),
        stdin=subprocess.DEVNULL,
    )


def test_table_without_a_terminal_names_every_gpu_and_says_simulated() -> None:
    result = run("snapshot", "--simulate", "3")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "SIMULATED" in out
    gpu_rows = [line for line in out.splitlines() if "RTX 4090 (simulated)" in line]
    assert [row.split()[0] for row in gpu_rows] == ["0", "1", "2"]
    assert "host " in out and "load" in out


def test_json_is_one_schema_document_with_units_in_names() -> None:
    result = run("snapshot", "--simulate", "2", "--sim-card", "h200", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == SCHEMA
    assert doc["simulated"] is True
    snap = Snapshot.from_dict(doc)
    assert [g.index for g in snap.gpus] == [0, 1]
    g = snap.gpus[0]
    assert g.fans_pct == []  # a datacenter card: no fans
    assert g.power_max_w == 700 and g.power_min_w == 200
    assert g.pcie.max_gen == 5
    assert snap.host.memory_total_mib and snap.host.memory_total_mib > 0
    assert snap.topology.link(0, 1) is not None


def test_gpus_option_selects_gpus() -> None:
    result = run("snapshot", "--simulate", "4", "--gpus", "1,3", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [g["index"] for g in doc["gpus"]] == [1, 3]


def test_watch_json_streams_one_flushed_document_per_line() -> None:
    proc = subprocess.Popen(
        gpustation_cmd("snapshot", "--simulate", "1", "--json", "--watch", "0.2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while len(lines) < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()  # returns as soon as a line is flushed
            if not line:
                break
            lines.append(line)
        assert len(lines) == 3
        docs = [json.loads(line) for line in lines]
        assert all(d["schema"] == SCHEMA for d in docs)
        assert docs[0]["time"] < docs[1]["time"] < docs[2]["time"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize(
    "args",
    [
        ("snapshot", "--watch", "nope"),
        ("snapshot", "--no-such-option"),
        ("snapshot", "--simulate", "2", "--gpus", "x"),
        ("snapshot", "--simulate", "2", "--gpus", "5"),
        ("snapshot", "--simulate", "2", "--watch", "-1"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(args: tuple[str, ...]) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert "gpustation" in result.stderr
    assert result.stdout == ""


# The import budget of `gpustation snapshot`, the one command users run in a
# loop, from cron and over ssh: what it must never import. Each of these
# costs more than reading the GPUs does, or belongs to another part of the
# program: the TUI (textual, rich), the runners (torch, transformers), the
# graphs (plotext), the exporter (prometheus_client), the run store (sqlite3),
# and on Linux, where /proc has it all, psutil.
NEVER_IMPORTED = frozenset(
    {"textual", "rich", "torch", "transformers", "plotext", "prometheus_client", "sqlite3"}
)
NEVER_IMPORTED_ON_LINUX = frozenset({"psutil"})
# On real GPUs the model's classes are records (telemetry/record.py), not
# dataclasses, whose import (with inspect) and generated methods were the
# largest part of the snapshot's start.
NEVER_IMPORTED_WITH_NVML = frozenset({"dataclasses", "inspect"})


@pytest.mark.parametrize("source", ["simulated", "nvml"])
@pytest.mark.parametrize("extra", [(), ("--json",)], ids=["table", "json"])
def test_snapshot_path_import_budget(source: str, extra: tuple[str, ...]) -> None:
    argv = gpustation_cmd("snapshot", *extra)
    env = child_env()
    if source == "simulated":
        argv += ["--simulate", "1"]
    else:  # the NVML backend, on the fake pynvml
        env = child_env(PYTHONPATH=os.pathsep.join([str(FAKE_NVML_DIR), str(REPO)]))
    result = subprocess.run(
        [argv[0], "-X", "importtime", *argv[1:]],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    imported = {
        line.split("|")[-1].strip().split(".")[0]
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "gpustation" in imported  # the check sees our own imports
    assert ("pynvml" in imported) is (source == "nvml")
    assert not imported & NEVER_IMPORTED
    if sys.platform.startswith("linux"):
        assert not imported & NEVER_IMPORTED_ON_LINUX
    if source == "nvml":
        assert not imported & NEVER_IMPORTED_WITH_NVML


BURN = "import sys\nprint('burning', flush=True)\nwhile True:\n    pass\n"


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat")
def test_the_host_cpu_figure_is_measured_while_the_snapshot_runs() -> None:
    burners = [
        subprocess.Popen(
            [sys.executable, "-c", BURN], stdout=subprocess.PIPE, text=True, env=child_env()
        )
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        for burner in burners:
            assert burner.stdout is not None
            assert burner.stdout.readline().strip() == "burning"  # its loop has started
        result = run("snapshot", "--json", "--simulate", "1")
    finally:
        for burner in burners:
            burner.kill()
            burner.wait(timeout=10)
    assert result.returncode == 0, result.stderr
    busy = json.loads(result.stdout)["host"]["cpu_pct"]
    # every core spun: the figure is the use of that moment, whatever the average since boot
    assert busy is not None and busy > 75


def test_host_given_before_the_command_reaches_snapshot() -> None:
    # `gpustation --host X snapshot` means the same as `gpustation snapshot --host X`
    for args in (("--host=-oProxyCommand=x", "snapshot"), ("snapshot", "--host=-oProxyCommand=x")):
        result = run(*args)
        assert result.returncode == 2
        assert "cannot be an ssh option" in result.stderr
