"""What the dashboard may cost, stated once.

``tests/tui/test_budget.py`` holds the code to the budgets it can check on
any machine (driver calls per pass, wakes of an idle thread, what the first
pass imports); ``bench/dashboard_cpu.py --real --nvitop`` measures the
targets against nvitop on a real GPU and says which are met. Figures go in
``bench/RESULTS.md``.
"""

from __future__ import annotations

#: driver calls in one fast pass, per GPU (the NVML backend, GPM on): the
#: dear readings (per-process SM, NVLink, ECC counters, MIG) are slow-pass ones
FAST_PASS_CALLS_PER_GPU = 20
#: times a minute an idle XID watcher may wake (one per wait in the driver)
XID_WAKES_PER_MINUTE = 6
#: seconds the app may take to stop a watcher whose wait is still in progress
XID_CLOSE_S = 0.5

# Against nvitop on the same machine, in the same run (bench/dashboard_cpu.py):
#: steady CPU over the same window, as a share of nvitop's
STEADY_CPU_VS_NVITOP = 1.0
#: seconds from start to the first full frame (a GPU card with its readings)
FIRST_FRAME_S = 0.5
#: resident memory, as a multiple of nvitop's
RSS_VS_NVITOP = 1.3
