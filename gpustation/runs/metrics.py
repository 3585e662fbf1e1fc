"""The metrics protocol: one JSON object per line in ``metrics.jsonl``.

A child process finds the file's path in ``GPUSTATION_METRICS_FILE``. Each line
is an event with ``t`` (seconds since the writer started) and ``step``, plus any
of ``loss``, ``eval_loss``, ``lr``, ``grad_norm``, ``throughput`` with ``unit``
(``img/s``, ``tokens/s``, ``TFLOP/s`` ...), ``epoch``, ``total_steps``,
``mem_peak_mib``, once before the first step ``mem_static_mib`` (the memory
the model and optimizer hold before any step: what a forecast keeps when the
batch changes), and ``phase`` (``train``, ``eval``, ``checkpoint``, ``save``
...: from this event on the runner is in that phase, so a slowdown while it
evaluates or saves is put down to that); the last line may carry a
``summary`` object. Any other key is allowed and kept. This module imports
nothing heavy so any script can use it::

    from gpustation.runs.metrics import MetricsWriter
    with MetricsWriter.from_env() as m:
        m.log(step=1, loss=2.3, throughput=1200.0, unit="img/s", total_steps=100)
        m.summary(best_loss=1.1)
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import IO, Any

from gpustation import private

METRICS_ENV = "GPUSTATION_METRICS_FILE"
RUN_DIR_ENV = "GPUSTATION_RUN_DIR"
#: the run's id, set by the launcher for the run's processes
RUN_ID_ENV = "GPUSTATION_RUN_ID"

KNOWN_KEYS = (
    "t",
    "step",
    "loss",
    "eval_loss",
    "lr",
    "grad_norm",
    "throughput",
    "unit",
    "epoch",
    "total_steps",
    "mem_peak_mib",
    "mem_static_mib",
    "phase",
    "summary",
)


def _clean(value: Any) -> Any:
    # JSON has no NaN/inf; a diverged loss is still worth recording as null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item"):  # numpy / torch scalars
        try:
            return _clean(value.item())
        except Exception:
            return str(value)
    return value


class MetricsWriter:
    """Appends metric events to a JSON Lines file, flushed line by line.

    With no path (not started by gpustation, or not rank 0) it writes nothing,
    so scripts can call it unconditionally.
    """

    def __init__(self, path: str | os.PathLike[str] | None, echo: bool = False) -> None:
        self.path = os.fspath(path) if path else None
        self.echo = echo
        self._start = time.monotonic()
        self._fh: IO[str] | None = None
        if self.path:
            # Line-buffered and kept open for the run; closed by close().
            self._fh = open(  # noqa: SIM115
                self.path, "a", encoding="utf-8", buffering=1, opener=private.opener
            )

    @classmethod
    def from_env(cls, rank: int | None = None, echo: bool = False) -> MetricsWriter:
        """Writer for ``$GPUSTATION_METRICS_FILE``; inert on ranks other than 0."""
        if rank is None:
            rank = int(os.environ.get("RANK", "0") or 0)
        path = os.environ.get(METRICS_ENV) if rank == 0 else None
        return cls(path, echo=echo and rank == 0)

    @property
    def active(self) -> bool:
        return self._fh is not None

    def log(self, step: int | None = None, **values: Any) -> None:
        # ``time`` (Unix seconds) lines the event up with the GPU telemetry
        event: dict[str, Any] = {
            "t": round(time.monotonic() - self._start, 4),
            "time": round(time.time(), 3),
        }
        if step is not None:
            event["step"] = step
        event.update(values)
        self._write(event)

    def summary(self, **values: Any) -> None:
        self._write({"t": round(time.monotonic() - self._start, 4), "summary": values})

    def _write(self, event: dict[str, Any]) -> None:
        line = json.dumps(_clean(event), separators=(",", ":"))
        if self._fh is not None:
            self._fh.write(line + "\n")
        if self.echo:
            print(line, flush=True)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
