"""The process table's rows and columns, built from the telemetry model.

A row per process NVML lists on a GPU, then a row per process that holds the
GPU's device node open without being listed (``kind`` "holder": often what
keeps the memory after the job was killed). Pure data: the widgets in
:mod:`gpustation.tui.widgets` draw them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpustation.telemetry import format as fmt
from gpustation.telemetry.model import Snapshot
from gpustation.tui.source import ProcStat

#: what the TYPE column says for each kind of process
KIND_CELLS = {"compute": "C", "graphics": "G", "holder": "holder"}


@dataclass(frozen=True, slots=True)
class ProcRow:
    gpu: int
    pid: int
    user: str
    gpu_memory_mib: float | None
    cpu_pct: float | None
    rss_bytes: int | None
    command: str
    #: compute | graphics | holder (holds the device node open, not in NVML's list)
    kind: str = "compute"
    #: share of the SMs' time it used (nvmlDeviceGetProcessUtilization)
    sm_pct: float | None = None
    #: when the process started (seconds since the epoch; None where unknown)
    started: float | None = None
    #: its estimated part of the GPU's power (from its SM share)
    power_w: float | None = None
    #: the container, systemd unit or Slurm job it runs in
    container: str | None = None

    @property
    def key(self) -> str:
        return f"{self.gpu}:{self.pid}"

    @property
    def holder(self) -> bool:
        return self.kind == "holder"

    def cells(self) -> tuple[str, ...]:
        rss = None if self.rss_bytes is None else self.rss_bytes / (1024 * 1024)
        return (
            str(self.pid),
            self.user,
            str(self.gpu),
            KIND_CELLS.get(self.kind, self.kind),
            # NVML does not say what a holder's context holds: it has none it lists
            "?" if self.holder else fmt.mib(self.gpu_memory_mib),
            fmt.num(self.sm_pct, 0),
            fmt.num(self.power_w, 0, " W"),
            _fit(self.container or "-", WIDTHS[7]),
            fmt.num(self.cpu_pct, 0),
            fmt.mib(rss),
            self.command,
        )


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _num(value: float | None) -> float:
    """Numbers sort above n/a."""
    return -1.0 if value is None else value


SORT_KEYS: dict[str, Callable[[ProcRow], object]] = {
    "pid": lambda r: r.pid,
    "user": lambda r: r.user,
    "gpu": lambda r: (r.gpu, r.pid),
    "type": lambda r: (r.kind, r.gpu, r.pid),
    "gpu_mem": lambda r: _num(r.gpu_memory_mib),
    "sm": lambda r: _num(r.sm_pct),
    "power": lambda r: _num(r.power_w),
    "container": lambda r: (r.container or "", r.gpu, r.pid),
    "cpu": lambda r: _num(r.cpu_pct),
    "rss": lambda r: r.rss_bytes or 0,
    "command": lambda r: r.command,
}
#: (header, sort key) of each column, in order; the last one takes the rest of the line
COLUMNS = (
    ("PID", "pid"),
    ("USER", "user"),
    ("GPU", "gpu"),
    ("TYPE", "type"),
    ("GPU MEM", "gpu_mem"),
    ("SM %", "sm"),
    ("POWER", "power"),
    ("CONTAINER", "container"),
    ("CPU %", "cpu"),
    ("RSS", "rss"),
    ("COMMAND", "command"),
)
#: the width of each column but the last
WIDTHS = (7, 10, 4, 6, 9, 5, 6, 16, 6, 7)
#: sort keys whose first order is the largest first
DESCENDING = frozenset({"gpu_mem", "sm", "power", "cpu", "rss"})


def process_rows(snap: Snapshot, stats: dict[int, ProcStat]) -> list[ProcRow]:
    """A row per listed process of each GPU, then one per device-node holder."""
    rows = []
    for gpu in snap.gpus:
        for p in [*gpu.processes, *(gpu.device_holders or ())]:
            st = stats.get(p.pid, ProcStat())
            rows.append(
                ProcRow(
                    gpu=gpu.index,
                    pid=p.pid,
                    user=p.user or fmt.NA,
                    gpu_memory_mib=p.gpu_memory_mib,
                    cpu_pct=st.cpu_pct,
                    rss_bytes=st.rss_bytes,
                    command=p.command or p.name or fmt.NA,
                    kind=p.kind,
                    sm_pct=p.sm_pct,
                    started=st.started,
                    power_w=p.power_w,
                    container=p.container,
                )
            )
    return rows
