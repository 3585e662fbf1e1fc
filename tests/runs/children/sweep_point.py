"""One point of a sweep: reports a warm-up step without throughput, then steps
whose throughput follows the batch size; a batch of 999 runs out of memory."""

import argparse
import sys
import time

from gpustation.runs.metrics import MetricsWriter

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--sleep", type=float, default=0.3)
args = parser.parse_args()

with MetricsWriter.from_env() as metrics:
    if args.batch_size == 999:
        metrics.log(error="out_of_memory")
        print("torch.OutOfMemoryError: CUDA out of memory.", file=sys.stderr, flush=True)
        sys.exit(75)
    metrics.log(step=0, loss=3.0, throughput=None, unit="img/s", total_steps=args.steps)
    time.sleep(args.sleep)  # the workload's own warm-up
    for step in range(1, args.steps + 1):
        metrics.log(
            step=step,
            loss=2.0 / step,
            throughput=10.0 * args.batch_size,
            unit="img/s",
            total_steps=args.steps,
        )
        time.sleep(args.sleep)
print("done", flush=True)
