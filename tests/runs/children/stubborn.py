"""A run that ignores SIGINT and SIGTERM, with a grandchild that does too.

Both PIDs go to the file named by the first argument, so a test can check
that neither survives a stop.
"""

import os
import signal
import subprocess
import sys
import time

signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen(
    [
        sys.executable,
        "-c",
        "import signal, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "while True: time.sleep(0.1)\n",
    ]
)
with open(sys.argv[1] + ".tmp", "w") as fh:
    fh.write(f"{os.getpid()} {grandchild.pid}\n")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print("ready", flush=True)
while True:
    time.sleep(0.1)
