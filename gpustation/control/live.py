"""Control from a long-running program (the dashboard): changes that can be undone.

Every change made here returns a :class:`Change` whose ``revert()`` puts the
previous state back through the same journalled control functions. The
change takes effect at once and is handed to :attr:`LiveControl.confirmer`
(:mod:`gpustation.control.confirm`) before the method returns: unless
:meth:`LiveControl.confirm` is called within ``confirm_timeout_s``, the
confirmer's own thread reverts it, whatever the program's UI is doing.

A fan curve runs in a thread of its own (:class:`FanController` in a plain,
non-daemon thread) until another change replaces it or :meth:`LiveControl.close`
stops it; the controller hands the fans back to automatic control as it ends.

Nothing here may run on a UI thread: every method can block on the driver.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Sequence

from gpustation import private
from gpustation.control.confirm import CONFIRM_TIMEOUT_S, Change, Confirmer, Outcome
from gpustation.control.fancurve import FanController, stop_controllers
from gpustation.control.fans import fan_gpus, set_fans_auto
from gpustation.control.power import PowerChange, apply_power, plan_power
from gpustation.control.profiles import PowerValue, Profile
from gpustation.errors import GpustationError
from gpustation.paths import state_dir
from gpustation.pyargv import python_argv
from gpustation.telemetry.backend import Backend

#: (GPU index -> (temperature C or None, fan % or None)) after each controller poll
PollReport = dict[int, tuple[float | None, int | None]]

__all__ = ["Change", "LiveControl", "Outcome", "PollReport"]


def fan_controller_argv(profile: str, indices: str) -> list[str]:
    """``gpustation fan run PROFILE --gpus I,J``: the controller left running on its own.

    Under sudo it keeps root for its fan calls alone, as every gpustation command does.
    """
    return python_argv("-m", "gpustation", "fan", "run", profile, "--gpus", indices)


class LiveControl:
    """Profiles, power limits and a fan curve for one program's GPUs."""

    def __init__(
        self,
        backend: Backend,
        indices: Sequence[int],
        command: str = "gpustation dashboard",
        on_poll: Callable[[PollReport], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        confirm_timeout_s: float = CONFIRM_TIMEOUT_S,
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> None:
        self.backend = backend
        self.indices = list(indices)
        self.command = command
        self.on_poll = on_poll
        self.on_error = on_error
        #: the profile whose fan curve runs now (None: fans are the card's)
        self.curve_profile: Profile | None = None
        #: the last profile applied (for display)
        self.applied_profile: str | None = None
        self.last_poll: PollReport = {}
        self._controller: FanController | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.RLock()
        #: holds the unconfirmed change and reverts it at its deadline
        self.confirmer = Confirmer(confirm_timeout_s, on_outcome)

    # ---- confirm or revert ------------------------------------------------------
    @property
    def confirm_timeout_s(self) -> float:
        """Seconds a new change waits for :meth:`confirm` before it reverts."""
        return self.confirmer.timeout_s

    @confirm_timeout_s.setter
    def confirm_timeout_s(self, seconds: float) -> None:
        self.confirmer.timeout_s = seconds

    @property
    def pending(self) -> Change | None:
        """The change waiting to be confirmed, if any."""
        return self.confirmer.pending

    def confirm(self) -> bool:
        """Keep the pending change; False when it is already reverting or gone."""
        return self.confirmer.confirm()

    def revert(self) -> bool:
        """Revert the pending change now, on the confirmer's thread (returns at once)."""
        return self.confirmer.revert()

    def _check_none_pending(self) -> None:
        pending = self.confirmer.pending
        if pending is not None:
            raise GpustationError(f"confirm or revert {pending.description} first")

    def _propose(self, change: Change) -> Change:
        self.confirmer.propose(change)
        return change

    # ---- the fan curve thread ------------------------------------------------
    @property
    def curve_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _start_curve(self, profile: Profile, indices: Sequence[int]) -> None:
        assert profile.curve is not None
        controller = FanController(
            backend=self.backend,
            indices=list(indices),
            curve=profile.curve,
            command=f"{self.command}: profile {profile.name}",
            on_poll=self._polled,
        )
        controller.check()

        def run() -> None:
            try:
                controller.run()
            except Exception as err:  # reported; the controller already restored the fans
                if self.on_error is not None:
                    self.on_error(f"fan curve {profile.name!r} stopped: {err}")
            finally:
                # No lock here: stop_curve() may hold it while it waits for this thread.
                if self._controller is controller:
                    self.curve_profile = None

        thread = threading.Thread(target=run, name=f"gpustation-fan-curve-{profile.name}")
        self._controller, self._thread = controller, thread
        self.curve_profile = profile
        thread.start()

    def _polled(self, report: PollReport) -> None:
        self.last_poll = dict(report)
        if self.on_poll is not None:
            self.on_poll(report)

    def leave_curve_running(self) -> int:
        """Hand the running curve to a controller process of its own and return its pid.

        For a dashboard that quits with a kept curve: ``gpustation fan run
        PROFILE`` starts in a session of its own (it outlives the dashboard; a
        later ``gpustation fan auto`` stops it), after this process's curve has
        handed the fans back, so the two never drive them at once.
        """

        controller, profile = self._controller, self.curve_profile
        if controller is None or profile is None:
            raise GpustationError("no fan curve is running to leave behind")
        indices = ",".join(map(str, controller.indices))
        argv = fan_controller_argv(profile.name, indices)
        sim = self.backend
        if sim.simulated:
            argv += ["--simulate", str(getattr(sim, "count", 2))]
            spec = getattr(sim, "spec", None)
            if spec is not None:
                argv += ["--sim-card", spec.key]
        self.stop_curve()
        log = state_dir() / "fan-controller.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab", opener=private.opener) as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        return proc.pid

    def stop_curve(self, timeout_s: float = 30.0) -> None:
        """Stop the running fan curve (its fans go back to automatic) and wait."""
        with self._lock:
            controller, thread = self._controller, self._thread
            self._controller = self._thread = None
            self.curve_profile = None
            self.last_poll = {}
        if controller is not None:
            controller.request_stop()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                raise GpustationError(
                    f"the fan curve did not stop within {timeout_s:g} s; run `gpustation fan auto`."
                )

    def request_stop(self, signum: int | None = None) -> None:
        """From a signal handler: end the fan curve and revert an unconfirmed change.

        Returns at once; both happen on their own threads.
        """
        controller = self._controller
        if controller is not None:
            controller.request_stop(signum)
        self.confirmer.revert()

    def close(self) -> None:
        """Revert an unconfirmed change, then stop the fan curve (fans to automatic)."""
        try:
            self.confirmer.close()
        finally:
            self.stop_curve()

    # ---- changes ---------------------------------------------------------------
    def _restore_power(self, changes: Sequence[PowerChange], why: str) -> None:
        back = [
            PowerChange(
                gpu=c.gpu,
                uuid=c.uuid,
                name=c.name,
                current_w=c.new_w,
                new_w=c.current_w,
                default_w=c.default_w,
                min_w=c.min_w,
                max_w=c.max_w,
            )
            for c in changes
            if c.current_w is not None and not c.unchanged
        ]
        apply_power(self.backend, back, f"{self.command}: {why}")

    def _restore_fans(self, previous: Profile | None, fan_indices: Sequence[int]) -> None:
        self.stop_curve()
        if previous is not None and previous.curve is not None:
            self._start_curve(previous, fan_indices)

    def set_power_limit(self, index: int, watts: float) -> Change:
        """Set one GPU's limit; the change's revert puts the old limit back."""
        with self._lock:
            self._check_none_pending()
            samples = self.backend.read_gpus([index], slow=False)
            changes = plan_power(samples, PowerValue("watts", watts))
            apply_power(self.backend, changes, f"{self.command}: power limit {watts:g} W")
        old = changes[0].current_w
        was = f"{old:g} W" if old is not None else "n/a"
        return self._propose(
            Change(
                description=f"GPU {index} power limit {was} -> {watts:g} W",
                revert=lambda: self._restore_power(changes, "revert power limit"),
                undone=f"GPU {index} power limit to {was} (from {watts:g} W)",
            )
        )

    def apply_profile(self, profile: Profile) -> Change:
        """Apply power and fans; check everything first.

        Cards without fans get the power part only (said in the notes). A fan
        curve runs in a thread until replaced, reverted or closed. The change
        reverts by itself unless confirmed (see :attr:`confirmer`).
        """
        with self._lock:
            self._check_none_pending()
            notes: list[str] = []
            samples = self.backend.read_gpus(self.indices, slow=False)
            changes = plan_power(samples, profile.power) if profile.power is not None else []
            fan_indices = [s.index for s in fan_gpus(self.backend, samples)]
            no_fans = [s.index for s in samples if s.index not in fan_indices]
            if profile.fan_mode is not None and no_fans:
                notes.append(
                    "no controllable fans on GPU "
                    + ", ".join(map(str, no_fans))
                    + ": power only there"
                )
            if profile.fan_mode == "curve" and fan_indices:
                assert profile.curve is not None
                FanController(self.backend, fan_indices, profile.curve, self.command).check()
            previous_curve = self.curve_profile

            apply_power(self.backend, changes, f"{self.command}: profile {profile.name}")
            try:
                if profile.fan_mode is not None and fan_indices:
                    self.stop_curve()
                    stop_controllers(fan_indices, self.backend.simulated)
                    if profile.fan_mode == "curve":
                        self._start_curve(profile, fan_indices)
                    else:
                        set_fans_auto(
                            self.backend,
                            fan_indices,
                            f"{self.command}: profile {profile.name}",
                            require_fans=False,
                        )
            except BaseException:
                self._restore_power(changes, f"undo profile {profile.name} after a failure")
                raise
            previous_name = self.applied_profile
            self.applied_profile = profile.name

        def revert() -> None:
            with self._lock:
                self._restore_power(changes, f"revert profile {profile.name}")
                if profile.fan_mode is not None and fan_indices:
                    # Stopping this profile's curve puts the fans back on automatic;
                    # a curve the dashboard ran before comes back.
                    self._restore_fans(previous_curve, fan_indices)
                self.applied_profile = previous_name

        return self._propose(
            Change(description=f"profile {profile.name}", revert=revert, notes=notes)
        )
