"""Training checkpoints of the LoRA runner: written atomically, the last few kept, restored.

A checkpoint (``OUTPUT_DIR/checkpoints/step-NNNNNNNN/``, layout in
:mod:`gpustation.runs.checkpoints`) holds:

- ``adapter/``: the LoRA adapter (peft ``save_pretrained``) with the
  description of its base model, loadable on its own like the final adapter;
- ``trainer_state.pt``: optimizer, LR schedule and grad-scaler state, the
  Python and torch RNG states;
- ``complete.json``: the step, the total steps, the data position, the run it
  came from; written last.

It is written into a hidden temporary folder and renamed into place once
every file is on disk, so a crash mid-write leaves no folder that looks
complete.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpustation.runners.lib import common, llm
from gpustation.runs.checkpoints import (
    CHECKPOINTS_DIR,
    MARKER,
    Checkpoint,
    checkpoint_name,
    complete_checkpoints,
    latest_checkpoint,
    read_checkpoint,
)
from gpustation.runs.metrics import RUN_ID_ENV

ADAPTER_DIR = "adapter"
STATE_FILE = "trainer_state.pt"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
FORMAT = 1
#: adapter settings that must match for a checkpoint to load into this run's model
_ADAPTER_KEYS = ("r", "lora_alpha", "target_modules")


@dataclass
class Trainer:
    """What a checkpoint saves and restores besides the step."""

    model: Any  # the peft model
    base_info: dict[str, Any]
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=50,
        metavar="N",
        help="save a checkpoint every N steps and at the end to OUTPUT_DIR/checkpoints: the "
        "adapter, optimizer and LR schedule state, the step, RNG and data position "
        "(0: at the end only)",
    )
    parser.add_argument(
        "--keep-checkpoints",
        type=int,
        default=2,
        metavar="K",
        help="keep the newest K checkpoints and delete older ones (0: save none)",
    )
    parser.add_argument(
        "--resume-from",
        default=None,
        metavar="PATH",
        help="continue training up to --steps from a checkpoint folder, or from the last "
        "complete checkpoint of a run directory; the model and adapter settings must be "
        "the checkpoint's (gpustation run --resume RUN_ID fills this in with them)",
    )


def save(
    out_dir: Path,
    trainer: Trainer,
    *,
    step: int,
    total_steps: int,
    keep: int,
    data_position: dict[str, Any],
) -> Path:
    """Write the checkpoint of ``step`` and keep only the last ``keep``; returns its folder."""
    root = out_dir / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".step-*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)  # left by a writer that died
    name = checkpoint_name(step)
    tmp = root / f".{name}.{os.getpid()}.tmp"
    tmp.mkdir()
    adapter = tmp / ADAPTER_DIR
    trainer.model.save_pretrained(adapter)
    llm.save_base_info(adapter, trainer.base_info)
    torch.save(
        {
            "format": FORMAT,
            "optimizer": trainer.optimizer.state_dict(),
            "schedule": trainer.schedule.state_dict(),
            "scaler": trainer.scaler.state_dict(),
            "python_rng": random.getstate(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        },
        tmp / STATE_FILE,
    )
    marker = {
        "format": FORMAT,
        "step": step,
        "total_steps": total_steps,
        "data_position": data_position,
        "run_id": os.environ.get(RUN_ID_ENV) or None,
        "time": time.time(),
    }
    (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    _sync_tree(tmp)
    final = root / name
    if final.exists():  # the same step written again (a rerun into the same folder)
        aside = root / f".{name}.{os.getpid()}.old.tmp"
        os.rename(final, aside)
        shutil.rmtree(aside, ignore_errors=True)
    os.rename(tmp, final)
    _sync_dir(root)
    prune(root, keep)
    return final


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the last ``keep`` complete checkpoints in ``root``; returns the deleted."""
    found = complete_checkpoints(root)
    gone = [c.path for c in found[: max(0, len(found) - max(1, keep))]]
    for path in gone:
        # Unmark first: a delete cut short must not leave a complete-looking half.
        (path / MARKER).unlink(missing_ok=True)
        shutil.rmtree(path, ignore_errors=True)
    return gone


def _sync_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for path in [*(p for p in directory.rglob("*") if p.is_dir()), directory]:
        _sync_dir(path)


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems cannot sync a directory
    finally:
        os.close(fd)


def find(path: str | Path) -> Checkpoint:
    """The checkpoint ``--resume-from`` names: a checkpoint folder, or the last complete
    one in a run (or output) directory."""
    path = Path(path)
    ckpt = read_checkpoint(path) or latest_checkpoint(path)
    if ckpt is None:
        raise common.RunnerError(
            f"--resume-from {path}: no complete checkpoint there (expected a "
            f"{CHECKPOINTS_DIR}/step-N folder holding {MARKER}, or a run directory with "
            "some); runs save them with --checkpoint-every N",
            common.EXIT_USAGE,
        )
    return ckpt


def check_compatible(ckpt: Checkpoint, base_info: dict[str, Any], lora: Any) -> None:
    """Refuse a checkpoint trained on another base model or with another adapter shape."""
    adapter = ckpt.path / ADAPTER_DIR

    def same_base(a: dict[str, Any], b: dict[str, Any]) -> bool:
        # max_positions follows --seq-len and changes no weight.
        return {k: v for k, v in a.items() if k != "max_positions"} == {
            k: v for k, v in b.items() if k != "max_positions"
        }

    try:
        theirs = llm.read_base_info(adapter)
        config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise damaged(ckpt, err) from None
    if not same_base(theirs, base_info):
        raise common.RunnerError(
            f"--resume-from {ckpt.path}: the checkpoint was trained on {_base_text(theirs)}, "
            f"this run builds {_base_text(base_info)}; resume with the checkpoint's "
            "--model / --model-preset / --seed (gpustation run --resume takes them from the run)",
            common.EXIT_USAGE,
        )
    ours = {"r": lora.r, "lora_alpha": lora.lora_alpha, "target_modules": lora.target_modules}
    for key in _ADAPTER_KEYS:
        a, b = config.get(key), ours[key]
        if isinstance(a, (list, set)) and isinstance(b, (list, set)):
            a, b = sorted(a), sorted(b)
        if a != b:
            raise common.RunnerError(
                f"--resume-from {ckpt.path}: the checkpoint's adapter has {key}={a}, this run "
                f"asks for {b}; resume with the same --lora-r / --lora-alpha / --target-modules",
                common.EXIT_USAGE,
            )


def damaged(ckpt: Checkpoint, err: BaseException) -> common.RunnerError:
    """A checkpoint whose files are missing or unreadable, as a usage error (exit 2)."""
    return common.RunnerError(
        f"--resume-from {ckpt.path}: the checkpoint cannot be read "
        f"({type(err).__name__}: {(str(err).splitlines() or [''])[0]}); "
        "resume from an earlier one (--resume-from its step-N folder)",
        common.EXIT_USAGE,
    )


def _base_text(info: dict[str, Any]) -> str:
    if info.get("kind") == "path":
        return f"the checkpoint {info.get('model_path')}"
    extra = f", shape overrides {info['overrides']}" if info.get("overrides") else ""
    return f"preset {info.get('model_preset')!r} with seed {info.get('seed')}{extra}"


def load(ckpt: Checkpoint, trainer: Trainer, device: torch.device) -> None:
    """Restore the adapter weights, optimizer, LR schedule, grad scaler and RNG states."""
    # start-up time: peft, only where it is used
    from peft import set_peft_model_state_dict

    # start-up time: safetensors, only where it is used
    from safetensors.torch import load_file

    try:
        weights = load_file(str(ckpt.path / ADAPTER_DIR / ADAPTER_WEIGHTS), device=str(device))
        state = torch.load(ckpt.path / STATE_FILE, map_location=device, weights_only=True)
    except Exception as err:  # safetensors' and pickle's errors have no common base
        if common.is_oom(err):
            raise
        raise damaged(ckpt, err) from None
    result = set_peft_model_state_dict(trainer.model, weights)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise common.RunnerError(
            f"--resume-from {ckpt.path}: the adapter holds weights this model has no place "
            f"for ({', '.join(unexpected[:3])}...)",
            common.EXIT_USAGE,
        )
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.schedule.load_state_dict(state["schedule"])
    trainer.scaler.load_state_dict(state["scaler"])
    version, internal, gauss = state["python_rng"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch_rng"].cpu())
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda_rng"]])


def resume(
    ckpt: Checkpoint,
    trainer: Trainer,
    position: dict[str, Any],
    total_steps: int,
    device: torch.device,
    say: Callable[..., None],
) -> None:
    """Check ``ckpt`` fits this run's model, restore it and say so in the log."""
    check_compatible(ckpt, trainer.base_info, trainer.model.peft_config["default"])
    load(ckpt, trainer, device)
    theirs = dict(ckpt.info.get("data_position") or {})
    theirs.pop("batches", None)
    say(
        f"resumed from {ckpt.path} at step {ckpt.step}"
        + (f" (run {ckpt.run_id})" if ckpt.run_id else "")
        + f"; training steps {ckpt.step + 1}-{total_steps}",
        flush=True,
    )
    if theirs and theirs != position:
        say(
            f"note: the data differs from the checkpoint's ({theirs} then, {position} "
            "now): the batches do not continue the old order",
            flush=True,
        )
