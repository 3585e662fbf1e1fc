"""The runners against references measured in the same run, on one GPU.

    PYTHONUNBUFFERED=1 python bench/gpu_runners.py --out /tmp/gpu_runners.json

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
PARTS = ("matmul", "resnet", "lora", "infer")


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
PART_WEIGHTS = {"matmul": 0.13, "resnet": 0.36, "lora": 0.38, "infer": 0.13}


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
    name: str, args: list[str], timeout: float, label: str, workdir: Path
) -> dict[str, Any] | None:
    """``python -m gpustation.runners.NAME ARGS`` with a metrics file; its summary."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=workdir))
    metrics = run_dir / "metrics.jsonl"
    env = child_env({"GPUSTATION_METRICS_FILE": str(metrics), "GPUSTATION_RUN_DIR": str(run_dir)})
    rc = run_child([sys.executable, "-m", f"gpustation.runners.{name}", *args], timeout, label, env)
    summary = read_summary(metrics)
    if rc != 0 or summary is None:
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

    from gpustation.runners import llm

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

    from gpustation.runners import llm

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
    errors = dict(results.get("errors", {}))
    for name, lo in results.get("lora", {}).items():
        if isinstance(lo, dict) and "error" in lo:
            errors[f"lora {name}"] = lo["error"]
    if errors:
        lines += ["", "Errors: " + "; ".join(f"{k}: {v}" for k, v in errors.items())]
    return "\n".join(lines)


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_runners.json", help="JSON results file")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="toy sizes (check the script on a CPU)")
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of parts")
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
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
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
