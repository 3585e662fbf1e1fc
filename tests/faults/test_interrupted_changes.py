"""A change cut short by the death of the process that made it: the journal keeps
what the card was and says the outcome is unknown; an unconfirmed change still
reverts at its deadline when the program that made it crashes."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from gpustation.control import journal
from gpustation.telemetry.sim import SimBackend
from tests.conftest import child_env

DIES_AFTER_THE_SET = textwrap.dedent(
    """
    import os, signal
    from gpustation.control.power import apply_power, plan_power
    from gpustation.control.profiles import PowerValue
    from gpustation.telemetry.sim import SimBackend

    class DiesBeforeTheReadBack(SimBackend):
        made = False

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            setter = self.control.set_power_limit

            def set_power_limit(index, watts):
                setter(index, watts)
                self.made = True

            self.control.set_power_limit = set_power_limit

        def read_gpus(self, indices, slow):
            if self.made:  # the read-back: the process is killed first
                os.kill(os.getpid(), signal.SIGKILL)
            return super().read_gpus(indices, slow)

    sim = DiesBeforeTheReadBack.open(count=2)
    changes = plan_power(sim.read_gpus([0], slow=False), PowerValue("watts", 300.0))
    apply_power(sim, changes, "gpustation power set 300W")
    """
)


def test_a_change_killed_before_its_read_back_is_journalled_unknown_with_what_was(
    gpustation_dirs: dict[str, Path],
) -> None:
    child = subprocess.run(
        [sys.executable, "-c", DIES_AFTER_THE_SET], env=child_env(), capture_output=True, timeout=60
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    (entry,) = journal.read_entries()
    assert (entry.gpu, entry.previous, entry.new) == (0, 450.0, 300.0)
    assert entry.outcome == journal.UNKNOWN and entry.read_back is None
    # the change itself was made: the journal is what says the card was 450 W
    assert SimBackend.open(count=2).read_gpus([0], slow=False)[0].power_limit_w == 300.0


CRASHES_WITH_A_CHANGE_PENDING = textwrap.dedent(
    """
    from gpustation.control.live import LiveControl
    from gpustation.telemetry.sim import SimBackend

    sim = SimBackend.open(count=2)
    live = LiveControl(sim, [0, 1], command="gpustation dashboard", confirm_timeout_s=1.0)
    live.set_power_limit(0, 300.0)
    print("changed", flush=True)
    raise RuntimeError("the program crashed before the change was confirmed")
    """
)


def test_the_confirm_deadline_outlives_a_crashed_caller(gpustation_dirs: dict[str, Path]) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CRASHES_WITH_A_CHANGE_PENDING],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "changed" in child.stdout and "RuntimeError" in child.stderr
    assert child.returncode == 1  # the crash, yet the deadline ran out before the exit
    assert SimBackend.open(count=2).read_gpus([0], slow=False)[0].power_limit_w == 450.0
    entries = list(journal.read_entries())
    assert [(e.new, e.outcome) for e in entries] == [(300.0, "made"), (450.0, "made")]
    assert "revert power limit" in entries[1].command
