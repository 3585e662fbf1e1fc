"""Helpers for running the runners as child processes at tiny sizes on the CPU."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

from tests.conftest import child_env

# Tiny runs still import torch (and transformers): allow for a loaded 2-core machine.
CHILD_TIMEOUT_S = 240


@dataclass
class RunResult:
    returncode: int
    stdout: str
    stderr: str
    events: list[dict[str, Any]]

    @property
    def summary(self) -> dict[str, Any]:
        found: list[dict[str, Any]] = [e["summary"] for e in self.events if "summary" in e]
        assert len(found) == 1, f"expected one summary line, got {len(found)}: {self.events}"
        return found[0]

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [e for e in self.events if "step" in e]


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class RunRunner(Protocol):
    def __call__(
        self, name: str, *args: str, torchrun: int = 0, accelerate: int = 0, gpu: bool = False
    ) -> RunResult: ...


class RunInprocess(Protocol):
    def __call__(self, name: str, *args: str) -> RunResult: ...


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def run_runner(tmp_path: Path) -> RunRunner:
    """``run_runner("resnet", "--steps", "3", ...)`` -> RunResult (metrics parsed)."""
    counter = [0]

    def run(
        name: str, *args: str, torchrun: int = 0, accelerate: int = 0, gpu: bool = False
    ) -> RunResult:
        counter[0] += 1
        run_dir = tmp_path / f"run{counter[0]}"
        run_dir.mkdir()
        metrics = run_dir / "metrics.jsonl"
        env = child_env(
            GPUSTATION_METRICS_FILE=str(metrics),
            GPUSTATION_RUN_DIR=str(run_dir),
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
        )
        if not gpu:
            # A GPU on the test machine must not change what the CPU tests exercise.
            env["CUDA_VISIBLE_DEVICES"] = ""
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(var, None)
        if torchrun:
            cmd = [
                sys.executable, "-m", "torch.distributed.run",
                "--nproc_per_node", str(torchrun),
                "--master_addr", "127.0.0.1",
                "--master_port", str(free_port()),
                "-m", f"gpustation.runners.{name}", *args,
            ]  # fmt: skip
        elif accelerate:
            cmd = [
                sys.executable, "-m", "accelerate.commands.launch",
                "--multi_gpu", "--num_processes", str(accelerate), "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", str(free_port()),
                "-m", f"gpustation.runners.{name}", *args,
            ]  # fmt: skip
        else:
            cmd = [sys.executable, "-m", f"gpustation.runners.{name}", *args]
        proc = subprocess.run(
            cmd,
            env=env,
            cwd=run_dir,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
        return RunResult(proc.returncode, proc.stdout, proc.stderr, read_events(metrics))

    return run


@pytest.fixture(autouse=True)
def _few_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def run_inprocess(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> RunInprocess:
    """``run_inprocess("matmul", ...)``: the runner's cli() in this process (cheaper)."""

    def run(name: str, *args: str) -> RunResult:
        import importlib

        metrics = tmp_path / f"{name}-metrics.jsonl"
        metrics.unlink(missing_ok=True)
        monkeypatch.setenv("GPUSTATION_METRICS_FILE", str(metrics))
        monkeypatch.setenv("GPUSTATION_RUN_DIR", str(tmp_path))
        monkeypatch.delenv("RANK", raising=False)
        monkeypatch.delenv("WORLD_SIZE", raising=False)
        module = importlib.import_module(f"gpustation.runners.{name}")
        rc = module.cli(list(args))
        out = capsys.readouterr()
        return RunResult(rc, out.out, out.err, read_events(metrics))

    return run
