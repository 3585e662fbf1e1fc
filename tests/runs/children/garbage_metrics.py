"""A run whose metrics file has garbage and a line written in two halves."""

import os
import time

path = os.environ["GPUSTATION_METRICS_FILE"]
with open(path, "a", encoding="utf-8") as fh:
    fh.write('{"t": 0.1, "step": 1, "loss": 3.0}\n')
    fh.write("this is not json\n")
    fh.write("[1, 2, 3]\n")
    fh.write('{"t": 0.2, "step": 2, "lo')
    fh.flush()
    time.sleep(0.3)
    fh.write('ss": 2.0, "throughput": 50.0, "unit": "tokens/s"}\n')
    fh.write("\n")
    fh.write('{"t": 0.3, "step": 3, "loss": 1.5}\n')
    fh.write('{"broken": \n')
print("wrote metrics", flush=True)
