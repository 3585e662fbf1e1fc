"""Read-only dashboards: everything is shown, nothing on the machine is changed.

A dashboard started with ``--read-only`` (as every one ``gpustation web``
serves without ``--allow-control`` is) refuses each action that changes
something: a signal to a process, a power limit, the fans, a profile, launching
or stopping a run. The actions themselves ask :func:`refused` before they do
anything, so a key, a remapped key and the command palette are refused alike.
"""

from __future__ import annotations

from typing import Any

from textual.app import App

HOW_TO_ALLOW = "start gpustation web with --allow-control (or gpustation without --read-only)"


def refused(app: App[Any], what: str) -> bool:
    """True, and said on screen, when ``app`` is read-only: the caller then does nothing.

    ``what`` names the refused thing in the plural ("signals to processes").
    """
    if not getattr(app, "read_only", False):
        return False
    app.notify(
        f"read-only: no {what} from this dashboard; {HOW_TO_ALLOW}",
        title="Read-only",
        severity="warning",
        timeout=8,
    )
    return True
