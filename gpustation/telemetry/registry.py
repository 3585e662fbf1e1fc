"""Opening a backend: each backend declares a :class:`Registration`, this
module tries them in priority order.

The registry sits above the interface (``telemetry/backend.py``) and the
backends, which import only the interface, so no backend package and the
interface ever import each other. A second vendor adds its module to
``BACKENDS``.
"""

from __future__ import annotations

import importlib
import os

from gpustation.errors import NoDriverError
from gpustation.telemetry.backend import Backend, OpenRequest, Registration, simulate_from_env

#: The modules that declare a ``REGISTRATION``.
BACKENDS = ("gpustation.telemetry.sim", "gpustation.telemetry.nvml.backend")


def registrations() -> list[Registration]:
    """Every backend's registration, the first to try first."""
    found = [importlib.import_module(name).REGISTRATION for name in BACKENDS]
    return sorted(found, key=lambda r: r.priority)


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
            return reg.open(request)
        except NoDriverError as err:
            failure = failure or err
    if failure is None:
        failure = NoDriverError("no GPU backend serves this request")
    if not fallback_to_sim:
        raise failure
    stand_in = next(r for r in regs if r.stand_in)
    backend = stand_in.open(OpenRequest(simulate=-1, sim_card=sim_card, one_shot=one_shot))
    backend.note = f"{failure} Showing simulated GPUs."
    return backend
