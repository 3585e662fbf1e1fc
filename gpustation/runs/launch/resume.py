"""``gpustation run --resume RUN_ID``: a new run that continues an old one from its
last complete checkpoint.

The new run takes the old run's preset as it was launched (runner, launcher,
GPUs, every argument, so the model and adapter shapes match), with
``resume_from`` set to the checkpoint; ``--set`` changes what it should
(``steps`` above the checkpoint's step, to train on). It writes to a run
directory of its own, and its ``run.json`` says which run and step it
resumed from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpustation.errors import UsageError
from gpustation.redact import REDACTED
from gpustation.runs import rundir
from gpustation.runs.argvalue import ArgValue
from gpustation.runs.checkpoints import CHECKPOINTS_DIR, Checkpoint, latest_checkpoint
from gpustation.runs.presets import RunPreset, apply_values, load_presets
from gpustation.runs.store.index import RunStore

#: runners whose runs leave checkpoints that ``--resume-from`` takes
RESUMABLE_RUNNERS = ("lora",)
#: the runner's own default of --steps, for an old run whose preset did not set it
_DEFAULT_STEPS = {"lora": 200}


@dataclass(frozen=True)
class ResumePlan:
    """What a resumed run starts from."""

    run_id: str
    run_dir: Path
    checkpoint: Checkpoint
    #: the old run's preset, ``resume_from`` set (``--set`` overrides not yet applied)
    preset: RunPreset
    warnings: tuple[str, ...] = ()

    def resumed_from(self) -> dict[str, Any]:
        """What the new run's ``run.json`` records of where it came from."""
        return {
            "run": self.run_id,
            "step": self.checkpoint.step,
            "checkpoint": str(self.checkpoint.path),
        }


def plan_resume(
    text: str,
    overrides: Mapping[str, ArgValue] | None = None,
    preset_name: str | None = None,
    store: RunStore | None = None,
) -> ResumePlan:
    """Resolve ``text`` (a run id, a unique part of one, or ``last``) to a run that can be
    resumed and its last complete checkpoint; a UsageError says why one cannot."""
    store = store or RunStore()
    run_id = store.resolve_id(text)
    record = store.get(run_id)
    directory = Path(record.run_dir) if record and record.run_dir else rundir.run_dir(run_id)
    run = rundir.read_run(directory, exact=True)
    if run is None or not isinstance(run.get("preset"), dict):
        raise UsageError(f"--resume {text}: run {run_id} has no readable {rundir.RUN_JSON}")
    preset = RunPreset.from_dict(run["preset"])
    preset, env_warnings = _restore_env(preset, run_id)
    if preset.runner not in RESUMABLE_RUNNERS:
        what = f"the {preset.runner} runner" if preset.runner else "a command"
        raise UsageError(
            f"--resume {text}: run {run_id} ran {what}; only runs of the LoRA runner "
            f"({', '.join(RESUMABLE_RUNNERS)}) leave checkpoints to resume from"
        )
    if preset_name is not None and preset_name not in (preset.name, preset.runner):
        raise UsageError(
            f"--resume {text}: run {run_id} ran preset {preset.name!r}, not {preset_name!r}; "
            f"leave the preset out (gpustation run --resume {run_id}) or give {preset.name!r}"
        )
    out = _output_dir(run, preset, directory)
    ckpt = latest_checkpoint(out)
    if ckpt is None:
        raise UsageError(
            f"--resume {text}: run {run_id} left no complete checkpoint in "
            f"{out / CHECKPOINTS_DIR} (it ended before its first one, or ran with "
            f"keep_checkpoints = 0); start it afresh with gpustation run {preset.name}"
        )
    args = {k: v for k, v in preset.args.items() if k not in ("resume_from", "output_dir")}
    args["resume_from"] = str(ckpt.path)
    resumed = replace(preset, args=args)
    steps = apply_values(resumed, overrides or {})[0].args.get("steps")
    if steps is None:
        steps = _DEFAULT_STEPS.get(preset.runner or "", 0)
    if isinstance(steps, str) and steps.strip().isdigit():
        steps = int(steps)  # a shared option --set on a preset without it stays text
    if not isinstance(steps, int) or isinstance(steps, bool) or steps <= ckpt.step:
        raise UsageError(
            f"--resume {text}: the last checkpoint of run {run_id} is at step {ckpt.step} "
            f"and the new run would stop at step {steps}: nothing is left to train; ask for "
            f"more with --set steps={2 * ckpt.step}"
        )
    warnings = list(env_warnings)
    if record is not None and record.active:
        warnings.append(
            f"run {run_id} is still {record.status}: resuming from its checkpoint at step "
            f"{ckpt.step} while it goes on"
        )
    return ResumePlan(run_id, directory, ckpt, resumed, tuple(warnings))


def _restore_env(preset: RunPreset, run_id: str) -> tuple[RunPreset, list[str]]:
    """The old run's ``[env]`` with the values run.json leaves out taken from
    today's preset of the same name; those it has not are left out, and said."""
    hidden = [k for k, v in preset.env.items() if v == REDACTED]
    if not hidden:
        return preset, []

    today = load_presets()[0].get(preset.name)
    source = today.env if today is not None else {}
    env = {k: v for k, v in preset.env.items() if v != REDACTED}
    env.update({k: source[k] for k in hidden if k in source})
    missing = [k for k in hidden if k not in source]
    warnings = []
    if missing:
        warnings.append(
            f"run {run_id} set {', '.join(missing)}, whose values are not kept in its "
            f"{rundir.RUN_JSON} and which preset {preset.name!r} no longer sets: the "
            "resumed run starts without them"
        )
    return replace(preset, env=env), warnings


def _output_dir(run: dict[str, Any], preset: RunPreset, directory: Path) -> Path:
    """Where the old run's runner saved: its --output-dir (relative to the run's cwd) or
    the run directory."""
    given = preset.args.get("output_dir")
    if not isinstance(given, str) or not given:
        return directory
    path = Path(given)
    return path if path.is_absolute() else Path(run.get("cwd") or directory) / path
