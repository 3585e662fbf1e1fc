"""Why a run slowed down, named while it happens.

The run's supervisor feeds the run's throughput (``detect``) and what its GPUs
and the host were doing (``evidence``) to a watch (``watch``); when the
throughput stays well below the run's own steady level, the evidence names the
cause (``cause``, from the ``clues`` by the ``gpu_rules`` and ``run_rules``)
and the watch writes it to ``slowdowns.jsonl`` in the run directory
(``records``), which every reader folds: ``runs show`` (``show``),
``gpustation run`` and the runs screen. ``[slowdown]`` in config.toml sets the
thresholds (``settings``).
"""
