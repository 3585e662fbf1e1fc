"""A runner's phases in its metrics: the time it evaluates or saves is named as such.

``with within(metrics, "eval", step):`` reports ``{"phase": "eval"}`` as the
evaluation starts and the phase the run goes back to (``train``) as it ends,
so a slowdown the supervisor sees meanwhile is put down to the phase, not
to the GPU or the host (``gpustation.runs.slowdown``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def within(metrics: Any, phase: str, step: int, then: str = "train") -> Iterator[None]:
    """Report ``phase`` at ``step`` for the length of the block, then ``then``."""
    metrics.log(step=step, phase=phase)
    try:
        yield
    finally:
        metrics.log(step=step, phase=then)
