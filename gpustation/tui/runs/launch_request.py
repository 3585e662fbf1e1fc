"""What a launch form asks for: the preset, its overrides and GPUs, the GPUs as
checkboxes, and the argv a run would get as the form shows it.

Both forms (:mod:`.form` for a preset, :mod:`.command_form` for any command)
dismiss with a :class:`LaunchRequest`, so a run starts the same way whichever
was used.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Checkbox, Label

from gpustation.errors import UsageError
from gpustation.runs.argvalue import ArgValue
from gpustation.runs.launch.argv import resolve_gpus
from gpustation.runs.presets import RunPreset
from gpustation.textsafe import safe


@dataclass
class LaunchRequest:
    preset: RunPreset
    #: typed values for the preset's arguments, as :func:`apply_values` takes them
    overrides: dict[str, ArgValue]
    gpus: list[int] | None


@dataclass
class Prefill:
    """Settings to open the form with (a past run's): argument values and GPUs."""

    args: dict[str, ArgValue] = field(default_factory=dict)
    gpus: list[int] | None = None


def default_gpus(preset: RunPreset, device_count: int | None) -> list[int] | None:
    """The GPUs a launch would take without a choice (None when it cannot be said)."""

    try:
        return resolve_gpus(preset, None, device_count)
    except UsageError:
        return None


class GpuChoice(Horizontal):
    """A form's GPUs as checkboxes (``#gpu-N``), or a line saying there are none."""

    DEFAULT_CSS = "GpuChoice Checkbox { width: auto; margin-right: 1; }"

    def __init__(self, device_count: int | None, chosen: Sequence[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.device_count = device_count or 0
        self.initial = list(chosen)

    def compose(self) -> ComposeResult:
        for i in range(self.device_count):
            yield Checkbox(f"GPU {i}", i in self.initial, id=f"gpu-{i}", compact=True)
        if not self.device_count:
            yield Label(Text("no GPU on this machine: a CPU run", style="dim"))

    def chosen(self) -> list[int] | None:
        """The GPUs checked (None where the machine has none to choose)."""
        if not self.device_count:
            return None
        return [i for i in range(self.device_count) if self.query_one(f"#gpu-{i}", Checkbox).value]


def shown_argv(argv: list[str]) -> str:
    """``argv`` as a shell would read it, safe for the screen (a value can come from a
    past run's run.json)."""
    # The interpreter's full path says nothing the reader needs, nor its -P
    # (every Python child starts with the working directory off its path).
    shown = ["python" if a == sys.executable else a for a in argv]
    if shown[:2] == ["python", "-P"]:
        del shown[1]
    return safe(shlex.join(shown))
