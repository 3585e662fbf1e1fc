"""The runners against references measured in the same run, on one GPU.

    PYTHONUNBUFFERED=1 python bench/gpu_runners.py --out /tmp/gpu_runners.json
    PYTHONUNBUFFERED=1 python bench/gpu_runners.py --parts figures --out /tmp/gpu_figures.json

Parts (each in its own child processes, each with a time cap, one failure
never loses the others; results are printed and the JSON rewritten as each
part finishes):

  matmul  best bf16 ``torch.matmul`` rate over sizes (reference) against the
          matmul runner's bf16 figure; the runner's full precision table.
  resnet  a hand-written tuned loop (bf16 autocast + channels_last +
          torch.compile, fused SGD, batch 256, synthetic data on the GPU)
          against ``gpustation.runners.resnet`` with the resnet50-bf16 preset
          arguments, and the resnet50-fp32-baseline preset.
  lora    the lora runner against a transformers Trainer + peft with
          ``bf16=True`` and otherwise default settings: same model config,
          LoRA config, data, batch and sequence length; default model and the
          ~1B Llama-style config. Model FLOPs utilisation is reported against
          the bf16 matmul rate measured in the matmul part.
  infer   the infer runner's batch sweep (p50/p99 latency, tokens/s) against
          ``model.generate`` on the same model, prompts and lengths.
  fsdp     the fsdp runner (FSDP2, lora mode, one process) against the plain
           lora runner (lora-tiny preset settings) on the same ~1B model, batch
           and sequence length; then the same FSDP run with --offload: tokens/s,
           peak GPU memory and host RSS of each.
  fsdpmax  ``fsdp --find-max-model``: the largest model (layers at width 4096)
           that trains on the GPU with and without offload, tokens/s of each.
  burnin   the burnin runner for 2 minutes: checks in words and the figures.
  graphs   infer ms/token at batch 1 with and without --cuda-graphs (static
           KV cache, reduce-overhead), and resnet img/s with and without
           --cuda-graphs (whole-step capture, eager, small batch).
  profile  resnet with --profile-steps: the trace, top CUDA kernels by self
           time and the GPU idle time between kernels.

``--parts classic`` is the first four (the default), ``--parts figures`` the
last five (about 8 minutes on an H200), ``--parts all`` both. No part changes a
GPU setting (power limit, clocks, fans, persistence, MIG): they only compute
and read NVML.

``--device cpu --tiny`` runs every part at toy sizes to check the script.
At the end a Markdown summary is printed for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CLASSIC = ("matmul", "resnet", "lora", "infer")
FIGURES = ("burnin", "graphs", "profile", "fsdp", "fsdpmax")
PARTS = CLASSIC + FIGURES
GROUPS = {"classic": CLASSIC, "figures": FIGURES, "all": PARTS}


# ----------------------------------------------------------------------------- plumbing


class Budget:
    """A wall-clock allowance; each child gets min(its cap, what is left)."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def cap(self, seconds: float, reserve: float = 0.0) -> float:
        """Up to ``seconds``, keeping ``reserve`` seconds for the children still to come."""
        return max(0.0, min(seconds, self.left() - 3 - reserve))

    def share(self, weight: float, weights_left: float) -> Budget:
        """A part's allowance: its share of what is left (time saved earlier rolls over)."""
        return Budget(max(0.0, self.left()) * weight / max(weights_left, weight))


# Share of the whole budget each part may use (compile-heavy parts get more).
PART_WEIGHTS = {"matmul": 0.13, "resnet": 0.36, "lora": 0.38, "infer": 0.13,
                "burnin": 0.27, "graphs": 0.24, "profile": 0.05, "fsdp": 0.16,
                "fsdpmax": 0.28}  # fmt: skip


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env.update(extra or {})
    return env


def run_child(cmd: list[str], timeout: float, label: str, env: dict[str, str]) -> int:
    """Run a child in its own process group, echoing its output; kill the group on timeout."""
    if timeout <= 1:
        print(f"[{label}] skipped: no time left", flush=True)
        return -1
    print(f"[{label}] $ {' '.join(cmd[1:])}  (cap {timeout:.0f}s)", flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # compile workers die with it
    )
    assert proc.stdout is not None
    stream = proc.stdout

    def pump() -> None:
        # A thread reads the child's output so a silent child cannot block the timeout.
        for line in stream:
            line = line.rstrip("\n")
            if line.strip() and not _noise(line):
                print(f"[{label}] {line}", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"[{label}] TIMED OUT after {timeout:.0f}s; killing", flush=True)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        reader.join(timeout=5)
        return -9
    reader.join(timeout=5)
    print(f"[{label}] exit {proc.returncode} after {time.monotonic() - t0:.0f}s", flush=True)
    return proc.returncode


def _noise(line: str) -> bool:
    return "FutureWarning" in line or line.startswith("  warnings.warn")


def read_summary(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    for line in reversed(path.read_text().splitlines()):
        if '"summary"' in line:
            return json.loads(line)["summary"]
    return None


def run_runner(
    name: str,
    args: list[str],
    timeout: float,
    label: str,
    workdir: Path,
    ok_codes: tuple[int, ...] = (0,),
) -> dict[str, Any] | None:
    """``python -m gpustation.runners.NAME ARGS`` with a metrics file; its summary."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=workdir))
    metrics = run_dir / "metrics.jsonl"
    env = child_env({"GPUSTATION_METRICS_FILE": str(metrics), "GPUSTATION_RUN_DIR": str(run_dir)})
    rc = run_child([sys.executable, "-m", f"gpustation.runners.{name}", *args], timeout, label, env)
    summary = read_summary(metrics)
    if rc not in ok_codes or summary is None:
        raise RuntimeError(f"{label}: exit {rc}, summary {'found' if summary else 'missing'}")
    return summary


def run_reference(
    kind: str, params: dict[str, Any], timeout: float, label: str, workdir: Path
) -> dict[str, Any]:
    """Run one of this script's reference measurements in a fresh child process."""
    out = Path(tempfile.mkstemp(prefix=f"{label}-", suffix=".json", dir=workdir)[1])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind,
           "--child-params", json.dumps(params), "--child-out", str(out)]  # fmt: skip
    rc = run_child(cmd, timeout, label, child_env())
    text = out.read_text() if out.exists() else ""
    if rc != 0 or not text:
        raise RuntimeError(f"{label}: exit {rc}, no result")
    result: dict[str, Any] = json.loads(text)
    return result


# ----------------------------------------------------------------------------- references
# These run in child processes (`--child KIND`) and import torch only there.


def ref_matmul(p: dict[str, Any]) -> dict[str, Any]:
    """Best bf16 torch.matmul rate over sizes, timed with CUDA events."""
    import torch

    device = torch.device(p["device"])
    best, per_size = 0.0, {}
    for n in p["sizes"]:
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        for _ in range(5):
            torch.matmul(a, b)
        sync(device)
        t0 = time.perf_counter()
        torch.matmul(a, b)
        sync(device)
        iters = max(5, int(p["seconds"] / max(time.perf_counter() - t0, 1e-6)))
        if device.type == "cuda":
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(iters):
                torch.matmul(a, b)
            e.record()
            e.synchronize()
            sec = s.elapsed_time(e) / 1e3 / iters
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                torch.matmul(a, b)
            sec = (time.perf_counter() - t0) / iters
        tflops = 2 * n**3 / sec / 1e12
        per_size[str(n)] = tflops
        best = max(best, tflops)
        print(f"torch.matmul bf16 N={n}: {tflops:.1f} TFLOP/s", flush=True)
    return {"best_tflops": best, "per_size": per_size}


def ref_resnet(p: dict[str, Any]) -> dict[str, Any]:
    """A tuned hand-written ResNet loop: bf16 autocast, channels_last, torch.compile."""
    import torch
    import torch.nn.functional as F
    import torchvision

    device = torch.device(p["device"])
    torch.backends.cudnn.benchmark = True
    cl = torch.channels_last
    model = torchvision.models.get_model(p["model"], num_classes=p["num_classes"])
    model = model.to(device=device, memory_format=cl)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=device.type == "cuda")
    step_model = torch.compile(model) if p["compile"] else model
    s = p["image_size"]
    x = torch.randn(p["batch"], 3, s, s, device=device).contiguous(memory_format=cl)
    y = torch.randint(0, p["num_classes"], (p["batch"],), device=device)

    def step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(step_model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(p["warmup"]):
        step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(p["steps"]):
        loss = step()
    sync(device)
    sec = time.perf_counter() - t0
    rate = p["batch"] * p["steps"] / sec
    print(f"hand-written loop: {rate:,.1f} img/s, loss {loss.item():.3f}", flush=True)
    return {"img_per_s": rate}


def ref_lora_trainer(p: dict[str, Any]) -> dict[str, Any]:
    """transformers Trainer + peft, bf16=True, otherwise default settings."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from gpustation.runners.lib import llm

    device = torch.device(p["device"])
    torch.manual_seed(p["seed"])
    # Trainer's bf16=True keeps fp32 weights and autocasts: the model is fp32 here.
    loaded = llm.build_from_preset(p["preset"], p["seed"], device, torch.float32, p["seq_len"])
    model = get_peft_model(
        loaded.model,
        LoraConfig(
            r=p["lora_r"], lora_alpha=p["lora_alpha"], lora_dropout=0.0,
            target_modules="all-linear", bias="none", task_type="CAUSAL_LM",
        ),
    )  # fmt: skip
    ids, labels = llm.token_stream(None, loaded.tokenizer)
    blocks = llm.pack(ids, labels, p["seq_len"], min_blocks=p["batch"])
    # Enough rows for one epoch: no epoch-boundary work inside the timed steps.
    need = p["batch"] * (p["steps"] + p["warmup"] + 2)
    rows = [
        {"input_ids": blocks[i % len(blocks), 0], "labels": blocks[i % len(blocks), 1]}
        for i in range(need)
    ]
    marks: dict[str, float] = {}

    class Clock(TrainerCallback):  # type: ignore[misc]
        # Syncs only at the two timing marks, as the runner does.
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step in (p["warmup"], p["warmup"] + p["steps"]):
                sync(device)
                marks[str(state.global_step)] = time.perf_counter()

    out_dir = tempfile.mkdtemp(prefix="trainer-")
    targs = TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=p["batch"],
        max_steps=p["warmup"] + p["steps"],
        learning_rate=p["lr"],
        bf16=device.type == "cuda",
        use_cpu=device.type == "cpu",
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=targs, train_dataset=rows, callbacks=[Clock()])
    result = trainer.train()
    sec = marks[str(p["warmup"] + p["steps"])] - marks[str(p["warmup"])]
    tokens_per_s = p["batch"] * p["seq_len"] * p["steps"] / sec
    mem = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    print(
        f"Trainer + peft (bf16=True): {tokens_per_s:,.0f} tokens/s, "
        f"train loss {result.training_loss:.3f}, peak {mem or 0:,.0f} MiB",
        flush=True,
    )
    return {
        "tokens_per_s": tokens_per_s,
        "flops_per_token": llm.train_flops_per_token(model, p["seq_len"]),
        "mem_peak_mib": mem,
        "optim": str(targs.optim),
    }


def ref_generate(p: dict[str, Any]) -> dict[str, Any]:
    """``model.generate`` (greedy, KV cache) on the same model, prompts and lengths."""
    import torch

    from gpustation.runners.lib import llm

    device = torch.device(p["device"])
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    loaded = llm.build_from_preset(p["preset"], p["seed"], device, dtype, 2048)
    model = loaded.model.eval()
    tok = loaded.tokenizer
    ids, _ = llm.token_stream(None, tok)
    pool = llm.pack(ids, ids, p["prompt_len"], min_blocks=max(p["batch_sizes"]))[:, 0]
    out: dict[str, Any] = {}
    g = torch.Generator().manual_seed(0)
    for bs in p["batch_sizes"]:
        times = []
        for r in range(p["requests"] + 1):
            x = pool[torch.randint(0, len(pool), (bs,), generator=g)].to(device)
            sync(device)
            t0 = time.perf_counter()
            with torch.no_grad():
                model.generate(
                    input_ids=x, attention_mask=torch.ones_like(x),
                    max_new_tokens=p["new_tokens"], min_new_tokens=p["new_tokens"],
                    do_sample=False, pad_token_id=tok.pad_token_id,
                )  # fmt: skip
            sync(device)
            if r:  # the first request warms up
                times.append(time.perf_counter() - t0)
        times.sort()
        tps = bs * p["new_tokens"] * len(times) / sum(times)
        out[str(bs)] = {"tokens_per_s": tps, "latency_ms_p50": times[len(times) // 2] * 1e3}
        print(f"generate batch {bs}: {tps:,.0f} tokens/s", flush=True)
    return out


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


REFERENCES = {
    "matmul": ref_matmul,
    "resnet": ref_resnet,
    "lora-trainer": ref_lora_trainer,
    "generate": ref_generate,
}


# ----------------------------------------------------------------------------- parts


def part_matmul(cfg: dict[str, Any], res: dict[str, Any], budget: Budget, wd: Path) -> None:
    sizes = cfg["matmul_sizes"]
    s = run_runner(
        "matmul",
        ["--device", cfg["device"], "--sizes", ",".join(map(str, sizes)),
         "--precisions", cfg["matmul_precisions"], "--seconds", str(cfg["matmul_seconds"]),
         "--copy-mib", str(cfg["copy_mib"])],
        budget.cap(90, reserve=15), "matmul-runner", wd,
    )  # fmt: skip
    assert s is not None
    res["runner_bf16_tflops"] = s["bf16_tflops"]
    res["runner_table"] = s["tflops"]
    res["runner_best"] = s["best_tflops"]
    res["copy_bandwidth_gbs"] = s["copy_bandwidth_gbs"]
    # The reference runs right after, on an equally warm GPU, for the same time per size.
    ref = run_reference(
        "matmul",
        {"device": cfg["device"], "sizes": sizes, "seconds": cfg["matmul_seconds"]},
        budget.cap(60), "matmul-ref", wd,
    )  # fmt: skip
    res["reference_best_bf16_tflops"] = ref["best_tflops"]
    res["reference_per_size"] = ref["per_size"]
    res["ratio"] = s["bf16_tflops"] / ref["best_tflops"]
    res["target"] = ">= 0.95 of the best torch.matmul bf16 rate"
    res["pass"] = res["ratio"] >= 0.95


def part_resnet(cfg: dict[str, Any], res: dict[str, Any], budget: Budget, wd: Path) -> None:
    r = cfg["resnet"]
    ref = run_reference(
        "resnet",
        {"device": cfg["device"], "model": r["model"], "num_classes": r["num_classes"],
         "image_size": r["image_size"], "batch": r["batch"], "warmup": r["warmup"],
         "steps": r["steps"], "compile": r["compile"]},
        budget.cap(r["cap"], reserve=r["reserve"]), "resnet-ref", wd,
    )  # fmt: skip
    res["reference_img_per_s"] = ref["img_per_s"]
    common = ["--device", cfg["device"], "--model", r["model"],
              "--num-classes", str(r["num_classes"]), "--image-size", str(r["image_size"]),
              "--batch-size", str(r["batch"]), "--log-every", "10"]  # fmt: skip
    # resnet50-bf16 preset arguments, with the step counts of this benchmark.
    s = run_runner(
        "resnet",
        [*common, "--precision", "bf16", "--channels-last", "--cudnn-benchmark",
         "--compile" if r["compile"] else "--no-compile",
         "--warmup-steps", str(r["warmup"]), "--steps", str(r["warmup"] + r["steps"])],
        budget.cap(r["cap"], reserve=20), "resnet-bf16-runner", wd,
    )  # fmt: skip
    assert s is not None
    res["runner_img_per_s"] = s["img_per_s"]
    res["ratio"] = s["img_per_s"] / ref["img_per_s"]
    res["runner_mem_peak_mib"] = s["mem_peak_mib"]
    res["target"] = ">= 6400 img/s at batch 256 (seed: tuned loop 6719, plain fp32 2216)"
    res["pass"] = s["img_per_s"] >= 6400 if cfg["device"] == "cuda" else None
    try:
        # resnet50-fp32-baseline preset arguments.
        b = run_runner(
            "resnet",
            [*common, "--precision", "fp32", "--no-channels-last", "--no-compile",
             "--cudnn-benchmark", "--warmup-steps", "5", "--steps", str(5 + r["fp32_steps"])],
            budget.cap(60), "resnet-fp32-runner", wd,
        )  # fmt: skip
        assert b is not None
        res["fp32_baseline_img_per_s"] = b["img_per_s"]
    except Exception as exc:
        res["fp32_baseline_error"] = str(exc)


def part_lora(cfg: dict[str, Any], res: dict[str, Any], budget: Budget, wd: Path,
              matmul_tflops: float | None) -> None:  # fmt: skip
    for model_cfg in cfg["lora"]:
        name = model_cfg["preset"]
        out: dict[str, Any] = {"config": model_cfg}
        res[name] = out
        try:
            _lora_one(cfg, model_cfg, out, budget, wd, matmul_tflops)
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
            res.setdefault("errors", []).append(f"{name}: {out['error']}")
            print(f"[lora {name}] FAILED: {out['error']}", flush=True)
        _print_json_line(f"lora {name}", out)


def _lora_one(cfg: dict[str, Any], m: dict[str, Any], out: dict[str, Any], budget: Budget,
              wd: Path, matmul_tflops: float | None) -> None:  # fmt: skip
    s = run_runner(
        "lora",
        ["--device", cfg["device"], "--model-preset", m["preset"],
         "--batch-size", str(m["batch"]), "--seq-len", str(m["seq_len"]),
         "--steps", str(m["warmup"] + m["steps"]), "--warmup-steps", str(m["warmup"]),
         "--precision", "bf16" if cfg["device"] == "cuda" else "fp32",
         "--compile" if m["compile"] else "--no-compile",
         "--lora-r", "16", "--lora-alpha", "32", "--lora-dropout", "0", "--lr", "1e-3",
         "--log-every", "10", "--no-save-adapter"],
        budget.cap(m["cap"], reserve=m["reserve"][0]), f"lora-{m['preset']}-runner", wd,
    )  # fmt: skip
    assert s is not None
    out["runner_tokens_per_s"] = s["tokens_per_s"]
    out["runner_mem_peak_mib"] = s["mem_peak_mib"]
    out["runner_loss"] = [s["first_loss"], s["final_loss"]]
    out["params"] = s["params"]
    flops = s["flops_per_token"]
    out["flops_per_token"] = flops
    if matmul_tflops:
        out["runner_mfu"] = s["tokens_per_s"] * flops / 1e12 / matmul_tflops
    ref = run_reference(
        "lora-trainer",
        {"device": cfg["device"], "preset": m["preset"], "seed": 0, "batch": m["batch"],
         "seq_len": m["seq_len"], "steps": m["steps"], "warmup": m["warmup"],
         "lora_r": 16, "lora_alpha": 32, "lr": 1e-3},
        budget.cap(m["cap"], reserve=m["reserve"][1]), f"lora-{m['preset']}-trainer", wd,
    )  # fmt: skip
    out["trainer_tokens_per_s"] = ref["tokens_per_s"]
    out["trainer_mem_peak_mib"] = ref["mem_peak_mib"]
    out["trainer_optim"] = ref["optim"]
    out["speedup"] = s["tokens_per_s"] / ref["tokens_per_s"]
    if matmul_tflops:
        out["trainer_mfu"] = ref["tokens_per_s"] * flops / 1e12 / matmul_tflops
    out["target"] = ">= 1.3x the Trainer's tokens/s"
    out["pass"] = out["speedup"] >= 1.3


def part_infer(cfg: dict[str, Any], res: dict[str, Any], budget: Budget, wd: Path) -> None:
    i = cfg["infer"]
    s = run_runner(
        "infer",
        ["--device", cfg["device"], "--model-preset", i["preset"],
         "--batch-sizes", ",".join(map(str, i["batch_sizes"])),
         "--prompt-len", str(i["prompt_len"]), "--new-tokens", str(i["new_tokens"]),
         "--steps", str(i["requests"]),
         "--precision", "bf16" if cfg["device"] == "cuda" else "fp32"],
        budget.cap(i["cap"], reserve=20), "infer-runner", wd,
    )  # fmt: skip
    assert s is not None
    res["sweep"] = s["sweep"]
    try:
        ref = run_reference(
            "generate",
            {"device": cfg["device"], "preset": i["preset"], "seed": 0,
             "batch_sizes": i["batch_sizes"], "prompt_len": i["prompt_len"],
             "new_tokens": i["new_tokens"], "requests": i["ref_requests"]},
            budget.cap(i["cap"]), "infer-generate-ref", wd,
        )  # fmt: skip
        res["generate_reference"] = ref
        for row in res["sweep"]:
            g = ref.get(str(row["batch_size"]))
            if g:
                row["generate_tokens_per_s"] = g["tokens_per_s"]
                row["vs_generate"] = row["tokens_per_s"] / g["tokens_per_s"]
    except Exception as exc:
        res["generate_reference_error"] = str(exc)


def part_fsdp(cfg: dict[str, Any], res: dict[str, Any], budget: Budget, wd: Path) -> None:
    f = cfg["fsdp"]
    dev = cfg["device"]
    prec = "bf16" if dev == "cuda" else "fp32"
    shape = ["--device", dev, "--model-preset", f["preset"], "--batch-size", str(f["batch"]),
             "--seq-len", str(f["seq_len"]), "--steps", str(f["warmup"] + f["steps"]),
             "--warmup-steps", str(f["warmup"]), "--precision", prec,
             "--log-every", "5"]  # fmt: skip
    lo = run_runner(
        "lora",
        [*shape, "--compile" if f["compile"] else "--no-compile", "--lora-r", "16",
         "--lora-alpha", "32", "--no-save-adapter"],
        budget.cap(f["cap"], reserve=2 * f["cap"] // 3), "fsdp-vs-lora", wd,
    )  # fmt: skip
    assert lo is not None
    res["lora_tokens_per_s"] = lo["tokens_per_s"]
    res["lora_mem_peak_mib"] = lo["mem_peak_mib"]
    for offload in (False, True):
        key = "fsdp_offload" if offload else "fsdp"
        try:
            s = run_runner(
                "fsdp",
                [*shape, "--mode", "lora", "--no-activation-checkpointing",
                 "--offload" if offload else "--no-offload"],
                budget.cap(f["cap"], reserve=0 if offload else f["cap"] // 3), key, wd,
            )  # fmt: skip
            assert s is not None
        except Exception as exc:
            res[f"{key}_error"] = str(exc)
            continue
        res[f"{key}_tokens_per_s"] = s["tokens_per_s"]
        res[f"{key}_mem_peak_mib"] = s["mem_peak_mib"]
        res[f"{key}_host_rss_peak_mib"] = s["host_rss_peak_mib"]
        res[f"{key}_offload_applied"] = s["offload_effective"]
    if res.get("fsdp_tokens_per_s"):
        res["fsdp_vs_lora"] = res["fsdp_tokens_per_s"] / lo["tokens_per_s"]
        if res.get("fsdp_offload_tokens_per_s"):
            res["offload_slowdown"] = res["fsdp_tokens_per_s"] / res["fsdp_offload_tokens_per_s"]


def part_fsdpmax(cfg: dict[str, Any], res: dict[str, Any], budget: Budget, wd: Path) -> None:
    f = cfg["fsdpmax"]
    search_s = max(10.0, budget.left() - 20)
    s = run_runner(
        "fsdp",
        ["--device", cfg["device"], "--find-max-model", "--mode", "lora",
         "--hidden-size", str(f["hidden"]), "--batch-size", str(f["batch"]),
         "--seq-len", str(f["seq_len"]), "--find-start-layers", str(f["start_layers"]),
         "--find-max-seconds", f"{search_s:.0f}", "--find-trial-seconds", str(f["trial_s"]),
         "--precision", "bf16" if cfg["device"] == "cuda" else "fp32"],
        budget.cap(search_s + 15), "fsdp-find-max", wd,
    )  # fmt: skip
    assert s is not None
    res.update({k: v for k, v in s.items() if k != "find_max_model"})
    res["search"] = s.get("find_max_model")


def part_burnin(cfg: dict[str, Any], res: dict[str, Any], budget: Budget, wd: Path) -> None:
    minutes = cfg["burnin_minutes"]
    # A failing check exits 1 but still writes its summary: keep it.
    s = run_runner(
        "burnin", ["--device", cfg["device"], "--minutes", str(minutes)],
        budget.cap(minutes * 60 + 60), "burnin", wd, ok_codes=(0, 1),
    )  # fmt: skip
    assert s is not None
    res.update(s)


def part_graphs(cfg: dict[str, Any], res: dict[str, Any], budget: Budget, wd: Path) -> None:
    g = cfg["graphs"]
    dev = cfg["device"]
    prec = "bf16" if dev == "cuda" else "fp32"
    graphs = [True, False] if dev == "cuda" else [False]
    for on in graphs:
        key = "infer_graphs" if on else "infer_eager"
        try:
            s = run_runner(
                "infer",
                ["--device", dev, "--model-preset", g["preset"], "--batch-sizes", "1",
                 "--prompt-len", str(g["prompt_len"]), "--new-tokens", str(g["new_tokens"]),
                 "--steps", str(g["requests"]), "--warmup-requests", "2", "--precision", prec,
                 "--cuda-graphs" if on else "--no-cuda-graphs"],
                # Compiling the graphed decode step takes the longest: keep time for the
                # eager run and both resnet runs after it.
                budget.cap(g["cap"], reserve=g["later"] * (2 if on else 1) + g["later"]), key, wd,
            )  # fmt: skip
            assert s is not None
            row = s["sweep"][0]
            res[f"{key}_ms_per_token"] = row["per_token_ms_p50"]
            res[f"{key}_tokens_per_s"] = row["tokens_per_s"]
        except Exception as exc:
            res[f"{key}_error"] = str(exc)
    for on in graphs:
        key = "resnet_graphs" if on else "resnet_eager"
        try:
            s = run_runner(
                "resnet",
                ["--device", dev, "--model", g["resnet_model"], "--batch-size",
                 str(g["resnet_batch"]), "--image-size", str(g["image_size"]),
                 "--num-classes", str(g["num_classes"]), "--steps", str(g["resnet_steps"] + 10),
                 "--warmup-steps", "10", "--precision", prec, "--no-compile",
                 "--cuda-graphs" if on else "--no-cuda-graphs", "--log-every", "10"],
                budget.cap(g["cap"], reserve=g["later"] if on else 0), key, wd,
            )  # fmt: skip
            assert s is not None
            res[f"{key}_img_per_s"] = s["img_per_s"]
        except Exception as exc:
            res[f"{key}_error"] = str(exc)
    if res.get("infer_graphs_ms_per_token") and res.get("infer_eager_ms_per_token"):
        res["infer_graphs_speedup"] = (
            res["infer_eager_ms_per_token"] / res["infer_graphs_ms_per_token"]
        )
    if res.get("resnet_graphs_img_per_s") and res.get("resnet_eager_img_per_s"):
        res["resnet_graphs_speedup"] = (
            res["resnet_graphs_img_per_s"] / res["resnet_eager_img_per_s"]
        )


def part_profile(cfg: dict[str, Any], res: dict[str, Any], budget: Budget, wd: Path) -> None:
    p = cfg["profile"]
    out = Path(tempfile.mkdtemp(prefix="profile-", dir=wd))
    s = run_runner(
        "resnet",
        ["--device", cfg["device"], "--model", p["model"], "--batch-size", str(p["batch"]),
         "--image-size", str(p["image_size"]), "--num-classes", str(p["num_classes"]),
         "--steps", str(p["steps"]), "--warmup-steps", "5", "--profile-steps", str(p["profile"]),
         "--precision", "bf16" if cfg["device"] == "cuda" else "fp32", "--no-compile",
         "--output-dir", str(out), "--log-every", "5"],
        budget.cap(p["cap"]), "profile-resnet", wd,
    )  # fmt: skip
    assert s is not None
    top = json.loads((out / "profile" / "top_ops.json").read_text())
    res["trace"] = str(out / "profile" / "trace.json")
    res["trace_mib"] = round((out / "profile" / "trace.json").stat().st_size / 2**20, 1)
    res["step_ms"] = top["step_ms"]
    res["gpu_idle_pct"] = top.get("gpu_idle_pct")
    res["gpu_idle_between_kernels_ms"] = top.get("gpu_idle_between_kernels_ms")
    res["top_kernels"] = top.get("cuda_kernels", [])[:10]
    res["top_cpu_ops"] = top["cpu_ops"][:5]


# ----------------------------------------------------------------------------- config, report


def config(device: str, tiny: bool) -> dict[str, Any]:
    if tiny:
        return {
            "device": device,
            "matmul_sizes": [64, 128], "matmul_seconds": 0.05,
            "matmul_precisions": "fp32,bf16", "copy_mib": 8,
            "resnet": {"model": "resnet18", "num_classes": 10, "image_size": 32, "batch": 4,
                       "warmup": 1, "steps": 3, "fp32_steps": 2, "compile": False, "cap": 120,
                       "reserve": 0},
            "lora": [{"preset": "tiny", "batch": 4, "seq_len": 32, "warmup": 1, "steps": 3,
                      "compile": False, "cap": 120, "reserve": [0, 0]}],
            "infer": {"preset": "tiny", "batch_sizes": [1, 2], "prompt_len": 8,
                      "new_tokens": 4, "requests": 2, "ref_requests": 2, "cap": 120},
            "fsdp": {"preset": "tiny", "batch": 2, "seq_len": 16, "warmup": 1, "steps": 2,
                     "compile": False, "cap": 120},
            "fsdpmax": {"hidden": 64, "batch": 2, "seq_len": 16, "start_layers": 2,
                        "trial_s": 60},
            "burnin_minutes": 0.02,
            "graphs": {"preset": "tiny", "prompt_len": 8, "new_tokens": 4, "requests": 2,
                       "resnet_model": "resnet18", "resnet_batch": 2, "image_size": 32,
                       "num_classes": 10, "resnet_steps": 2, "cap": 120, "later": 0},
            "profile": {"model": "resnet18", "batch": 2, "image_size": 32, "num_classes": 10,
                        "steps": 8, "profile": 2, "cap": 120},
        }  # fmt: skip
    return {
        "device": device,
        "matmul_sizes": [4096, 8192, 12288, 16384], "matmul_seconds": 0.4,
        "matmul_precisions": "fp32,tf32,fp16,bf16,fp8", "copy_mib": 2048,
        "resnet": {"model": "resnet50", "num_classes": 1000, "image_size": 224, "batch": 256,
                   "warmup": 15, "steps": 50, "fp32_steps": 25, "compile": True, "cap": 150,
                   "reserve": 75},
        "lora": [
            {"preset": "default", "batch": 32, "seq_len": 512, "warmup": 10, "steps": 50,
             "compile": True, "cap": 110, "reserve": [115, 95]},
            {"preset": "1b", "batch": 8, "seq_len": 1024, "warmup": 8, "steps": 30,
             "compile": True, "cap": 140, "reserve": [35, 0]},
        ],
        "infer": {"preset": "default", "batch_sizes": [1, 4, 16, 64], "prompt_len": 128,
                  "new_tokens": 128, "requests": 8, "ref_requests": 3, "cap": 90},
        # ~1B model: FSDP on one GPU against the plain lora runner, then with offload.
        "fsdp": {"preset": "1b", "batch": 8, "seq_len": 1024, "warmup": 4, "steps": 10,
                 "compile": True, "cap": 100},
        # Llama-7B width: 205M parameters a layer; layers doubled from 32, then bisected.
        "fsdpmax": {"hidden": 4096, "batch": 2, "seq_len": 1024, "start_layers": 32,
                    "trial_s": 70},
        "burnin_minutes": 2,
        "graphs": {"preset": "default", "prompt_len": 128, "new_tokens": 128, "requests": 5,
                   "resnet_model": "resnet50", "resnet_batch": 32, "image_size": 224,
                   "num_classes": 1000, "resnet_steps": 40, "cap": 75, "later": 22},
        "profile": {"model": "resnet50", "batch": 128, "image_size": 224, "num_classes": 1000,
                    "steps": 15, "profile": 3, "cap": 60},
    }  # fmt: skip


def _print_json_line(label: str, data: Any) -> None:
    print(f"== {label}: {json.dumps(data, default=str)}", flush=True)


def _f(v: Any, spec: str = ",.1f") -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "n/a"


def markdown(results: dict[str, Any]) -> str:
    env = results.get("environment", {})
    lines = [
        f"### gpu_runners — {env.get('gpu', '?')}, torch {env.get('torch', '?')}, "
        f"transformers {env.get('transformers', '?')}, peft {env.get('peft', '?')}",
        "",
        "| measurement | gpustation | reference (same run) | ratio | target | pass |",
        "|---|---|---|---|---|---|",
    ]
    m = results.get("matmul", {})
    if "ratio" in m:
        lines.append(
            f"| matmul bf16 TFLOP/s | {_f(m['runner_bf16_tflops'])} | best torch.matmul "
            f"{_f(m['reference_best_bf16_tflops'])} | {_f(m['ratio'], '.3f')} | >= 0.95 | "
            f"{m['pass']} |"
        )
    r = results.get("resnet", {})
    if "ratio" in r:
        lines.append(
            f"| resnet50-bf16 img/s (batch 256) | {_f(r['runner_img_per_s'])} | tuned loop "
            f"{_f(r['reference_img_per_s'])}; fp32 baseline "
            f"{_f(r.get('fp32_baseline_img_per_s'))} | {_f(r['ratio'], '.3f')} | >= 6,400 | "
            f"{r['pass']} |"
        )
    for name, lo in results.get("lora", {}).items():
        if isinstance(lo, dict) and "speedup" in lo:
            c = lo["config"]
            lines.append(
                f"| lora {name} tokens/s (batch {c['batch']} x {c['seq_len']}) | "
                f"{_f(lo['runner_tokens_per_s'], ',.0f')} (MFU {_f(lo.get('runner_mfu'), '.1%')})"
                f" | Trainer+peft bf16=True {_f(lo['trainer_tokens_per_s'], ',.0f')} (MFU "
                f"{_f(lo.get('trainer_mfu'), '.1%')}) | {_f(lo['speedup'], '.2f')}x | >= 1.3x | "
                f"{lo['pass']} |"
            )
    inf = results.get("infer", {})
    if "sweep" in inf:
        lines += [
            "",
            "| infer batch | TTFT ms | ms/token | p50 ms | p99 ms | tokens/s | generate() tok/s |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in inf["sweep"]:
            lines.append(
                f"| {row['batch_size']} | {_f(row['ttft_ms_p50'])} | "
                f"{_f(row['per_token_ms_p50'], '.2f')} | {_f(row['latency_ms_p50'], ',.0f')} | "
                f"{_f(row['latency_ms_p99'], ',.0f')} | {_f(row['tokens_per_s'], ',.0f')} | "
                f"{_f(row.get('generate_tokens_per_s'), ',.0f')} |"
            )
    mt = m.get("runner_table")
    if mt:
        sizes = list(next(iter(mt.values())).keys())
        lines += ["", "| precision | " + " | ".join(f"N={s}" for s in sizes) + " |",
                  "|---|" + "---|" * len(sizes)]  # fmt: skip
        for prec, row in mt.items():
            lines.append(f"| {prec} | " + " | ".join(_f(row[s]) for s in sizes) + " |")
        lines.append(f"\ndevice copy bandwidth: {_f(m.get('copy_bandwidth_gbs'), ',.0f')} GB/s")
    lines += markdown_figures(results)
    errors = dict(results.get("errors", {}))
    for name, lo in results.get("lora", {}).items():
        if isinstance(lo, dict) and "error" in lo:
            errors[f"lora {name}"] = lo["error"]
    if errors:
        lines += ["", "Errors: " + "; ".join(f"{k}: {v}" for k, v in errors.items())]
    return "\n".join(lines)


def _x(v: Any) -> str:
    return f"{v:.2f}x" if isinstance(v, (int, float)) else "n/a"


def markdown_figures(results: dict[str, Any]) -> list[str]:
    """Rows for the figures parts (FSDP, burn-in, CUDA graphs, profile)."""
    lines: list[str] = []
    f = results.get("fsdp", {})
    if "lora_tokens_per_s" in f:
        lines += [
            "",
            "| FSDP (1 GPU, lora, ~1B) | tokens/s | GPU peak MiB | host RSS MiB |",
            "|---|---|---|---|",
            f"| plain lora runner | {_f(f['lora_tokens_per_s'], ',.0f')} | "
            f"{_f(f.get('lora_mem_peak_mib'), ',.0f')} | |",
        ]
        for key, name in (("fsdp", "fsdp, no offload"), ("fsdp_offload", "fsdp, --offload")):
            lines.append(
                f"| {name} | {_f(f.get(f'{key}_tokens_per_s'), ',.0f')} | "
                f"{_f(f.get(f'{key}_mem_peak_mib'), ',.0f')} | "
                f"{_f(f.get(f'{key}_host_rss_peak_mib'), ',.0f')} |"
            )
    m = results.get("fsdpmax", {})
    if "no_offload_max_layers" in m:

        def largest(key: str) -> str:
            if not m.get(f"{key}_max_layers"):
                return "none fitted in the time given"
            return (f"{m[f'{key}_max_layers']} layers ({m[f'{key}_max_params'] / 1e9:.1f}B "
                    f"params, {_f(m.get(f'{key}_tokens_per_s'), ',.0f')} tokens/s)")  # fmt: skip

        lines += ["", f"largest lora model at hidden {m.get('hidden_size')}: without offload "
                  f"{largest('no_offload')}; with offload {largest('offload')}"]  # fmt: skip
    b = results.get("burnin", {})
    if "checks" in b:
        lines += [
            "",
            f"burn-in ({b.get('seconds')} s): {b.get('result')}; "
            f"{_f(b.get('matmul_tflops'))} TFLOP/s {b.get('matmul_precision')}, "
            f"{b.get('matmul_mismatches')} mismatches, {b.get('memory_errors')} memory "
            f"errors over {_f(b.get('memory_tested_mib'), ',.0f')} MiB, PCIe "
            f"Gen{b.get('pcie_gen_under_load')} x{b.get('pcie_width_under_load')} "
            f"{_f(b.get('h2d_gbs'))}/{_f(b.get('d2h_gbs'))} GB/s, peak "
            f"{b.get('peak_temp_c')} °C, {b.get('peak_power_w')}/{b.get('power_limit_w')} W",
        ]
        lines += [f"- {c['status']}: {c['name']}: {c['detail']}" for c in b["checks"]]
    g = results.get("graphs", {})
    if any(k.endswith("_ms_per_token") or k.endswith("_img_per_s") for k in g):
        lines += [
            "",
            "| CUDA graphs | without | with | speed-up |",
            "|---|---|---|---|",
            f"| infer ms/token, batch 1 | {_f(g.get('infer_eager_ms_per_token'), '.2f')} | "
            f"{_f(g.get('infer_graphs_ms_per_token'), '.2f')} | "
            f"{_x(g.get('infer_graphs_speedup'))} |",
            f"| resnet img/s (eager) | {_f(g.get('resnet_eager_img_per_s'))} | "
            f"{_f(g.get('resnet_graphs_img_per_s'))} | "
            f"{_x(g.get('resnet_graphs_speedup'))} |",
        ]
    p = results.get("profile", {})
    if "step_ms" in p:
        idle = _f(p.get("gpu_idle_pct"), ".1f")
        lines += ["", f"profile: step {_f(p['step_ms'], '.1f')} ms, GPU idle {idle} %, "
                  f"trace {p.get('trace_mib')} MiB"]  # fmt: skip
        for k in p.get("top_kernels", [])[:5]:
            lines.append(f"- {k['share']:.1%} {k['name'][:90]} ({k['calls']} calls)")
    return lines


def environment(device: str) -> dict[str, Any]:
    code = (
        "import json,torch,transformers,peft;"
        "d={'torch':torch.__version__,'transformers':transformers.__version__,"
        "'peft':peft.__version__,'cuda':torch.version.cuda};"
        "d['gpu']=torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu';"
        "print(json.dumps(d))"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, env=child_env())  # fmt: skip
        data: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        data["device"] = device
        return data
    except Exception as exc:
        return {"error": str(exc), "device": device}


FIGURE_PARTS = {
    "fsdp": part_fsdp,
    "fsdpmax": part_fsdpmax,
    "burnin": part_burnin,
    "graphs": part_graphs,
    "profile": part_profile,
}


def expand_parts(text: str) -> list[str]:
    """``"classic,burnin"`` -> the parts in order, groups expanded, each once."""
    out: list[str] = []
    for item in (p.strip() for p in text.split(",")):
        for part in GROUPS.get(item, (item,) if item else ()):
            if part not in out:
                out.append(part)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", default="gpu_runners.json", help="JSON results file")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="toy sizes (check the script on a CPU)")
    ap.add_argument(
        "--parts",
        default="classic",
        help=f"comma-separated parts: {', '.join(PARTS)}; or a group: classic "
        f"({','.join(CLASSIC)}), figures ({','.join(FIGURES)}), all",
    )
    ap.add_argument("--budget-s", type=float, default=520, help="wall-clock cap for everything")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-params", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        result = REFERENCES[args.child](json.loads(args.child_params))
        Path(args.child_out).write_text(json.dumps(result))
        return 0

    budget = Budget(args.budget_s)

    cfg = config(args.device, args.tiny)
    parts = expand_parts(args.parts)
    out_path = Path(args.out)
    results: dict[str, Any] = {"environment": environment(args.device), "config": cfg,
                               "errors": {}}  # fmt: skip
    _print_json_line("environment", results["environment"])
    workdir = Path(tempfile.mkdtemp(prefix="gpu-runners-"))
    t_start = time.monotonic()

    def save() -> None:
        results["elapsed_s"] = round(time.monotonic() - t_start, 1)
        out_path.write_text(json.dumps(results, indent=2, default=str))

    for n, part in enumerate(parts):
        weights_left = sum(PART_WEIGHTS.get(p, 0.1) for p in parts[n:])
        part_budget = budget.share(PART_WEIGHTS.get(part, 0.1), weights_left)
        print(f"\n=== {part} (up to {part_budget.left():.0f}s) ===", flush=True)
        res: dict[str, Any] = {}
        results[part] = res
        t0 = time.monotonic()
        try:
            if part == "matmul":
                part_matmul(cfg, res, part_budget, workdir)
            elif part == "resnet":
                part_resnet(cfg, res, part_budget, workdir)
            elif part == "lora":
                mm = results.get("matmul", {}).get("reference_best_bf16_tflops")
                part_lora(cfg, res, part_budget, workdir, mm)
            elif part == "infer":
                part_infer(cfg, res, part_budget, workdir)
            elif part in FIGURE_PARTS:
                FIGURE_PARTS[part](cfg, res, part_budget, workdir)
            else:
                raise ValueError(f"unknown part {part!r}; choose from {PARTS}")
        except Exception as exc:
            results["errors"][part] = f"{type(exc).__name__}: {exc}"
            print(f"[{part}] FAILED: {results['errors'][part]}", flush=True)
        res["seconds"] = round(time.monotonic() - t0, 1)
        _print_json_line(part, res)
        save()

    print("\n" + markdown(results), flush=True)
    print(f"\nresults: {out_path.resolve()}  ({time.monotonic() - t_start:.0f}s)", flush=True)
    return 0 if not results["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
