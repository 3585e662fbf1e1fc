"""The shipped workloads ("runners") and the contract every one of them keeps.

A runner is a module ``gpustation.runners.NAME`` that the launcher starts as a
child process with ``python -m gpustation.runners.NAME ARGS`` (under torchrun
or accelerate for data-parallel runs). It talks to gpustation only through
files: stdout becomes the run's ``output.log`` and metrics go to the file named
by ``$GPUSTATION_METRICS_FILE``. Each runner module provides:

``build_parser() -> argparse.ArgumentParser``
    Every argument the runner takes. Presets, ``--set key=value`` and the
    launch form are checked against it, so it is the runner's whole interface.
    It is called with no arguments (a runner whose options depend on a choice
    gives that choice a default).

``main(args: argparse.Namespace) -> int``
    The work itself, given the parsed arguments; returns the exit status.

``cli(argv: Sequence[str] | None = None) -> int``
    ``common.run_main(main, build_parser(), argv)``: parses ``argv``, runs
    ``main`` and turns failures into a message and an exit status. The module
    ends with ``if __name__ == "__main__": sys.exit(cli())``.

and keeps these rules:

- It reports through the metrics protocol with
  :class:`gpustation.runs.metrics.MetricsWriter` (``MetricsWriter.from_env()``,
  which writes nothing outside a gpustation run or on ranks other than 0):
  ``step``/``loss``/``throughput``/``total_steps`` while it runs, one
  ``summary`` at the end.
- It uses the shared argument names of :data:`SHARED_OPTIONS`, with the meaning
  given there, for whichever of them apply to it (``common.make_parser`` and
  ``common.add_training_args`` add most of them).
- It exits :data:`EXIT_OOM` when it runs out of memory, after printing what to
  try and logging an ``{"error": "out_of_memory"}`` event: ``common.run_main``
  does this for any out-of-memory error that leaves ``main``. A runner with a
  step loop calls ``common.maybe_simulate_oom(args, step)`` in it, so the
  hidden ``--simulate-oom-at-step N`` makes that path testable on a CPU.
- It imports neither textual nor ``gpustation.tui``, and no other part of
  gpustation imports it: torch stays in the child process.

What the runners share lives in :mod:`gpustation.runners.lib`;
:func:`runner_names` lists the modules here, each a runner. This module
imports nothing heavy, so the preset loader can ask it which runners exist.
"""

from __future__ import annotations

import pkgutil

# Exit status of a runner that ran out of memory: EX_TEMPFAIL in sysexits.h,
# "try again later", fits "retry with a smaller batch". The gpustation CLI uses 3-6.
EXIT_OOM = 75


# The argument names runners share, and what each means in every runner that has it.
SHARED_OPTIONS: dict[str, str] = {
    "--steps": "how many steps to run (an integer; training runners: optimizer steps)",
    "--batch-size": "samples per step per process (an integer)",
    "--precision": "one of fp32, tf32, fp16, bf16",
    "--seed": "random seed (an integer, default 0)",
    "--device": "cuda or cpu (default: cuda when available)",
    "--compile": "torch.compile the model (--compile / --no-compile)",
    "--model": "which model: a name or a local checkpoint directory",
    "--data": "a local dataset path (default: data built on the spot, never downloaded)",
    "--output-dir": "where results are saved (default: the run directory)",
}


def runner_names() -> list[str]:
    """The runner modules of this package, sorted, found on disk without importing them."""
    return sorted(
        info.name
        for info in pkgutil.iter_modules(__path__)
        if not info.ispkg and not info.name.startswith("_")
    )
