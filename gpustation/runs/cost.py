"""What runs cost: ``[energy] price_per_kwh`` and ``currency`` from config.toml.

A run's cost is its GPUs' energy times the price; a run without a recorded
energy has no cost (``None``), never 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpustation.config import config_path, section
from gpustation.errors import UsageError
from gpustation.telemetry.format import NA

J_PER_KWH = 3.6e6
#: above any currency's price of a kWh (a few thousand dong or rupiah), so a
#: typo such as 1e308 is named rather than printed as a 300-digit cost
MAX_PRICE_PER_KWH = 1e6


@dataclass(frozen=True)
class Price:
    per_kwh: float
    currency: str

    def cost(self, energy_j: float | None) -> float | None:
        return None if energy_j is None else energy_j / J_PER_KWH * self.per_kwh

    def text(self, energy_j: float | None) -> str:
        """The cost of ``energy_j`` as text (n/a when unknown)."""
        value = self.cost(energy_j)
        return NA if value is None else self.money(value)

    def money(self, value: float) -> str:
        text = f"{value:,.2f}" if value >= 0.01 or value == 0 else "<0.01"
        return f"{text} {self.currency}".rstrip()


def load_price(path: Path | None = None) -> Price | None:
    """The configured price, or None when ``[energy]`` names none."""
    path = path or config_path()
    table = section("energy", path)
    if not table:
        return None
    unknown = sorted(set(table) - {"price_per_kwh", "currency"})
    price = table.get("price_per_kwh")
    currency = table.get("currency", "")
    problems = []
    if price is None:
        problems.append("price_per_kwh is missing (e.g. price_per_kwh = 0.30)")
    elif (
        isinstance(price, bool)
        or not isinstance(price, (int, float))
        or not (math.isfinite(price) and 0 <= price <= MAX_PRICE_PER_KWH)
    ):
        problems.append(
            f"price_per_kwh must be a number from 0 to {MAX_PRICE_PER_KWH:,.0f}"
            f" (e.g. price_per_kwh = 0.30), not {price!r}"
        )
    if not isinstance(currency, str) or len(currency) > 8:
        problems.append('currency must be a short text such as "EUR"')
    if unknown:
        problems.append(f"unknown key(s): {', '.join(unknown)}")
    if problems:
        raise UsageError(f"{path} [energy]: " + "; ".join(problems))
    assert isinstance(price, (int, float))
    return Price(float(price), str(currency))


def price_or_none(warn: Callable[[str], None]) -> Price | None:
    """The configured price for a view that shows costs beside other figures:
    a bad ``[energy]`` table is passed to ``warn`` and the view goes on
    without costs, so a typo in the price never hides the run history."""
    try:
        return load_price()
    except UsageError as err:
        warn(f"{err}; no cost is shown")
        return None
