"""A profiled run's top kernels and ops: ``profile/top_ops.json``, read and laid out.

A run recorded with ``--profile`` (the runners' ``--profile-steps``, see
:class:`gpustation.runners.lib.profiling.StepProfiler`) leaves in its directory::

    profile/top_ops.json  {"profiled_steps": 5, "step_ms": 41.2, "gpu_idle_pct": 7.5,
                           "cuda_kernels": [{"name", "self_ms", "calls", "share"}, ...],
                           "cpu_ops": [...], "trace": ".../trace.json"}

``share`` is the kernel's (or op's) self time over the profiled steps' wall
time. :func:`profile_tables` lays it out as Rich renderables, the one layout
``gpustation runs show`` prints and the runs screen draws.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from gpustation.runs import rundir
from gpustation.telemetry.format import NA
from gpustation.textsafe import safe

PROFILE_DIR = "profile"
TOP_OPS_JSON = "top_ops.json"
#: rows shown per table, by `runs show` and by the runs screen (its pane scrolls)
TOP_ROWS = 15
#: what to do for a run that has no profile
HOW_TO_PROFILE = (
    "not profiled: launch it with --profile (gpustation run PRESET --profile) to record "
    "its top CUDA kernels and CPU ops"
)


def top_ops_path(directory: Path) -> Path:
    return Path(directory) / PROFILE_DIR / TOP_OPS_JSON


def read_top_ops(directory: Path) -> dict[str, Any] | None:
    """The run's ``profile/top_ops.json``, or None when it has none (or it cannot be read)."""
    return rundir.read_json(top_ops_path(directory))


def _share(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{100 * value:.1f} %"
    return NA


def _ms(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:,.2f}"
    return NA


def _count(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "?"


def profile_head(data: dict[str, Any]) -> str:
    """``profile of 5 steps, 41.2 ms a step, GPU idle 7.5 % of it``.

    The file is the run's: only numbers are taken from it, anything else reads ``?``.
    """
    step_ms = data.get("step_ms")
    if isinstance(step_ms, (int, float)) and not isinstance(step_ms, bool):
        ms = f"{step_ms:,.1f}" if abs(step_ms) >= 1 else f"{step_ms:.3g}"
    else:
        ms = "?"
    head = f"profile of {_count(data.get('profiled_steps'))} steps, {ms} ms a step"
    idle = data.get("gpu_idle_pct")
    if isinstance(idle, (int, float)) and not isinstance(idle, bool):
        head += f", GPU idle {idle:.1f} % of it"
    return head


def profile_tables(
    data: dict[str, Any], directory: Path | None = None, rows: int = TOP_ROWS, name_width: int = 80
) -> list[RenderableType]:
    """The top CUDA kernels and CPU ops (name, self ms, calls, share), then the trace's path."""
    head = profile_head(data)
    out: list[RenderableType] = []
    for key, title in (("cuda_kernels", "CUDA kernels"), ("cpu_ops", "CPU ops")):
        found = data.get(key)
        if not isinstance(found, list) or not found:
            continue
        # A Text title: never read as markup.
        table = Table(
            title=Text(f"{head}: top {title} by self time"), box=None, title_justify="left"
        )
        for column in ("name", "self ms", "calls", "share of the steps"):
            table.add_column(
                column,
                justify="left" if column == "name" else "right",
                no_wrap=True,
                overflow="ellipsis" if column == "name" else "fold",
            )
        for row in found[:rows]:
            if not isinstance(row, dict):
                continue
            table.add_row(
                Text(safe(str(row.get("name", "?")))[:name_width]),
                _ms(row.get("self_ms")),
                _count(row.get("calls")),
                _share(row.get("share")),
            )
        out.append(table)
    if not out:
        out.append(Text(f"{head}: no kernel or op was recorded"))
    if directory is not None:
        trace = top_ops_path(directory).parent / "trace.json"
        out.append(Text(f"trace: {trace} (Perfetto, TensorBoard)"))
    return out
