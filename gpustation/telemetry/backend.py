"""The backend interface: what NVML, the simulator and tests all provide.

A backend reads GPUs into :class:`GpuSample` objects; the :class:`Control`
it owns carries out the few control operations gpustation needs. Renderers never talk to a backend
directly; they read :class:`~gpustation.telemetry.model.Snapshot` objects built
by :class:`~gpustation.telemetry.sampler.Sampler`.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from gpustation.errors import UsageError
from gpustation.telemetry.model import GpuSample, NamedVersion, Topology
from gpustation.telemetry.slotted import record


class Control(ABC):
    """The few changes gpustation makes to the cards: the power limit and the fans.

    Only ``gpustation.control`` calls these; they raise NeedsRootError,
    NotSupportedError or GpustationError with a message for the user.
    """

    @abstractmethod
    def set_power_limit(self, index: int, watts: float) -> None: ...

    @abstractmethod
    def fan_count(self, index: int) -> int: ...

    @abstractmethod
    def fan_speed_range(self, index: int) -> tuple[int, int]:
        """The lowest and highest fan % the card accepts."""

    @abstractmethod
    def set_fan_speed(self, index: int, fan: int, pct: int) -> None: ...

    @abstractmethod
    def set_fan_auto(self, index: int, fan: int) -> None: ...


class Backend(ABC):
    """A source of GPU samples; its :class:`Control` (``control``) changes the cards."""

    #: Set by each backend when it opens.
    control: Control
    simulated: bool = False
    #: Why this backend is in use, when that is worth telling the user.
    note: str | None = None
    #: What was reused from the last run rather than asked for (a simulated
    #: machine), said on screen or on stderr so a flag's default never surprises.
    kept: str | None = None
    #: Read the energy counter with the slow fields. Each read costs the driver
    #: CPU time, so a reader that never shows it (the dashboard) turns it off;
    #: ``energy_j`` is then ``None``.
    read_energy: bool = True
    #: Read the uncorrected-ECC counter with the fast fields. Its first read in
    #: a process is slow, so the snapshot table, which does not print it, turns
    #: it off; ``ecc_uncorrected`` is then ``None``.
    read_ecc: bool = True
    #: Read the profiling metrics (GPM: SM, tensor and DRAM activity) on each
    #: read. They cost two driver samples per read, so they are read only while
    #: asked for: the dashboard sets it while a card that shows them is on
    #: screen or a run is live; ``snapshot --json`` and the exporter set it.
    #: Off, the GPM fields are ``None``.
    read_gpm: bool = False

    @abstractmethod
    def device_count(self) -> int: ...

    @abstractmethod
    def read_gpus(self, indices: Sequence[int], slow: bool) -> list[GpuSample]:
        """Read the given GPUs.

        ``slow`` asks for the slow fields (PCIe throughput, energy, replay
        counter) to be read now; otherwise their last values are reused.
        """

    @abstractmethod
    def topology(self, indices: Sequence[int]) -> Topology: ...

    def driver_version(self) -> str | None:
        return None

    def library_version(self) -> NamedVersion | None:
        """The library the cards are read through, and its version (NVML 13.580...)."""
        return None

    def compute_runtime_version(self) -> NamedVersion | None:
        """The newest compute runtime the driver supports (CUDA 13.0)."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@record(frozen=True)
class OpenRequest:
    """What the user asked for when opening a backend."""

    #: simulated GPUs: a count, ``-1`` for the default machine, None for real ones
    simulate: int | None = None
    sim_card: str | None = None
    #: the caller reads once and leaves: static values may come from a cache
    one_shot: bool = False


@record(frozen=True)
class Registration:
    """How a backend is found and opened.

    ``wanted`` says whether a request may be served by this backend;
    ``module`` names the module whose ``open_request(request)`` opens it,
    imported only when it is tried, or raises ``NoDriverError`` when its
    hardware or library is absent. Backends are tried by ``priority``, lowest
    first. ``stand_in``: it may replace the others when none opens and the
    caller allows it (the simulator).
    """

    name: str
    priority: int
    wanted: Callable[[OpenRequest], bool]
    module: str
    stand_in: bool = False


#: the highest GPU index ``--gpus`` takes (NVML numbers far fewer)
MAX_GPU_INDEX = 1023


def parse_gpu_list(text: str | None) -> list[int] | None:
    """Parse ``--gpus 0,2`` (also ``0-3``); ``None`` means all GPUs.

    Every part must name at least one GPU: a reversed range (``3-1``) or an
    empty part is refused, never read as "no GPUs".
    """
    if text is None or text.strip() in ("", "all"):
        return None
    result: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            lo_text, dash, hi_text = part.partition("-")
            lo = int(lo_text)
            hi = int(hi_text) if dash else lo
        except ValueError:
            raise UsageError(
                f"{text!r} is not a list of GPU indices (expected e.g. 0,2 or 0-3)", field="gpus"
            ) from None
        if lo < 0 or hi < 0:
            raise UsageError(f"GPU indices are 0 or more, got {text!r}", field="gpus")
        if hi < lo:
            raise UsageError(f"{part!r} runs backwards; write {hi}-{lo}", field="gpus")
        if hi > MAX_GPU_INDEX:
            raise UsageError(f"{hi} is not a GPU index (at most {MAX_GPU_INDEX})", field="gpus")
        result.extend(range(lo, hi + 1))
    return sorted(dict.fromkeys(result))


def simulate_from_env() -> int | None:
    """``GPUSTATION_SIMULATE``: a count of simulated GPUs (``-1``: the default
    machine), None when unset; UsageError for anything else."""
    raw = os.environ.get("GPUSTATION_SIMULATE", "").strip()
    if not raw:
        return None
    if raw.lower() in ("1", "yes", "true", "on") and not raw.isdigit():
        return -1
    try:
        count = int(raw)
    except ValueError:
        raise UsageError(
            f"GPUSTATION_SIMULATE={raw!r}: a number of simulated GPUs (e.g. 2), or unset it"
        ) from None
    if count < 0:
        raise UsageError(f"GPUSTATION_SIMULATE={raw!r}: a number of simulated GPUs, 1 or more")
    return count


def select_gpus(backend: Backend, wanted: list[int] | None) -> list[int]:
    """Check ``--gpus`` against what the backend has."""
    count = backend.device_count()
    if wanted is None:
        return list(range(count))
    missing = [i for i in wanted if i >= count]
    if missing:
        have = f"0-{count - 1}" if count > 1 else ("0" if count == 1 else "none")
        raise UsageError(
            f"no GPU {', '.join(map(str, missing))} on this machine (GPUs: {have})", field="gpus"
        )
    return wanted
