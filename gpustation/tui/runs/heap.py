"""Keeping full garbage collections short once the runs screen is up."""

from __future__ import annotations

import gc


def freeze_heap() -> bool:
    """Collect, then move every object alive now out of the collector's sight (once).

    A full collection walks every tracked object, and with the dashboard and
    the runs screen built there are enough of them to stall a key pressed during a
    log flood (``bench/log_flood.py``; figures in ``bench/RESULTS.md``). The
    screens, widgets, modules and stylesheets alive at this point live as long
    as the app, so freezing them costs nothing and leaves later full
    collections only the objects made since (dialogs, rows, render caches).
    Returns False when the heap was already frozen.
    """
    if gc.get_freeze_count():
        return False
    gc.collect()
    gc.freeze()
    return True
