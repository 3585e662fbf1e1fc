"""Opening a backend: the registered backends, tried in priority order.

The registry sits above the interface (``telemetry/backend.py``) and the
backends, which import only the interface, so no backend and the interface
ever import each other. A backend is imported only when it is tried: a
snapshot of real GPUs never loads the simulator. A second vendor's backend is
one more :class:`Registration` (here, or through :func:`register`).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from gpustation.errors import NoDriverError
from gpustation.telemetry.backend import Backend, OpenRequest, Registration, simulate_from_env

_REGISTERED: list[Registration] = [
    # Asked for by --simulate (or GPUSTATION_SIMULATE); stands in for absent GPUs.
    Registration(
        name="sim",
        priority=10,
        wanted=lambda request: request.simulate is not None,
        module="gpustation.telemetry.sim",
        stand_in=True,
    ),
    # Real NVIDIA GPUs, unless simulated ones were asked for.
    Registration(
        name="nvml",
        priority=20,
        wanted=lambda request: request.simulate is None,
        module="gpustation.telemetry.nvml.backend",
    ),
]


def register(registration: Registration) -> None:
    """Add a backend (a second vendor, a test's own)."""
    _REGISTERED.append(registration)


def registrations() -> list[Registration]:
    """Every registered backend, the first to try first."""
    return sorted(_REGISTERED, key=lambda r: r.priority)


def _open(registration: Registration, request: OpenRequest) -> Backend:
    module: Any = importlib.import_module(registration.module)
    backend: Backend = module.open_request(request)
    return backend


def open_backend(
    simulate: int | None = None,
    sim_card: str | None = None,
    fallback_to_sim: bool = False,
    one_shot: bool = False,
) -> Backend:
    """Open the first backend that serves the request; the simulator when
    none opens and ``fallback_to_sim`` allows it.

    ``simulate`` is the number of simulated GPUs, ``-1`` for the default, and
    ``None`` for real GPUs. ``one_shot`` says the caller will read once and
    leave (``gpustation snapshot``): static values may then come from the
    cache of the last run. The environment variable ``GPUSTATION_SIMULATE``
    does the same as ``--simulate`` (handy under ssh and in tests).
    """
    if simulate is None:
        simulate = simulate_from_env()
    if sim_card is None:
        sim_card = os.environ.get("GPUSTATION_SIM_CARD") or None
    request = OpenRequest(simulate=simulate, sim_card=sim_card, one_shot=one_shot)
    regs = registrations()
    failure: NoDriverError | None = None
    for reg in regs:
        if not reg.wanted(request):
            continue
        try:
            return _open(reg, request)
        except NoDriverError as err:
            failure = failure or err
    if failure is None:
        failure = NoDriverError("no GPU backend serves this request")
    if not fallback_to_sim:
        raise failure
    stand_in = next(r for r in regs if r.stand_in)
    backend = _open(stand_in, OpenRequest(simulate=-1, sim_card=sim_card, one_shot=one_shot))
    backend.note = f"{failure} Showing simulated GPUs."
    return backend
