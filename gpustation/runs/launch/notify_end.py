"""The notification of a run's end: finished, failed or out of memory, with its
final loss, duration, energy and cost in the message.

Sent by the supervisor once the end is recorded; anything that goes wrong
here is logged by the notifier and never changes the run's outcome.
"""

from __future__ import annotations

from pathlib import Path

from gpustation.notify import notifier_from_config
from gpustation.runs.rundir import RunState
from gpustation.runs.summary import RunSummary
from gpustation.telemetry.format import duration


def message(
    state: RunState, run: RunSummary | None, price_text: str | None
) -> tuple[str, str, str]:
    """(event, title, body) for a run that has ended."""
    event = (
        "run_oom" if state.oom else "run_finished" if state.status == "succeeded" else "run_failed"
    )
    name = run.preset if run is not None and run.preset else state.id
    title = f"gpustation: {name} {'ran out of memory' if state.oom else state.status}"
    parts = [f"run {state.id}"]
    if state.started_at and state.ended_at:
        parts.append(f"after {duration(int(max(0, state.ended_at - state.started_at)))}")
    if state.reason and state.status != "succeeded":
        parts.append(state.reason)
    if run is not None:
        if run.final_loss is not None:
            parts.append(f"final loss {run.final_loss:.4g}")
        if run.energy_j is not None:
            energy = f"GPU energy {run.energy_j / 3600:.1f} Wh"
            parts.append(f"{energy} SIMULATED" if run.simulated else energy)
    if price_text:
        simulated = run is not None and run.simulated
        parts.append(f"cost {price_text}" + (" SIMULATED" if simulated else ""))
    return event, title, "; ".join(parts)


def notify_end(directory: Path, state: RunState) -> None:
    notifier = notifier_from_config()
    if notifier is None:
        return
    run: RunSummary | None = None
    price_text = None
    try:
        # guarded: a failure here never changes the run's outcome
        from gpustation.runs.cost import load_price
        from gpustation.runs.store.index import record_from_dir

        run = record_from_dir(directory, state)
        price = load_price()
        if price is not None and run.energy_j is not None:
            price_text = price.text(run.energy_j)
    except Exception:
        pass  # the message goes out with what is known
    event, title, body = message(state, run, price_text)
    notifier.send(event, title, body)
