"""What a simulated GPU's saved state holds, and the check every read of it passes.

The simulator keeps its cards in a JSON file other processes (and people)
can edit; :func:`gpu_state_ok` checks each value's type and range where the
file is read, so a hand-edited or foreign file starts the machine afresh
instead of crashing a read or showing an impossible figure.
"""

from __future__ import annotations

import math
from typing import Any

from gpustation.telemetry.sim_cards import CardSpec

AMBIENT_C = 30.0


def new_gpu_state(spec: CardSpec) -> dict[str, Any]:
    return {
        "power_limit_w": spec.power_default_w,
        "fan_mode": ["auto"] * spec.fans,
        "fan_manual_pct": [float(spec.fan_min_pct)] * spec.fans,
        "temperature_c": AMBIENT_C + spec.power_idle_w * spec.thermal_r,
        "energy_j": 0.0,
        "load": None,  # None: follow the job schedule; 0..1: pinned
        "ambient_c": AMBIENT_C,
        "lost": False,
        "ecc_uncorrected": 0 if spec.ecc else None,
        "temperature_fails": False,
        "xid": [],  # [time, code] of each XID poked in, oldest first
        "idle_holder_mib": None,  # MiB a process holds whatever the load (None: none)
        # VRAM no listed process holds, and [pid, command] of each process
        # holding the device node open without a context (both poked in)
        "orphaned_mib": 0.0,
        "holders": [],
        # [pid, SM %, MiB] of each real process poked onto the card
        "guests": [],
        # the PCIe link poked down (a gen or width the link trained to; None: the card's own)
        "pcie_gen": None,
        "pcie_width": None,
        # derived each step, kept for readers
        "power_w": spec.power_idle_w,
        "fans_pct": [float(spec.fan_min_pct)] * spec.fans,
        "throttle": [],
        "clock_sm_mhz": spec.clock_sm_idle_mhz,
        "load_now": 0.0,
    }


_NULLABLE = frozenset({"load", "ecc_uncorrected", "idle_holder_mib", "pcie_gen", "pcie_width"})


def _ranges(spec: CardSpec) -> dict[str, tuple[float, float]]:
    """What each number in a GPU's state may be: a state file edited by hand
    (a -100 W limit, Infinity, a load of 50) is started afresh, never shown."""
    pct = (0.0, 100.0)
    return {
        "power_limit_w": (spec.power_min_w, spec.power_max_w),
        "fan_manual_pct": pct,
        "fans_pct": pct,
        "temperature_c": (-40.0, 300.0),
        "ambient_c": (-40.0, 150.0),
        "energy_j": (0.0, math.inf),
        "load": (0.0, 1.0),
        "load_now": (0.0, 1.0),
        "ecc_uncorrected": (0.0, 1e12),
        "idle_holder_mib": (0.0, spec.memory_total_mib),
        "orphaned_mib": (0.0, spec.memory_total_mib),
        "power_w": (0.0, 10.0 * spec.power_max_w),
        "clock_sm_mhz": (0.0, spec.clock_sm_max_mhz),
        "pcie_gen": (1.0, float(spec.pcie_max_gen)),
        "pcie_width": (1.0, 16.0),
    }


def _in_range(value: Any, bounds: tuple[float, float]) -> bool:
    low, high = bounds
    values = value if isinstance(value, list) else [value]
    return all(
        not isinstance(v, bool)
        and isinstance(v, (int, float))
        and math.isfinite(v)
        and low <= v <= high
        for v in values
    )


def _xid_ok(entry: Any) -> bool:
    """An XID entry is [time, code]: a finite time and a small whole code."""
    return (
        isinstance(entry, list)
        and len(entry) == 2
        and not isinstance(entry[0], bool)
        and isinstance(entry[0], (int, float))
        and math.isfinite(entry[0])
        and type(entry[1]) is int
        and 0 <= entry[1] < 1 << 16
    )


def gpu_state_ok(g: Any, spec: CardSpec) -> bool:
    """One GPU's saved state has every key, each of the type (and list length)
    a fresh one has: a hand-edited or foreign file never crashes a read."""
    fresh = new_gpu_state(spec)
    # a state saved before guests or a poked link were simulated has none
    if isinstance(g, dict):
        g.setdefault("guests", [])
        g.setdefault("pcie_gen", None)
        g.setdefault("pcie_width", None)
    if not isinstance(g, dict) or not fresh.keys() <= g.keys():
        return False
    for key, template in fresh.items():
        value = g[key]
        if value is None and key in _NULLABLE:
            continue
        if isinstance(template, bool) or isinstance(value, bool):
            if type(value) is not type(template) and key not in _NULLABLE:
                return False
            continue
        if isinstance(template, (int, float)) or key in _NULLABLE:
            if not isinstance(value, (int, float)) or value != value:  # NaN is not a state
                return False
        elif isinstance(template, list):
            # one entry per fan; the throttle reasons come and go
            fixed = key.startswith("fan")
            if not isinstance(value, list) or (fixed and len(value) != len(template)):
                return False
            if key == "holders" and not all(_holder_ok(h) for h in value):
                return False
            if key == "xid" and not all(_xid_ok(x) for x in value):
                return False
            if key == "guests" and not all(_guest_ok(x) for x in value):
                return False
        elif not isinstance(value, type(template)):
            return False
    bounds = _ranges(spec)
    return all(
        g[key] is None or _in_range(g[key], limits) for key, limits in bounds.items() if key in g
    )


def serials_ok(serials: Any, count: int) -> bool:
    return isinstance(serials, list) and sorted(serials) == list(range(count))


def _holder_ok(holder: Any) -> bool:
    return (
        isinstance(holder, list)
        and len(holder) == 2
        and type(holder[0]) is int
        and isinstance(holder[1], str)
    )


def _guest_ok(guest: Any) -> bool:
    """A guest is [pid, SM %, MiB]: a whole PID, a share of 0-100 and memory of 0 or more."""
    return (
        isinstance(guest, list)
        and len(guest) == 3
        and type(guest[0]) is int
        and guest[0] > 0
        and _in_range(guest[1], (0.0, 100.0))
        and _in_range(guest[2], (0.0, 1e9))
    )
