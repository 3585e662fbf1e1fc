"""Feeding gpustation's metrics protocol from Hugging Face Trainer and Accelerate.

Both write through :class:`gpustation.runs.metrics.MetricsWriter`, so they do
nothing outside a gpustation run (no ``GPUSTATION_METRICS_FILE``) and nothing
on ranks other than 0::

    from gpustation.runners.lib.integrations import GpustationCallback
    trainer = Trainer(..., callbacks=[GpustationCallback(unit="tokens/s", tokens_per_sample=512)])

    from gpustation.runners.lib.integrations import GpustationTracker
    accelerator = Accelerator(log_with=[GpustationTracker()])
    accelerator.log({"loss": loss.item(), "lr": lr}, step=step)

transformers and accelerate are imported when a class is first asked for
(``from ... import GpustationCallback``), so importing this module costs nothing.
"""

from __future__ import annotations

import math
import signal
import time
from typing import Any

from gpustation.runs.metrics import MetricsWriter

# Hugging Face log keys -> protocol keys.
_HF_KEYS = {
    "loss": "loss",
    "train_loss": "loss",
    "eval_loss": "eval_loss",
    "learning_rate": "lr",
    "lr": "lr",
    "grad_norm": "grad_norm",
    "epoch": "epoch",
}


def _peak_memory_mib() -> float | None:
    try:
        # optional extra 'train'
        import torch

        if torch.cuda.is_available():
            return torch.cuda.max_memory_allocated() / 2**20
    except Exception:
        return None
    return None


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class _CallbackImpl:
    """The body of :class:`GpustationCallback` (see there)."""

    def __init__(
        self,
        writer: MetricsWriter | None = None,
        unit: str = "samples/s",
        tokens_per_sample: int | None = None,
        stop_on_sigint: bool = True,
    ) -> None:
        self.writer = writer
        self.unit = unit
        self.tokens_per_sample = tokens_per_sample
        self.stop_on_sigint = stop_on_sigint
        self._last: tuple[float, int] | None = None
        self._stop_asked = 0
        self._previous_handler: Any = None

    # ---- helpers -----------------------------------------------------------------
    def _samples_per_step(self, args: Any) -> int:
        world = int(getattr(args, "world_size", 1) or 1)
        per_device = int(getattr(args, "per_device_train_batch_size", 1) or 1)
        accumulation = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
        return per_device * accumulation * world

    def _on_sigint(self, signum: int, frame: Any) -> None:
        self._stop_asked += 1
        if self._stop_asked > 1:
            # A second Ctrl-C (or gpustation's SIGTERM after its grace) means now.
            raise KeyboardInterrupt

    # ---- TrainerCallback hooks -------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.writer is None:
            rank = 0 if state.is_world_process_zero else 1
            self.writer = MetricsWriter.from_env(rank=rank)
        self._last = (time.monotonic(), int(state.global_step))
        if self.stop_on_sigint:
            try:
                self._previous_handler = signal.signal(signal.SIGINT, self._on_sigint)
            except ValueError:  # not the main thread
                self._previous_handler = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._stop_asked:
            # Stop at a step boundary and save, as a user pressing Ctrl-C wants.
            control.should_training_stop = True
            control.should_save = True

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        if self.writer is None or not logs or not state.is_world_process_zero:
            return
        event: dict[str, Any] = {}
        for key, value in logs.items():
            mapped = _HF_KEYS.get(key)
            number = _number(value)
            if mapped and number is not None:
                event[mapped] = number
        step = int(state.global_step)
        if state.max_steps and state.max_steps > 0:
            event["total_steps"] = int(state.max_steps)
        now = time.monotonic()
        if self._last is not None and step > self._last[1] and now > self._last[0]:
            samples = (step - self._last[1]) * self._samples_per_step(args)
            rate = samples / (now - self._last[0])
            if self.tokens_per_sample and self.unit.startswith("token"):
                rate *= self.tokens_per_sample
            event["throughput"] = round(rate, 3)
            event["unit"] = self.unit
            self._last = (now, step)
        peak = _peak_memory_mib()
        if peak is not None:
            event["mem_peak_mib"] = round(peak, 1)
        if "train_runtime" in logs:
            # The Trainer's closing log: its figures make the summary.
            summary = {k: v for k, v in logs.items() if _number(v) is not None}
            self.writer.log(step=step, **{k: v for k, v in event.items() if k != "loss"})
            self.writer.summary(**summary)
            return
        self.writer.log(step=step, **event)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._previous_handler is not None:
            try:
                signal.signal(signal.SIGINT, self._previous_handler)
            except ValueError:
                pass
            self._previous_handler = None
        if self.writer is not None:
            self.writer.close()


class _TrackerImpl:
    """The body of :class:`GpustationTracker` (see there)."""

    name = "gpustation"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, writer: MetricsWriter | None = None, total_steps: int | None = None) -> None:
        super().__init__()
        self.writer = writer if writer is not None else MetricsWriter.from_env()
        self.total_steps = total_steps

    @property
    def tracker(self) -> MetricsWriter:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer.log(config=values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        event: dict[str, Any] = {}
        for key, value in values.items():
            event[_HF_KEYS.get(key, key)] = value
        if self.total_steps and "total_steps" not in event:
            event["total_steps"] = self.total_steps
        if "mem_peak_mib" not in event:
            peak = _peak_memory_mib()
            if peak is not None:
                event["mem_peak_mib"] = round(peak, 1)
        self.writer.log(step=step, **event)

    def finish(self) -> None:
        self.writer.close()


_CALLBACK_DOC = """A ``transformers.TrainerCallback`` that writes gpustation metrics.

``loss``, ``eval_loss``, ``learning_rate`` (as ``lr``), ``grad_norm`` and
``epoch`` are taken from the Trainer's logs; ``throughput`` is measured
between logs from the global batch size (``unit`` ``samples/s``, or
``tokens/s`` with ``tokens_per_sample``); ``total_steps`` is ``max_steps``;
the closing log becomes the ``summary``. With ``stop_on_sigint`` a first
SIGINT (gpustation's graceful stop) ends training at the next step boundary
and saves; a second one interrupts.
"""

_TRACKER_DOC = """An ``accelerate`` tracker: ``Accelerator(log_with=[GpustationTracker()])``.

``accelerator.log({...}, step=n)`` becomes one metrics line; ``loss`` /
``train_loss``, ``learning_rate`` / ``lr``, ``eval_loss``, ``grad_norm`` and
``epoch`` are mapped to the protocol, other keys are kept as they are
(``throughput`` with ``unit`` too). A ``total_steps`` given here is added to
every line so gpustation can show progress.
"""

_built: dict[str, type] = {}


def __getattr__(name: str) -> type:
    # The classes need transformers / accelerate as base classes; they are
    # built when first asked for, so importing this module stays free.
    if name in _built:
        return _built[name]
    if name == "GpustationCallback":
        # optional extra 'train'
        from transformers import TrainerCallback

        cls = type(name, (_CallbackImpl, TrainerCallback), {"__doc__": _CALLBACK_DOC})
    elif name == "GpustationTracker":
        # optional extra 'train'
        from accelerate.tracking import GeneralTracker

        cls = type(name, (_TrackerImpl, GeneralTracker), {"__doc__": _TRACKER_DOC})
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls.__module__ = __name__
    _built[name] = cls
    return cls
