"""A run whose worker double-forks into a session of its own and outlives its parent.

argv: MARKER [--wait FILE]. The escaped process is ``python -c ... MARKER``
(a 600 s sleep), so a test finds it by the marker in its argv. With
``--wait FILE`` the child waits for FILE (or a stop); without, it exits at once.
"""

import os
import sys
import time

marker = sys.argv[1]
middle = os.fork()
if middle == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", marker])
    os._exit(0)  # the middle process goes: its child is an orphan
os.waitpid(middle, 0)
print("forked", flush=True)
if "--wait" in sys.argv:
    release = sys.argv[sys.argv.index("--wait") + 1]
    while not os.path.exists(release):
        time.sleep(0.05)
