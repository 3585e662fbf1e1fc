"""The top kernels and ops of a profiled run as ``runs show`` and the runs screen lay them out,
from a ``top_ops.json`` that is the run's (and so not to be trusted)."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from gpustation.runs.kernel_profile import TOP_ROWS, profile_head, profile_tables


def render(data: dict[str, Any]) -> str:
    out = io.StringIO()
    console = Console(width=200, file=out, force_terminal=True, color_system="truecolor")
    for part in profile_tables(data):
        console.print(part)
    return out.getvalue()


def kernels(n: int) -> list[dict[str, Any]]:
    return [
        {"name": f"kernel_{k:02d}", "self_ms": 10.0 - k / 10, "calls": 1000 + k, "share": 0.01}
        for k in range(n)
    ]


def test_the_head_and_the_top_rows() -> None:
    data = {"profiled_steps": 5, "step_ms": 41.2, "gpu_idle_pct": 7.5, "cuda_kernels": kernels(20)}
    assert profile_head(data) == "profile of 5 steps, 41.2 ms a step, GPU idle 7.5 % of it"
    assert profile_head({"profiled_steps": 3, "step_ms": 0.0421}).startswith(
        "profile of 3 steps, 0.0421 ms a step"
    )
    text = render(data)
    assert TOP_ROWS == 15
    assert "kernel_14" in text and "kernel_15" not in text
    assert "1,014" in text  # calls, as a count


def test_hostile_top_ops_json_reaches_the_terminal_as_plain_safe_text() -> None:
    data = {
        "profiled_steps": "[red]x\x1b[2J",
        "step_ms": "[bold]1\x1b]0;owned\x07",
        "gpu_idle_pct": "[blink]9",
        "cuda_kernels": [
            {
                "name": "[bold]evil[/bold]\x1b[31m_kernel",
                "self_ms": "[red]1",
                "calls": "[i]7",
                "share": True,
            },
        ],
    }
    head = profile_head(data)
    assert head == "profile of ? steps, ? ms a step"  # numbers only, or ?
    text = render(data)
    # Only rich's own styling escapes: none from the file (no clear screen, no title).
    assert "\x1b[2J" not in text and "\x1b]" not in text and "\x07" not in text
    assert "\x1b[31m_kernel" not in text
    plain = _plain(data)
    assert "profile of ? steps, ? ms a step: top CUDA kernels" in plain
    # A name is shown as written, never read as markup.
    assert "[bold]evil[/bold]_kernel" in plain
    row = next(line for line in plain.splitlines() if "evil" in line)
    assert row.split()[1:] == ["n/a", "?", "n/a"]


def _plain(data: dict[str, Any]) -> str:
    out = io.StringIO()
    console = Console(width=200, file=out, color_system=None)
    for part in profile_tables(data):
        console.print(part)
    return out.getvalue()
