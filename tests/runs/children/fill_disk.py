"""A run that fills the disk its run directory is on, then exits with code 7.

Where the test cannot mount a small disk it injects ENOSPC instead
(tests/faults/enospc): then this creates the flag that makes the disk
"full" (``$GPUSTATION_TEST_ENOSPC_FLAG``) rather than filling it.
"""

import os

flag = os.environ.get("GPUSTATION_TEST_ENOSPC_FLAG")
if flag:
    with open(flag, "w") as fh:
        fh.write("full\n")
else:
    fd = os.open(os.path.join(os.environ["GPUSTATION_RUN_DIR"], "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass
os._exit(7)  # nothing left to flush: every byte more would fail
