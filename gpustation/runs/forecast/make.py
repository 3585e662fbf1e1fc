"""A forecast made for a planned run: its plan, its preset's history, the model, the price.

The one call the entry points share (``run --dry-run``, the launcher, the
launch form): cheap, a few rows of the run history and the files of the
newest like runs, so a launch can afford it and a form can repeat it as its
fields change (off the UI thread).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpustation.runs.cost import Price
from gpustation.runs.forecast import facts
from gpustation.runs.forecast.model import Forecast, GpuRoom, forecast
from gpustation.runs.forecast.plan import plan_of
from gpustation.runs.presets import RunPreset
from gpustation.runs.store.index import RunStore


def forecast_for(
    preset: RunPreset,
    gpus: Sequence[int],
    rooms: Sequence[GpuRoom] = (),
    *,
    simulated: bool = False,
    price: Price | None = None,
    store: RunStore | None = None,
) -> Forecast:
    """The forecast of ``preset`` (its ``--set`` values applied) on ``gpus``.

    ``rooms``: the GPUs' memory and power limit now (none: no verdict on memory,
    no matching of power limits); ``simulated``: the GPUs are simulated ones.
    """
    plan = plan_of(preset, gpus, rooms, simulated)
    past = facts.history(preset, store)
    return forecast(
        plan,
        past.facts,
        price_per_kwh=None if price is None else price.per_kwh,
        currency=None if price is None else price.currency,
        skipped=past.skipped,
    )
