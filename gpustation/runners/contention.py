"""Training beside inference on one device: how much each slows the other.

Three phases of ``--phase-seconds`` each, every workload in its own child
process on the same device (as two users' jobs would be):

1. ``train``: a small Llama-style training loop alone (tokens/s);
2. ``infer``: greedy generation requests alone (p50/p99 request latency,
   ms/token, tokens/s);
3. ``both``: the two together, started at the same moment.

Beside each phase's workload figures it records the GPU's mean and peak
power, its mean utilisation and each process's share of the SMs (sampled
every half second by :class:`~gpustation.runners.lib.gpuwatch.GpuWatch`, told
apart by the children's pids); on the CPU, or where the driver does not say,
those are ``null`` with the reason beside them. The run is one run with three
phases: a metrics line per phase (``phase``) and a ``phases`` list in the
summary. It reports each workload's slowdown in the shared phase and ends
with advice in words, from the measured SM shares where there are some: MPS
(``nvidia-cuda-mps-control -d``) to run both kernels side by side with a set
share of the SMs, a lower training batch to shorten the kernels a request
waits behind, or separate GPUs. Models are built from ``--model-preset``
(random weights, no download).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from gpustation.pyargv import python_argv
from gpustation.runners.infer import generate_timed, percentile
from gpustation.runners.lib import common, llm
from gpustation.runners.lib.gpuwatch import GpuWatch
from gpustation.runs.metrics import METRICS_ENV, MetricsWriter

if TYPE_CHECKING:
    from gpustation.runners.lib.gpuwatch import GpuWatch, PhaseGpu

PHASES = ("train", "infer", "both")
ROLES = ("train", "infer")
RESULT = "CONTENTION-RESULT "
READY = "CONTENTION-READY"


def build_parser() -> argparse.ArgumentParser:
    parser = common.make_parser("contention", __doc__)
    parser.add_argument("--batch-size", type=int, default=8, help="training sequences per step")
    parser.add_argument(
        "--precision", choices=common.PRECISIONS, default="bf16", help="both workloads"
    )
    llm.add_model_args(parser)
    parser.set_defaults(seq_len=512)
    parser.add_argument(
        "--phase-seconds", type=float, default=30.0, help="length of each of the three phases"
    )
    parser.add_argument("--infer-batch", type=int, default=1, help="prompts per request")
    parser.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per request")
    # Internal: the role of a child process, and when the parent says go.
    parser.add_argument("--role", choices=("train", "infer"), default=None, help=argparse.SUPPRESS)
    return parser


# ----------------------------------------------------------------------------- the children


def _child(args: argparse.Namespace) -> int:
    """One workload: build it, warm it up, say ready, wait for go, run, print the result."""
    device = common.pick_device(args.device)
    common.seed_everything(args.seed)
    prec = common.Precision(args.precision, device)
    prec.apply_backend_flags()
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    loaded = llm.build_from_preset(
        args.model_preset, args.seed, device, dtype, max(args.seq_len, 2048)
    )
    model = loaded.model
    ids, labels = llm.token_stream(None, loaded.tokenizer)
    if args.role == "train":
        blocks = llm.pack(ids, labels, args.seq_len, min_blocks=args.batch_size).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        g = torch.Generator().manual_seed(args.seed)

        def work() -> float:
            idx = torch.randint(0, len(blocks), (args.batch_size,), generator=g).to(device)
            b = blocks[idx]
            with prec.autocast():
                loss = model(input_ids=b[:, 0], labels=b[:, 1]).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            common.sync(device)
            return float(args.batch_size * args.seq_len)

    else:
        model.eval()
        pool = llm.pack(ids, ids, args.prompt_len, min_blocks=args.infer_batch)[:, 0].to(device)
        g = torch.Generator().manual_seed(args.seed)
        latencies: list[float] = []

        def work() -> float:
            idx = torch.randint(0, len(pool), (args.infer_batch,), generator=g).to(device)
            with prec.autocast():
                _, total, _ = generate_timed(model, pool[idx], args.new_tokens, device)
            latencies.append(total)
            return float(args.infer_batch * args.new_tokens)

    for _ in range(2):  # warm-up: allocator, kernels, caches
        work()
    if args.role == "infer":
        latencies.clear()
    print(READY, flush=True)
    sys.stdin.readline()  # the parent writes a line when every child is ready
    items = 0.0
    count = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < args.phase_seconds or count == 0:
        items += work()
        count += 1
    elapsed = time.perf_counter() - t0
    result: dict[str, Any] = {"role": args.role, "tokens_per_s": items / elapsed,
                              "iterations": count, "seconds": elapsed}  # fmt: skip
    if args.role == "infer":
        result.update(
            latency_ms_p50=percentile(latencies, 50) * 1e3,
            latency_ms_p99=percentile(latencies, 99) * 1e3,
            ms_per_token=percentile(latencies, 50) * 1e3 / max(1, args.new_tokens),
        )
    print(RESULT + json.dumps(result), flush=True)
    return common.EXIT_OK


# ----------------------------------------------------------------------------- the parent


def _child_argv(args: argparse.Namespace, role: str) -> list[str]:
    argv = python_argv(
        "-m", "gpustation.runners.contention", "--role", role,
        "--model-preset", args.model_preset, "--seq-len", str(args.seq_len),
        "--batch-size", str(args.batch_size), "--precision", args.precision,
        "--phase-seconds", str(args.phase_seconds), "--infer-batch", str(args.infer_batch),
        "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens),
        "--seed", str(args.seed),
    )  # fmt: skip
    if args.device:
        argv += ["--device", args.device]
    return argv


def run_phase(
    args: argparse.Namespace, roles: Sequence[str], watch: GpuWatch
) -> tuple[dict[str, dict[str, Any]], PhaseGpu]:
    """Start one child per role, release them together, collect their results and
    what ``watch`` saw of the GPU while they ran."""
    env = {k: v for k, v in os.environ.items() if k != METRICS_ENV}  # children write no metrics
    timeout = args.phase_seconds * 4 + 300
    procs = {
        r: subprocess.Popen(
            _child_argv(args, r),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in roles
    }
    ready = {r: threading.Event() for r in roles}
    results: dict[str, dict[str, Any]] = {}
    errors: dict[str, list[str]] = {r: [] for r in roles}

    def read(role: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(READY):
                ready[role].set()
            elif line.startswith(RESULT):
                results[role] = json.loads(line[len(RESULT) :])
        ready[role].set()  # ended without saying ready: do not wait for it

    def read_err(role: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        errors[role] = proc.stderr.read().splitlines()[-5:]

    threads = [threading.Thread(target=f, args=(r, p), daemon=True)
               for r, p in procs.items() for f in (read, read_err)]  # fmt: skip
    for t in threads:
        t.start()
    try:
        for r in roles:
            ready[r].wait(timeout)
        watch.start({r: p.pid for r, p in procs.items()})
        for p in procs.values():  # go
            if p.poll() is None and p.stdin is not None:
                p.stdin.write("go\n")
                p.stdin.flush()
        for p in procs.values():
            p.wait(timeout)
        gpu = watch.stop()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for t in threads:
        t.join(timeout=10)
    for r, p in procs.items():
        if r not in results:
            tail = " | ".join(errors[r]) or f"exit {p.returncode}"
            if any("out of memory" in e.lower() for e in errors[r]):
                raise torch.OutOfMemoryError(f"the {r} workload ran out of memory: {tail}")
            raise common.RunnerError(f"the {r} workload failed: {tail}")
    return results, gpu


def main(args: argparse.Namespace) -> int:
    if args.role:
        return _child(args)
    # Only the parent watches the GPU and prints the table: the role children,
    # started once per phase, do without those imports (NVML's, rich's).
    # start-up time: rich, for the report only
    from gpustation.runs.phases import HEADERS, phase_cells, phase_notes

    device = common.pick_device(args.device)
    print(
        f"contention: training (batch {args.batch_size} x {args.seq_len}) and inference "
        f"(batch {args.infer_batch}, {args.prompt_len}+{args.new_tokens} tokens) of "
        f"preset {args.model_preset} on {common.device_label(device)}, "
        f"{args.phase_seconds:g} s per phase",
        flush=True,
    )
    metrics = MetricsWriter.from_env()
    phases: dict[str, dict[str, dict[str, Any]]] = {}
    rows: list[dict[str, Any]] = []
    cuda = (device.index or 0) if device.type == "cuda" else None
    with metrics, GpuWatch(cuda) as watch:
        for n, phase in enumerate(PHASES, 1):
            common.maybe_simulate_oom(args, n)
            roles = ROLES if phase == "both" else (phase,)
            phases[phase], gpu = run_phase(args, roles, watch)
            rows.append(phase_row(phase, phases[phase], gpu))
            metrics.log(step=n, total_steps=len(PHASES), **rows[-1])
            print(f"phase {phase}: {rows[-1]}", flush=True)
        summary = _summary(phases, rows, device)
        metrics.summary(**summary)
    print()
    common.print_table(HEADERS, phase_cells(summary["phases"]))
    for note in phase_notes(summary["phases"]):
        print(note)
    print(
        f"\ntogether, a training step takes {summary['train_slowdown']:.2f}x as long as alone and "
        f"an inference request {summary['infer_p50_slowdown']:.2f}x (p50), "
        f"{summary['infer_p99_slowdown']:.2f}x (p99)",
        flush=True,
    )
    common.print_limits(summary["advice"])
    return common.EXIT_OK


def phase_row(phase: str, res: dict[str, dict[str, Any]], gpu: PhaseGpu) -> dict[str, Any]:
    """One phase's figures: each workload's, then the GPU's (``None`` where not measured)."""
    row: dict[str, Any] = {"phase": phase}
    if "train" in res:
        row["train_tokens_per_s"] = round(res["train"]["tokens_per_s"], 1)
    if "infer" in res:
        i = res["infer"]
        row.update(
            infer_tokens_per_s=round(i["tokens_per_s"], 1),
            infer_latency_ms_p50=round(i["latency_ms_p50"], 2),
            infer_latency_ms_p99=round(i["latency_ms_p99"], 2),
        )
    row.update(gpu.fields(ROLES))
    return row


def _summary(
    phases: dict[str, dict[str, dict[str, Any]]],
    rows: list[dict[str, Any]],
    device: torch.device,
) -> dict[str, Any]:
    ta, ia = phases["train"]["train"], phases["infer"]["infer"]
    tb, ib = phases["both"]["train"], phases["both"]["infer"]
    train_slow = ta["tokens_per_s"] / max(tb["tokens_per_s"], 1e-9)
    p50_slow = ib["latency_ms_p50"] / max(ia["latency_ms_p50"], 1e-9)
    p99_slow = ib["latency_ms_p99"] / max(ia["latency_ms_p99"], 1e-9)
    tps_slow = ia["tokens_per_s"] / max(ib["tokens_per_s"], 1e-9)
    by_phase = {r["phase"]: r for r in rows}
    by_phase["both"].update(
        train_slowdown=round(train_slow, 3),
        infer_p50_slowdown=round(p50_slow, 3),
        infer_p99_slowdown=round(p99_slow, 3),
    )
    shares = Shares(
        by_phase["both"].get("sm_pct_train"),
        by_phase["both"].get("sm_pct_infer"),
        by_phase["infer"].get("sm_pct_infer"),
    )
    summary: dict[str, Any] = {
        "train_alone_tokens_per_s": round(ta["tokens_per_s"], 1),
        "train_shared_tokens_per_s": round(tb["tokens_per_s"], 1),
        "infer_alone_latency_ms_p50": round(ia["latency_ms_p50"], 2),
        "infer_alone_latency_ms_p99": round(ia["latency_ms_p99"], 2),
        "infer_shared_latency_ms_p50": round(ib["latency_ms_p50"], 2),
        "infer_shared_latency_ms_p99": round(ib["latency_ms_p99"], 2),
        "infer_alone_tokens_per_s": round(ia["tokens_per_s"], 1),
        "infer_shared_tokens_per_s": round(ib["tokens_per_s"], 1),
        "train_slowdown": round(train_slow, 3),
        "infer_p50_slowdown": round(p50_slow, 3),
        "infer_p99_slowdown": round(p99_slow, 3),
        "infer_tokens_slowdown": round(tps_slow, 3),
        "shared_sm_pct_train": shares.train_shared,
        "shared_sm_pct_infer": shares.infer_shared,
        "phases": rows,
        "advice": advice(train_slow, p50_slow, p99_slow, device, shares),
        "device": str(device),
    }
    for key in ("gpu_note", "sm_note"):  # why GPU figures are missing, once for the run
        note = next((r[key] for r in rows if r.get(key)), None)
        if note:
            summary[key] = note
    return summary


class Shares(NamedTuple):
    """Measured SM shares (%): each workload's while both ran, inference's alone."""

    train_shared: float | None = None
    infer_shared: float | None = None
    infer_alone: float | None = None


def mps_cap(infer_alone_pct: float) -> int:
    """A CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for training that leaves inference what it used alone."""
    return int(min(90, max(10, 10 * round((100.0 - infer_alone_pct) / 10))))


def advice(
    train_slow: float,
    p50_slow: float,
    p99_slow: float,
    device: torch.device,
    shares: Shares | None = None,
) -> list[str]:
    tips = []
    shares = shares or Shares()
    measured = shares.train_shared is not None and shares.infer_shared is not None
    if device.type == "cpu":
        tips.append("running on the CPU: the two share cores, not a GPU's SMs")
    if max(train_slow, p99_slow) < 1.15:
        tips.append(
            "the two barely disturb each other: sharing this device costs little at these sizes"
        )
        return tips
    if device.type == "cuda" and measured:
        cap = (
            f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={mps_cap(shares.infer_alone)} for the training "
            f"process leaves inference the {shares.infer_alone:.0f} % of the SMs it used alone"
            if shares.infer_alone is not None
            else "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE caps the SMs training may take"
        )
        tips.append(
            f"inference got {shares.infer_shared:.0f} % of the SMs while training ran (training "
            f"{shares.train_shared:.0f} %): without MPS the GPU time-slices between the two "
            "processes, so each request waits behind training kernels; MPS "
            f"(nvidia-cuda-mps-control -d) runs both at once, and {cap}"
        )
    elif device.type == "cuda":
        tips.append(
            "without MPS the GPU time-slices between the two processes, so each request waits "
            "behind training kernels: MPS (nvidia-cuda-mps-control -d) runs both at once, and "
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE caps the SMs training may take"
        )
    if p99_slow > 1.5:
        tips.append(
            f"the p99 request latency grew {p99_slow:.1f}x: a lower training --batch-size "
            "shortens the kernels a request waits behind (at some cost to training tokens/s)"
        )
    if train_slow > 1.5:
        tips.append(f"training ran {train_slow:.1f}x slower while serving")
    tips.append(
        "for steady latency give each its own GPU (gpustation run --gpus N), or a MIG slice "
        "on cards that have it"
    )
    return tips


def cli(argv: Sequence[str] | None = None) -> int:
    return common.run_main(main, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(cli())
