"""A run that fills the disk its run directory is on, then exits with code 7."""

import os

fd = os.open(os.path.join(os.environ["GPUSTATION_RUN_DIR"], "filler"), os.O_WRONLY | os.O_CREAT)
try:
    while True:
        os.write(fd, b"\0" * 65536)
except OSError:
    pass
os._exit(7)  # nothing left to flush: every byte more would fail
