"""A run that goes on until a file appears (or SIGINT), then ends cleanly.

On SIGINT it says so and exits 0, as a training script that saves a
checkpoint on Ctrl-C would.
"""

import os
import sys
import time

from gpustation.runs.metrics import MetricsWriter

release = sys.argv[1]
metrics = MetricsWriter.from_env()
print("ready", flush=True)
step = 0
try:
    while not os.path.exists(release):
        step += 1
        if step % 10 == 0:
            metrics.log(step=step, loss=1.0, total_steps=100000)
        time.sleep(0.05)
except KeyboardInterrupt:
    print("interrupted: saving and leaving", flush=True)
    sys.exit(0)
print("released", flush=True)
