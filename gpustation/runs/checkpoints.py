"""The layout of a run's training checkpoints, read without torch.

A runner that checkpoints (the LoRA runner) keeps them under
``<output dir>/checkpoints/step-NNNNNNNN/``. Each is written whole into a
hidden temporary folder beside them and renamed into place; inside it the
marker ``complete.json`` (the step, the total steps, the run it came from) is
written last. A folder without a readable marker is never a checkpoint, so a
crash while one is written cannot leave one that looks complete.

The runner writes them (``gpustation.runners.lib.checkpoint``); ``gpustation run
--resume`` finds the last complete one here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpustation.runs.rundir import read_json

CHECKPOINTS_DIR = "checkpoints"
#: written last into a checkpoint: without it the folder is not a checkpoint
MARKER = "complete.json"
_NAME = re.compile(r"step-(\d+)")


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint: its folder and what its marker says."""

    path: Path
    step: int
    info: dict[str, Any]

    @property
    def total_steps(self) -> int | None:
        value = self.info.get("total_steps")
        return value if isinstance(value, int) else None

    @property
    def run_id(self) -> str | None:
        value = self.info.get("run_id")
        return value if isinstance(value, str) and value else None


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def read_checkpoint(path: Path) -> Checkpoint | None:
    """The checkpoint in ``path``, or None when it is not a complete one."""
    info = read_json(path / MARKER)  # a FIFO or /dev/zero there is skipped, not waited on
    if info is None:
        return None
    step = info.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        return None
    return Checkpoint(path=path, step=step, info=info)


def complete_checkpoints(root: Path) -> list[Checkpoint]:
    """The complete checkpoints in ``root`` (a ``checkpoints/`` folder), oldest step first."""
    found = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not _NAME.fullmatch(entry.name) or not entry.is_dir():
            continue
        ckpt = read_checkpoint(entry)
        if ckpt is not None:
            found.append(ckpt)
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(output_dir: Path) -> Checkpoint | None:
    """The last complete checkpoint a run left in ``output_dir`` (its run directory)."""
    found = complete_checkpoints(output_dir / CHECKPOINTS_DIR)
    return found[-1] if found else None
