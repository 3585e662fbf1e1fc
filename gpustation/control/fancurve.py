"""The fan-curve controller: temperature in, fan speed out, fans always handed back.

``FanController.run`` checks every card before touching any, takes the fans
over, follows the curve (with hysteresis and a spin-down delay), goes to full
speed when a temperature read fails or the card nears its slowdown
temperature, and on every way out — normal end, SIGINT, SIGTERM, SIGHUP, an
exception inside the loop — puts every fan of every controlled card back on
automatic control, each in its own ``try`` so one failure skips no other.

One controller per card at a time: a lock file per GPU in the state directory
holds the controller's pid, so ``gpustation fan auto`` and ``profile apply``
can ask a running controller to stop before they change the fans.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from gpustation import private, timefmt
from gpustation.control import journal
from gpustation.control.profiles import FanCurve
from gpustation.errors import (
    EXIT_INTERRUPTED,
    GpustationError,
    NotSupportedError,
    UsageError,
)
from gpustation.paths import state_dir
from gpustation.telemetry.backend import Backend
from gpustation.telemetry.model import GpuSample

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(slots=True)
class CardFans:
    """What the controller knows about one card's fans."""

    index: int
    uuid: str | None
    name: str | None
    fans: int
    card_min_pct: int
    card_max_pct: int
    #: the curve's bounds inside the card's: never below the card's minimum
    lo_pct: int
    hi_pct: int


@dataclass(slots=True)
class FanState:
    """The controller's memory for one card between polls."""

    pct: int | None = None
    #: when the curve (with hysteresis) first allowed a lower speed
    low_since: float | None = None
    emergency: str | None = None
    taken_over: bool = False


def card_fans(backend: Backend, sample: GpuSample, curve: FanCurve | None) -> CardFans:
    """Check that the card's fans can be driven; NotSupportedError if not."""
    label = f"GPU {sample.index}" + (f" ({sample.name})" if sample.name else "")
    if sample.lost:
        raise GpustationError(f"{label} has fallen off the bus; its fans cannot be controlled.")
    count = backend.control.fan_count(sample.index)
    if count <= 0:
        raise NotSupportedError(
            f"{label} has no fans gpustation can control (datacenter cards are cooled by "
            "the chassis)."
        )
    try:
        card_min, card_max = backend.control.fan_speed_range(sample.index)
    except NotSupportedError as err:
        raise NotSupportedError(str(err)) from None
    lo, hi = card_min, card_max
    if curve is not None:
        lo = max(card_min, math.ceil(curve.min_pct))
        hi = min(card_max, math.floor(curve.max_pct))
        # A profile whose maximum is below the card's minimum still never goes
        # below the card's minimum.
        hi = max(hi, lo)
    return CardFans(
        index=sample.index,
        uuid=sample.uuid,
        name=sample.name,
        fans=count,
        card_min_pct=card_min,
        card_max_pct=card_max,
        lo_pct=lo,
        hi_pct=hi,
    )


def decide(
    curve: FanCurve,
    card: CardFans,
    state: FanState,
    temperature_c: float | None,
    slowdown_c: float | None,
    now: float,
) -> tuple[int, str | None]:
    """The speed to run at now and, in an emergency, why.

    Speeds go up at once. They come down only when the curve, read
    ``hysteresis_c`` degrees warmer than the card is, asks for less than the
    fans run at, and has done so for ``spin_down_delay_s``: a brief dip does
    not make the fans hunt.
    """
    if temperature_c is None:
        state.low_since = None
        return card.card_max_pct, "temperature read failed"
    if slowdown_c is not None and temperature_c >= slowdown_c - curve.emergency_margin_c:
        state.low_since = None
        return card.card_max_pct, (
            f"{temperature_c:g} C is within {curve.emergency_margin_c:g} C of the "
            f"slowdown temperature {slowdown_c:g} C"
        )

    def clamp(pct: float) -> int:
        return max(card.lo_pct, min(card.hi_pct, round(pct)))

    want = clamp(curve.speed_at(temperature_c))
    if state.pct is None or want >= state.pct:
        state.low_since = None
        return want, None
    relaxed = clamp(curve.speed_at(temperature_c + curve.hysteresis_c))
    if relaxed >= state.pct:
        state.low_since = None
        return state.pct, None
    if state.low_since is None:
        state.low_since = now
    if now - state.low_since < curve.spin_down_delay_s:
        return state.pct, None
    state.low_since = None
    return relaxed, None


# ---- one controller per card -------------------------------------------------------


def _lock_path(index: int, simulated: bool) -> Path:
    return state_dir() / f"fan-control-{'sim-' if simulated else ''}gpu{index}.lock"


def _controller_pid(path: Path) -> int | None:
    """The pid of the controller holding ``path``, or None when nobody holds it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return int(os.read(fd, 32).decode().strip() or 0) or None
            except ValueError:
                return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def running_controllers(indices: Sequence[int], simulated: bool) -> dict[int, int]:
    """GPU index -> pid of a fan controller driving it now."""
    found: dict[int, int] = {}
    for index in indices:
        pid = _controller_pid(_lock_path(index, simulated))
        if pid is not None:
            found[index] = pid
    return found


def _is_gpustation(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"gpustation" in f.read()
    except OSError:
        return False


def stop_controllers(indices: Sequence[int], simulated: bool, timeout_s: float = 15.0) -> list[int]:
    """Ask fan controllers driving these GPUs to stop (SIGTERM) and wait for them.

    They hand their fans back to automatic control on the way out. Returns the
    pids stopped; raises GpustationError if one does not stop in time.
    """
    pids = {
        pid
        for pid in running_controllers(indices, simulated).values()
        if pid != os.getpid() and pid > 1 and _is_gpustation(pid)
    }
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        if not set(running_controllers(indices, simulated).values()) & pids:
            return sorted(pids)
        time.sleep(0.05)
    if pids and set(running_controllers(indices, simulated).values()) & pids:
        raise GpustationError(
            f"the fan controller (pid {', '.join(map(str, sorted(pids)))}) did not stop "
            f"within {timeout_s:g} s; nothing was changed."
        )
    return sorted(pids)


@contextlib.contextmanager
def _hold_locks(indices: Sequence[int], simulated: bool) -> Iterator[None]:
    fds: list[int] = []
    try:
        for index in indices:
            path = _lock_path(index, simulated)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, private.FILE_MODE)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                pid = _controller_pid(path)
                raise UsageError(
                    f"GPU {index}'s fans are already driven by a fan controller"
                    + (f" (pid {pid})" if pid else "")
                    + "; stop it first (`gpustation fan auto` does), then try again."
                ) from None
            fds.append(fd)
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)


# ---- the controller -------------------------------------------------------------------


@dataclass
class FanController:
    """Drives the fans of ``indices`` along ``curve`` until asked to stop."""

    backend: Backend
    indices: Sequence[int]
    curve: FanCurve
    command: str
    out: TextIO | None = None
    interval_s: float | None = None
    #: called after each poll with the readings and speeds (the UI draws them)
    on_poll: Callable[[dict[int, tuple[float | None, int | None]]], None] | None = None
    clock: Callable[[], float] = time.monotonic
    stop_event: threading.Event = field(default_factory=threading.Event)
    cards: list[CardFans] = field(default_factory=list)
    states: dict[int, FanState] = field(default_factory=dict)
    stop_signal: int | None = None

    # -- checks ------------------------------------------------------------
    def check(self) -> list[CardFans]:
        """Check every card first; raise before anything is touched."""
        samples = self.backend.read_gpus(list(self.indices), slow=False)
        problems: list[GpustationError] = []
        cards: list[CardFans] = []
        for sample in samples:
            try:
                cards.append(card_fans(self.backend, sample, self.curve))
            except GpustationError as err:
                problems.append(err)
        if problems:
            code = max(p.exit_code for p in problems)
            raise type(problems[0])(
                "\n".join(str(p) for p in problems) + "\nNothing was changed.", exit_code=code
            )
        self.cards = cards
        return cards

    def preview(self) -> list[tuple[CardFans, float | None, int, str | None]]:
        """What the controller would set right now, per card (for --dry-run)."""
        cards = self.cards or self.check()
        samples = {s.index: s for s in self.backend.read_gpus(list(self.indices), slow=False)}
        result = []
        for card in cards:
            s = samples[card.index]
            pct, why = decide(
                self.curve, card, FanState(), s.temperature_c, s.temperature_slowdown_c, 0.0
            )
            result.append((card, s.temperature_c, pct, why))
        return result

    # -- output ------------------------------------------------------------
    def log(self, message: str) -> None:
        if self.out is None:
            return
        stamp = timefmt.clock()
        print(f"{stamp} {message}", file=self.out, flush=True)

    # -- signals -----------------------------------------------------------
    def request_stop(self, signum: int | None = None) -> None:
        """Ask the loop to end; safe from a signal handler or another thread."""
        if signum is not None and self.stop_signal is None:
            self.stop_signal = signum
        self.stop_event.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.request_stop(signum)

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        # Handlers can only be set from the main thread; the dashboard runs a
        # controller in a worker thread and stops it itself.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous: dict[int, Any] = {}
        try:
            for sig in STOP_SIGNALS:
                previous[sig] = signal.signal(sig, self._on_signal)
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    # -- the loop ------------------------------------------------------------
    def run(self, once: bool = False, duration_s: float | None = None) -> int:
        """Control the fans until stopped; return the exit status.

        0 after a normal end or SIGTERM/SIGHUP, 130 after SIGINT. An error in
        the loop is raised again after every fan is back on automatic.
        """
        cards = self.cards or self.check()
        interval = self.interval_s if self.interval_s is not None else self.curve.poll_interval_s
        self.states = {c.index: FanState() for c in cards}
        failure: BaseException | None = None
        restore_failures: list[str] = []
        with self._signals(), _hold_locks([c.index for c in cards], self.backend.simulated):
            try:
                self.log(
                    "fan controller started on "
                    + ", ".join(
                        f"GPU {c.index} ({c.fans} fan{'s' if c.fans != 1 else ''}, "
                        f"{c.lo_pct}-{c.hi_pct} %)"
                        for c in cards
                    )
                    + f"; polling every {interval:g} s"
                )
                started = self.clock()
                while not self.stop_event.is_set():
                    self._poll(cards)
                    if once:
                        break
                    if duration_s is not None and self.clock() - started >= duration_s:
                        break
                    self.stop_event.wait(interval)
            except Exception as err:  # every error ends in fans-to-auto, then is reported
                failure = err
                self.log(f"error: {err}; returning the fans to automatic control")
            finally:
                restore_failures = self.restore(cards)
        if failure is not None:
            if isinstance(failure, GpustationError):
                if restore_failures:
                    raise type(failure)(
                        f"{failure} Also, some fans could not be returned to automatic "
                        f"control: {'; '.join(restore_failures)}.",
                        exit_code=failure.exit_code,
                    ) from failure
                raise failure
            raise GpustationError(
                f"the fan controller stopped on an error: {failure!r}. "
                "Every fan was returned to automatic control."
            ) from failure
        if restore_failures:
            raise GpustationError(
                "could not return every fan to automatic control: "
                + "; ".join(restore_failures)
                + ". Run `gpustation fan auto` (as root if needed)."
            )
        if self.stop_signal is not None:
            name = signal.Signals(self.stop_signal).name
            self.log(f"stopped by {name}; fans are on automatic control")
            return EXIT_INTERRUPTED if self.stop_signal == signal.SIGINT else 0
        self.log("stopped; fans are on automatic control")
        return 0

    def _poll(self, cards: Sequence[CardFans]) -> None:
        samples = {s.index: s for s in self.backend.read_gpus([c.index for c in cards], False)}
        now = self.clock()
        report: dict[int, tuple[float | None, int | None]] = {}
        for card in cards:
            sample = samples[card.index]
            state = self.states[card.index]
            temp = sample.temperature_c
            pct, why = decide(self.curve, card, state, temp, sample.temperature_slowdown_c, now)
            if why != state.emergency:
                if why is not None:
                    self.log(f"GPU {card.index}: {why}: fans to maximum until readings recover")
                elif state.emergency is not None:
                    self.log(f"GPU {card.index}: readings recovered ({temp:g} C)")
                state.emergency = why
            if pct != state.pct:
                self._set(card, sample, state, pct)
                shown = "n/a" if temp is None else f"{temp:g} C"
                self.log(f"GPU {card.index}: {shown} -> fans {pct} %")
            report[card.index] = (temp, state.pct)
        if self.on_poll is not None:
            self.on_poll(report)

    def _set(self, card: CardFans, sample: GpuSample, state: FanState, pct: int) -> None:
        entries: list[journal.JournalEntry | None] = [None] * card.fans
        if not state.taken_over:
            # Manual control starts here: journal what each fan was doing first.
            for fan in range(card.fans):
                entries[fan] = journal.record(
                    gpu=card.index,
                    uuid=card.uuid,
                    what=journal.FAN_SPEED,
                    previous={
                        "mode": _at(sample.fan_control, fan),
                        "pct": _at(sample.fans_pct, fan),
                    },
                    new=pct,
                    command=self.command,
                    fan=fan,
                    simulated=self.backend.simulated,
                )
            state.taken_over = True
        for fan in range(card.fans):
            try:
                self.backend.control.set_fan_speed(card.index, fan, pct)
            except BaseException as err:
                _settle_refused(entries[fan:], err)
                raise
            _settle(entries[fan], journal.MADE, {"mode": "manual", "pct": pct})
        state.pct = pct

    def restore(self, cards: Sequence[CardFans]) -> list[str]:
        """Every fan of every card back on automatic; returns the failures."""
        failures: list[str] = []
        for card in cards:
            for fan in range(card.fans):
                entry = None
                try:
                    with contextlib.suppress(GpustationError):
                        # The restore must happen even if the journal cannot be written.
                        entry = journal.record(
                            gpu=card.index,
                            uuid=card.uuid,
                            what=journal.FAN_AUTO,
                            previous=self.states.get(card.index, FanState()).pct,
                            new={"mode": "auto"},
                            command=self.command,
                            fan=fan,
                            simulated=self.backend.simulated,
                        )
                    self.backend.control.set_fan_auto(card.index, fan)
                except Exception as err:
                    _settle_refused([entry], err)
                    failures.append(f"GPU {card.index} fan {fan}: {err}")
                    self.log(
                        f"GPU {card.index} fan {fan}: could not return to automatic control: {err}"
                    )
                    continue
                _settle(entry, journal.MADE, {"mode": "auto"})
        return failures


def _settle(entry: journal.JournalEntry | None, outcome: str, read_back: Any = None) -> None:
    if entry is not None:
        journal.settle(entry, outcome, read_back=read_back)


def _settle_refused(entries: Sequence[journal.JournalEntry | None], err: BaseException) -> None:
    """The fan the card refused, and those after it, which were never tried."""
    why = str(err) or type(err).__name__
    for i, entry in enumerate(entries):
        if entry is not None:
            error = why if i == 0 else f"not tried: an earlier fan was refused ({why})"
            journal.settle(entry, journal.REFUSED, error=error)


def _at(values: Sequence[Any], i: int) -> Any:
    return values[i] if i < len(values) else None
