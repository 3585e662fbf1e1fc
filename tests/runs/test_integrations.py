"""The Trainer callback and the accelerate tracker write the metrics protocol."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import child_env


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_importing_the_module_imports_neither_framework() -> None:
    code = (
        "import sys, gpustation.runners.lib.integrations as m\n"
        "print(any(k in sys.modules for k in ('transformers', 'accelerate', 'torch')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_trainer_callback_with_a_real_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch

    from gpustation.runners.lib.integrations import GpustationCallback

    metrics = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("GPUSTATION_METRICS_FILE", str(metrics))

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": torch.nn.functional.mse_loss(self.layer(x).squeeze(-1), y)}

    data = [{"x": torch.randn(4), "y": torch.tensor(1.0)} for _ in range(64)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=6,
        logging_steps=2,
        per_device_train_batch_size=4,
        learning_rate=0.01,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=Tiny(), args=args, train_dataset=data, callbacks=[GpustationCallback()]
    )
    trainer.train()

    events = read_events(metrics)
    steps = [e for e in events if "loss" in e]
    assert [e["step"] for e in steps] == [2, 4, 6]
    for event in steps:
        assert event["total_steps"] == 6
        assert event["lr"] > 0 and event["loss"] >= 0
        assert event["unit"] == "samples/s" and event["throughput"] > 0
    assert "summary" in events[-1] and "train_runtime" in events[-1]["summary"]


def test_trainer_callback_stops_at_a_step_boundary_on_sigint() -> None:
    pytest.importorskip("transformers")
    from gpustation.runners.lib.integrations import GpustationCallback

    callback = GpustationCallback(stop_on_sigint=False)
    control = SimpleNamespace(should_training_stop=False, should_save=False)
    callback.on_step_end(None, None, control)
    assert not control.should_training_stop
    callback._on_sigint(2, None)  # the first SIGINT asks for a stop
    callback.on_step_end(None, None, control)
    assert control.should_training_stop and control.should_save
    with pytest.raises(KeyboardInterrupt):
        callback._on_sigint(2, None)  # the second one interrupts


def test_accelerate_tracker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    accelerate = pytest.importorskip("accelerate")
    from gpustation.runners.lib.integrations import GpustationTracker

    metrics = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("GPUSTATION_METRICS_FILE", str(metrics))
    accelerator = accelerate.Accelerator(cpu=True, log_with=[GpustationTracker(total_steps=2)])
    accelerator.init_trackers("tiny", config={"lr": 0.1})
    accelerator.log({"train_loss": 1.5, "learning_rate": 0.1, "throughput": 9.0}, step=1)
    accelerator.log({"train_loss": 1.0, "learning_rate": 0.05, "unit": "img/s"}, step=2)
    accelerator.end_training()

    events = read_events(metrics)
    assert events[0]["config"] == {"lr": 0.1}
    assert [(e["step"], e["loss"], e["lr"]) for e in events[1:]] == [(1, 1.5, 0.1), (2, 1.0, 0.05)]
    assert all(e["total_steps"] == 2 for e in events[1:])
    assert events[1]["throughput"] == 9.0 and events[2]["unit"] == "img/s"
