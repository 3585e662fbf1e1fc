"""The simulated machine last opened, reused by a ``--simulate`` without N or ``--sim-card``.

Kept apart from the simulator and its card data so that ``--help`` can say
what the default is without loading either.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from gpustation import private
from gpustation.errors import UsageError
from gpustation.files import read_text
from gpustation.paths import state_dir

#: The machine last opened (card and count).
LAST_MACHINE_FILE = "sim-last.json"

#: The simulated cards (``sim_cards.CARDS`` holds their data) and what is
#: simulated when nothing is asked for and nothing was simulated before.
CARD_KEYS = ("rtx4090", "h200")
DEFAULT_COUNT = 2
DEFAULT_CARD = "rtx4090"


def last_machine() -> tuple[int | None, str | None]:
    """The count and card last simulated, each None when none is on record."""

    last: Any = {}
    with contextlib.suppress(UsageError, ValueError, RecursionError):
        last = json.loads(read_text(state_dir() / LAST_MACHINE_FILE, "simulator state"))
    if not isinstance(last, dict):
        return None, None
    count = last.get("count")
    card = last.get("card")
    return (
        count if type(count) is int and 1 <= count <= 16 else None,
        card if isinstance(card, str) and card in CARD_KEYS else None,
    )


def remember_machine(count: int, card: str) -> None:
    """Record the machine opened, for the next ``--simulate`` that names no count or card."""

    if last_machine() == (count, card):
        return
    path = state_dir() / LAST_MACHINE_FILE
    with contextlib.suppress(OSError):
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        private.write_text(tmp, json.dumps({"card": card, "count": count}))
        os.replace(tmp, path)


def default_count() -> int:
    """What ``--simulate`` without N opens: the count last simulated, else the built-in one."""
    return last_machine()[0] or DEFAULT_COUNT


def default_card() -> str:
    """What a missing ``--sim-card`` opens: the card last simulated, else the built-in one."""
    return last_machine()[1] or DEFAULT_CARD


def kept_note(count: int, card: str, label: str, count_kept: bool, card_kept: bool) -> str | None:
    """What was reused from last time, said to the user (None when nothing
    differs from the built-in defaults, so the usual case stays quiet); ``label``
    is the card's short name (``sim_cards.card_label``)."""
    flags = []
    if count_kept and count != DEFAULT_COUNT:
        flags.append("--simulate N")
    if card_kept and card != DEFAULT_CARD:
        flags.append("--sim-card")
    if not flags:
        return None
    return f"{count} simulated {label}, as last time; {' or '.join(flags)} to change"
