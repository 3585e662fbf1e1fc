"""A workload to check forecasts on: a set-up, then steps of a fixed time, its memory
reported as the training runners report it (once before the first step, then the peak)."""

import argparse
import time

from gpustation.runs.metrics import MetricsWriter

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--step-s", type=float, default=0.25)
parser.add_argument("--setup-s", type=float, default=0.2)
parser.add_argument("--static-mib", type=float, default=1000.0)
parser.add_argument("--mib-per-sample", type=float, default=100.0)
args = parser.parse_args()

with MetricsWriter.from_env() as metrics:
    time.sleep(args.setup_s)
    metrics.log(mem_static_mib=args.static_mib)
    for step in range(1, args.steps + 1):
        time.sleep(args.step_s)
        metrics.log(
            step=step,
            loss=1.0 / step,
            throughput=args.batch_size / args.step_s if step > 1 else None,
            unit="img/s",
            total_steps=args.steps,
            mem_peak_mib=args.static_mib + args.batch_size * args.mib_per_sample,
        )
print("done", flush=True)
