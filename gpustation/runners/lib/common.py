"""What every runner shares: arguments, device and precision, distributed setup,
out-of-memory handling, timing and memory figures.

The contract these helpers implement is written in ``gpustation/runners/__init__.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import random
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpustation.runners import EXIT_OOM
from gpustation.runs.metrics import RUN_DIR_ENV, MetricsWriter
from gpustation.textsafe import safe

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")

# Exit codes of runners (EXIT_OOM is part of the contract in runners/__init__.py).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
#: stopped by SIGINT after saving a checkpoint (128 + SIGINT, as a shell reports it)
EXIT_STOPPED = 130

OOM_EPILOG = (
    f"exit status: 0 success, 1 failure, 2 bad arguments, {EXIT_OOM} out of memory "
    f"(the message says what to try), {EXIT_STOPPED} stopped by SIGINT."
)


class RunnerError(Exception):
    """A failure with a message meant for the user and the exit status to use."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# ----------------------------------------------------------------------------- arguments


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the module docstring's layout; shows defaults unless the help already does."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action) or text


def make_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser with ``--seed --device --output-dir``, as every runner has them.

    Presets and ``--set key=value`` rely on the names of ``SHARED_OPTIONS``
    (runners/__init__.py) meaning the same in every runner. Booleans accept
    ``--flag`` and ``--no-flag``.
    """
    parser = argparse.ArgumentParser(
        prog=f"python -m gpustation.runners.{prog}",
        description=description,
        epilog=OOM_EPILOG,
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=None,
        help="where to run (default: cuda when available, else cpu)",
    )
    parser.add_argument(
        "--output-dir",
        default=None,
        help=f"where checkpoints and adapters go (default: ${RUN_DIR_ENV}, else ./gpustation-out)",
    )
    # Hidden: makes the out-of-memory path testable on a machine without a GPU.
    parser.add_argument("--simulate-oom-at-step", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def add_training_args(
    parser: argparse.ArgumentParser,
    *,
    steps: int,
    batch_size: int,
    precision: str,
    compile_default: bool,
) -> None:
    """Add ``--steps --batch-size --precision --compile`` with runner-specific defaults."""
    parser.add_argument("--steps", type=int, default=steps, help="optimizer steps to run")
    parser.add_argument(
        "--batch-size", type=int, default=batch_size, help="samples per step per process"
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=precision,
        help="fp32; tf32 (fp32 with TensorFloat-32 matmuls); fp16 autocast with a "
        "grad scaler; bf16 autocast",
    )
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=compile_default,
        help="torch.compile the model (slower start, faster steps on a GPU)",
    )


def check_grad_accum(args: argparse.Namespace) -> None:
    """Refuse a ``--batch-size`` that ``--grad-accum`` cannot split into equal micro-batches."""
    if args.batch_size % max(1, args.grad_accum):
        raise RunnerError("--batch-size must be a multiple of --grad-accum", EXIT_USAGE)


def parse_int_list(text: str) -> list[int]:
    """Parse ``"1,2,4"`` into ``[1, 2, 4]`` (argparse ``type=``)."""
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from exc
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def output_dir(args: argparse.Namespace) -> Path:
    """Where results are saved: ``--output-dir``, the run directory, or ./gpustation-out."""
    path = Path(args.output_dir or os.environ.get(RUN_DIR_ENV) or "gpustation-out")
    path.mkdir(parents=True, exist_ok=True)
    return path


# ----------------------------------------------------------------------------- device, precision


def pick_device(name: str | None, local_rank: int = 0) -> torch.device:
    """The device asked for, else cuda when available; an error if cuda is asked for but absent."""
    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RunnerError(
                "--device cuda was asked for but torch sees no CUDA GPU "
                f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}). "
                "Run `python -m gpustation.runners.healthcheck` to see why, or pass --device cpu.",
                EXIT_USAGE,
            )
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass
class Precision:
    """How one of fp32/tf32/fp16/bf16 is applied: autocast dtype, scaler, TF32 switches."""

    name: str
    device: torch.device

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(self.name)

    @property
    def needs_scaler(self) -> bool:
        # fp16 has a narrow exponent range: small gradients underflow without scaling.
        return self.name == "fp16"

    def apply_backend_flags(self) -> None:
        """Turn TF32 matmuls on only for ``tf32`` so ``fp32`` is a true fp32 baseline."""
        tf32 = self.name == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast context for the forward pass (a no-op for fp32/tf32)."""
        dtype = self.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def scaler(self) -> torch.amp.GradScaler:
        """A grad scaler, enabled only for fp16."""
        return torch.amp.GradScaler(self.device.type, enabled=self.needs_scaler)


def seed_everything(seed: int) -> None:
    """Seed Python and torch (all devices)."""
    random.seed(seed)
    torch.manual_seed(seed)


def sync(device: torch.device) -> None:
    """Wait for queued GPU work so a timer reads real elapsed time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def mark_static_memory(metrics: MetricsWriter, device: torch.device) -> None:
    """Before the first step: report ``mem_static_mib`` once (what the model and its
    optimizer hold: allocated by torch on a GPU, resident on the CPU) and start the peak
    anew, so a forecast tells the memory a bigger batch keeps from what grows with it."""
    held = torch.cuda.memory_allocated(device) / 2**20 if device.type == "cuda" else host_rss_mib()
    metrics.log(mem_static_mib=round(held, 1))
    reset_peak_memory(device)


def peak_memory_mib(device: torch.device) -> float:
    """Peak memory: allocated by torch on a GPU, or the process's peak RSS on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    # ru_maxrss is KiB on Linux and bytes on macOS.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (2**20 if sys.platform == "darwin" else 1024)


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({torch.get_num_threads()} threads)"


def free_memory(device: torch.device) -> None:
    """Release cached blocks after an out-of-memory error so the next attempt starts clean."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- distributed


@dataclass
class Dist:
    """This process's place in a data-parallel job (world_size 1 when run alone)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_name: str | None) -> Dist:
    """Join the process group described by torchrun's (or accelerate's) environment.

    Both launchers export RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.
    NCCL is used between GPUs, gloo on the CPU.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world_size <= 1:
        return Dist()
    # start-up time: torch.distributed, only where it is used
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device_name == "cuda" or (device_name is None and torch.cuda.is_available())
    if use_cuda and torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        backend = "nccl"
    else:
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return Dist(rank=rank, world_size=world_size, local_rank=local_rank)


def shutdown_distributed(d: Dist) -> None:
    if d.enabled:
        # start-up time: torch.distributed, only where it is used
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


@contextlib.contextmanager
def distributed(device_name: str | None) -> Iterator[Dist]:
    """:func:`init_distributed` for a ``with`` block, the group left however the block ends.

    A block that ends normally meets the other ranks at a barrier first, so the
    ranks leave together: with gloo, a rank that tore its group down while rank 0
    was still writing its report was seen to abort on the way out ("terminate
    called without an active exception"), failing a run whose work was done.
    """
    d = init_distributed(device_name)
    try:
        yield d
        if d.enabled:
            # start-up time: torch.distributed, only where it is used
            import torch.distributed as dist

            if dist.is_initialized():
                dist.barrier()
    finally:
        shutdown_distributed(d)


def data_parallel(model: torch.nn.Module, d: Dist, device: torch.device) -> torch.nn.Module:
    """``model`` wrapped in DistributedDataParallel in a data-parallel job, else as it is."""
    if not d.enabled:
        return model
    return torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )


def all_reduce_mean(value: float, d: Dist, device: torch.device) -> float:
    """Average a float over ranks (the value itself when run alone)."""
    if not d.enabled:
        return value
    # start-up time: torch.distributed, only where it is used
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / d.world_size


# ----------------------------------------------------------------------------- stopping


class StopAsked:
    """SIGINT asks a training loop to leave at the end of its step; a second SIGINT leaves at once.

    ``gpustation runs stop`` (and the runs screen's stop) send SIGINT first and
    promise that the run saves and leaves: the loop asks :meth:`now` after each
    step, writes a checkpoint of the step it finished and returns. Ranks of a
    data-parallel job agree through one all-reduce, at the steps where they
    already reduce the loss, so no rank waits in a collective another has left.
    """

    def __init__(self, dist: Dist, device: torch.device, every: int) -> None:
        self.dist = dist
        self.device = device
        self.every = max(1, every)
        self.asked = False
        self._previous: Any = None

    def __enter__(self) -> StopAsked:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _on_sigint(self, signum: int, frame: object) -> None:
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True
        print("SIGINT: stopping after this step, with a checkpoint", file=sys.stderr, flush=True)

    def now(self, step: int) -> bool:
        """Whether every rank stops after ``step``."""
        if not self.dist.enabled:
            return self.asked
        if step % self.every:
            return False
        # start-up time: the distributed package only in a distributed job
        import torch.distributed as dist

        flag = torch.tensor([1.0 if self.asked else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


# ----------------------------------------------------------------------------- out of memory


def is_oom(exc: BaseException) -> bool:
    """True for torch's OutOfMemoryError and for allocator errors that only say so in text."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def maybe_simulate_oom(args: argparse.Namespace, step: int) -> None:
    """Raise an OutOfMemoryError at ``--simulate-oom-at-step`` (for tests on the CPU)."""
    at = getattr(args, "simulate_oom_at_step", None)
    if at is not None and step >= at:
        raise torch.OutOfMemoryError(
            f"simulated out of memory at step {step} (--simulate-oom-at-step {at})"
        )


def oom_advice(what: str, batch_size: int | None, extra: Sequence[str] = ()) -> str:
    """The message printed when a runner runs out of memory: what happened, what to try."""
    lines = [f"out of memory while {what}."]
    tips = []
    if batch_size:
        half = max(1, batch_size // 2)
        tips.append(
            f"a smaller batch (--batch-size {half}), or keep the batch of {batch_size} and "
            "split it into micro-batches (--grad-accum 2: half the activation memory)"
        )
    tips.extend(extra)
    tips.append("bf16 (--precision bf16) halves activation memory against fp32")
    tips.append(
        "find the largest batch that fits: python -m gpustation.runners.batchsize --workload ..."
    )
    tips.append("check nothing else holds GPU memory (gpustation snapshot lists the processes)")
    lines.append("Try:")
    lines.extend(f"  - {t}" for t in tips)
    return "\n".join(lines)


def run_main(
    main: Callable[[argparse.Namespace], int],
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    *,
    oom_hint: Callable[[argparse.Namespace], str] | None = None,
) -> int:
    """Parse arguments and run ``main``, turning failures into a message and an exit status.

    Out of memory anywhere prints what to try, records an ``error`` event in the
    metrics file and exits with :data:`EXIT_OOM`.
    """
    args = parser.parse_args(argv)
    try:
        return main(args)
    except RunnerError as exc:
        # its words may quote a file or a child's output: made safe for the terminal
        print(f"error: {safe(exc, newlines=True)}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return EXIT_STOPPED
    except Exception as exc:
        if not is_oom(exc):
            raise
        message = (
            oom_hint(args) if oom_hint else oom_advice("running", getattr(args, "batch_size", None))
        )
        print(
            f"error: {message}\n({type(exc).__name__}: {str(exc).splitlines()[0]})",
            file=sys.stderr,
            flush=True,
        )
        with MetricsWriter.from_env() as m:
            m.log(error="out_of_memory", message=message)
        return EXIT_OOM


# ----------------------------------------------------------------------------- timing


class StepTimer:
    """Measures throughput over the steps after warm-up, syncing the GPU only when read.

    Per-step host syncs would stall the GPU's queue; reading the clock every
    ``log_every`` steps keeps the GPU busy and still gives live figures.
    """

    def __init__(self, device: torch.device, warmup_steps: int) -> None:
        self.device = device
        self.warmup_steps = warmup_steps
        self._t0: float | None = None
        self._items = 0.0
        self._last_t: float | None = None
        self._last_items = 0.0

    def step_done(self, step: int, items: float) -> None:
        """Call after step ``step`` (1-based) processed ``items`` samples or tokens."""
        if step == self.warmup_steps:
            sync(self.device)
            self._t0 = time.perf_counter()
            self._last_t = self._t0
        elif step > self.warmup_steps:
            self._items += items

    def recent_rate(self) -> float | None:
        """Items per second since the previous call (syncs the GPU)."""
        if self._t0 is None or self._last_t is None:
            return None
        sync(self.device)
        now = time.perf_counter()
        rate = (self._items - self._last_items) / max(now - self._last_t, 1e-9)
        self._last_t, self._last_items = now, self._items
        return rate

    def overall(self) -> tuple[float, float]:
        """(items per second, seconds) over all timed steps."""
        if self._t0 is None:
            return 0.0, 0.0
        sync(self.device)
        elapsed = time.perf_counter() - self._t0
        return self._items / max(elapsed, 1e-9), elapsed


def report_step(
    metrics: Any,
    say: Callable[..., None],
    *,
    step: int,
    total_steps: int,
    loss: float,
    rate: float | None,
    unit: str,
    mem_mib: float | None,
    lr: float | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """One progress report, the same in every training runner: a metrics event
    for gpustation and a line for the log (``rate`` is None during warm-up)."""
    metrics.log(
        step=step,
        loss=loss,
        lr=lr,
        total_steps=total_steps,
        throughput=rate,
        unit=unit,
        mem_peak_mib=None if mem_mib is None else round(mem_mib, 1),
        **(extra or {}),
    )
    say(
        f"step {step:>5}/{total_steps}  loss {loss:.4f}  "
        + (f"lr {lr:.2e}  " if lr is not None else "")
        + (f"{fmt_rate(rate)} {unit}  " if rate else "(warm-up)  ")
        + (f"peak mem {mem_mib:,.0f} MiB" if mem_mib is not None else "")
        + "".join(f"  {k} {v:,.0f}" for k, v in (extra or {}).items() if isinstance(v, float)),
        flush=True,
    )


def fmt_rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.2f}"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a plain aligned table (stdout becomes the run's output.log)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print(
            "  ".join(
                c.rjust(w) if n and i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            print("  ".join("-" * w for w in widths))
    sys.stdout.flush()


def print_limits(lines: Sequence[str]) -> None:
    """Print the closing "what limits you" advice."""
    print("\nWhat limits you:")
    for line in lines:
        print(f"  - {line}")
    sys.stdout.flush()


# ----------------------------------------------------------------------------- host memory


def host_rss_mib() -> float:
    """This process's resident memory now (MiB): VmRSS on Linux, else the peak."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (2**20 if sys.platform == "darwin" else 1024)
