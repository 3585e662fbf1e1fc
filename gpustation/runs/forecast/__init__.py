"""Forecasts of a run before it starts: its time, GPU energy, cost and peak memory.

``facts.py`` reads what past runs of the same preset say about themselves,
``plan.py`` what the run about to start is, ``model.py`` (pure) carries the
one to the other with the lines of ``fit.py``, ``make.py`` puts them together
for the entry points, ``probe.py`` runs a preset for a few steps to have
history, and ``text.py`` words the result. Headless: no textual, no torch.
"""
