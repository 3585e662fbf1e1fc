"""A run that ignores SIGINT and SIGTERM, with a grandchild that does too.

Both PIDs go to the file named by the first argument, so a test can check
that neither survives. ``--setsid`` puts the grandchild in a session of its
own (as torchrun does with its workers); ``--exit-after S`` makes the child
itself exit with code 1 after S seconds, leaving the grandchild behind.
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
    ],
    start_new_session="--setsid" in sys.argv,
)
with open(sys.argv[1] + ".tmp", "w") as fh:
    fh.write(f"{os.getpid()} {grandchild.pid}\n")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print("ready", flush=True)
exit_after = (
    float(sys.argv[sys.argv.index("--exit-after") + 1]) if "--exit-after" in sys.argv else None
)
start = time.monotonic()
while exit_after is None or time.monotonic() - start < exit_after:
    time.sleep(0.1)
sys.exit(1)
