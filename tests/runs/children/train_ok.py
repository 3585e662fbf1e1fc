"""A tiny run that succeeds: logs lines and metrics for a few steps."""

import argparse
import sys
import time

from gpustation.runs.metrics import MetricsWriter

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--sleep", type=float, default=0.05)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--tag", default="")
args = parser.parse_args()

with MetricsWriter.from_env() as metrics:
    for step in range(1, args.steps + 1):
        loss = 2.0 / step
        print(f"step {step} loss {loss:.3f} tag={args.tag}", flush=True)
        print(f"warning on stderr {step}", file=sys.stderr, flush=True)
        metrics.log(
            step=step,
            loss=loss,
            lr=args.lr,
            throughput=100.0 * step,
            unit="img/s",
            total_steps=args.steps,
            mem_peak_mib=1000.0 + step,
        )
        time.sleep(args.sleep)
    metrics.summary(accuracy=0.5 + args.steps / 100)
print("done", flush=True)
