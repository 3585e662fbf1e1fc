"""A run that crashes: a traceback on stderr, then exit code 3."""

import sys
import traceback

print("loading data", flush=True)
try:
    raise RuntimeError("the dataset is missing")
except RuntimeError:
    traceback.print_exc()
sys.exit(3)
