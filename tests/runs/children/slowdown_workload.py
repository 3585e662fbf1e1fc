"""A run for the slowdown tests: steps at a steady pace and reports steps/s a few times a second.

The control file (``--control``) holds a factor the step's sleep is multiplied
by (2 halves the throughput; missing: 1) or ``stop`` to end the run. With
``--cpu`` a step is a fixed amount of CPU work instead of a sleep, so a busy
host really slows it down.
"""

import argparse
import time
from pathlib import Path

from gpustation.runs.metrics import MetricsWriter

parser = argparse.ArgumentParser()
parser.add_argument("--control", required=True)
parser.add_argument("--cpu", action="store_true")
parser.add_argument("--step-s", type=float, default=0.02)
parser.add_argument("--report-s", type=float, default=0.25)
parser.add_argument("--max-s", type=float, default=180.0)
args = parser.parse_args()
control = Path(args.control)


def told() -> float | None:
    """The factor the control file asks for; None to stop."""
    try:
        text = control.read_text().strip()
    except OSError:
        return 1.0
    if text == "stop":
        return None
    try:
        return max(0.1, float(text))
    except ValueError:
        return 1.0


def cpu_step() -> None:
    total = 0
    for i in range(20000):
        total += i * i


with MetricsWriter.from_env() as metrics:
    start = last_t = time.monotonic()
    step = last_step = 0
    factor: float | None = told()
    while factor is not None and time.monotonic() - start < args.max_s:
        if args.cpu:
            cpu_step()
        else:
            time.sleep(args.step_s * factor)
        step += 1
        now = time.monotonic()
        if now - last_t >= args.report_s:
            metrics.log(step=step, throughput=(step - last_step) / (now - last_t), unit="steps/s")
            last_t, last_step = now, step
            factor = told()
print(f"done at step {step}", flush=True)
