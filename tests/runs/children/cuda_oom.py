"""A run that dies the way PyTorch does when the GPU runs out of memory."""

import sys

print("step 1", flush=True)
print(
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    file=sys.stderr,
    flush=True,
)
sys.exit(1)
