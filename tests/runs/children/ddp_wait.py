"""Two ranks on gloo that report ready and then wait (until stopped).

Rank 0 writes the PIDs of both workers to the file named by the first
argument once both have joined; torchrun starts each worker in a session of
its own, which is what a stop has to cope with.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
pids = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
dist.all_gather(pids, torch.tensor([os.getpid()], dtype=torch.int64))
if dist.get_rank() == 0:
    with open(sys.argv[1] + ".tmp", "w") as fh:
        fh.write(" ".join(str(int(p.item())) for p in pids) + "\n")
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    print("ready", flush=True)
while True:
    time.sleep(0.1)
