"""Memory temperature as gpustation reads it, beside nvidia-smi, idle and under load.

Each reading pairs one ``gpustation snapshot --json`` with one
``nvidia-smi --query-gpu=temperature.gpu,temperature.memory`` started at the
same moment (two threads), so both see the card at about the same instant.
First ``--idle`` readings with nothing on the GPU, then a bf16 matmul loop
(torch) runs for ``--load-s`` seconds and a reading is taken every
``--every-s`` seconds while it runs. The table gives each pair and the
largest difference; ``--out FILE`` writes the readings as JSON.

Read-only: nothing on the card is changed.

    python bench/memory_temperature.py --gpu 0 --load-s 60
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

MATMUL = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("loaded", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""


def gpustation_reading(gpu: int, out: dict[str, Any]) -> None:
    doc = json.loads(
        subprocess.run(
            [sys.executable, "-m", "gpustation", "snapshot", "--json", "--gpus", str(gpu)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    card = doc["gpus"][0]
    out["gpustation"] = {
        "temperature_c": card.get("temperature_c"),
        "memory_temperature_c": card.get("memory_temperature_c"),
        "memory_temperature_max_c": card.get("memory_temperature_max_c"),
        "temperature_margin_c": card.get("temperature_margin_c"),
        "temperature_gpu_max_c": card.get("temperature_gpu_max_c"),
        "simulated": doc.get("simulated"),
    }


def smi_reading(gpu: int, out: dict[str, Any]) -> None:
    line = subprocess.run(
        [
            "nvidia-smi",
            "-i",
            str(gpu),
            "--query-gpu=temperature.gpu,temperature.memory",
            "--format=csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    core, memory = (part.strip() for part in line.split(","))
    out["nvidia-smi"] = {"temperature_c": float(core), "memory_temperature_c": float(memory)}


def reading(gpu: int, phase: str) -> dict[str, Any]:
    out: dict[str, Any] = {"phase": phase, "time": time.time()}
    threads = [
        threading.Thread(target=gpustation_reading, args=(gpu, out)),
        threading.Thread(target=smi_reading, args=(gpu, out)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ours = out["gpustation"]["memory_temperature_c"]
    theirs = out["nvidia-smi"]["memory_temperature_c"]
    out["difference_c"] = None if ours is None else round(ours - theirs, 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--idle", type=int, default=3)
    parser.add_argument("--load-s", type=float, default=60.0)
    parser.add_argument("--every-s", type=float, default=10.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    readings = [reading(args.gpu, "idle") for _ in range(args.idle)]
    env = {"CUDA_VISIBLE_DEVICES": str(args.gpu)}
    load = subprocess.Popen(
        [sys.executable, "-c", MATMUL, str(args.load_s)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    assert load.stdout is not None
    load.stdout.readline()  # the matmuls start once the tensors are on the card
    started = time.monotonic()
    while load.poll() is None and time.monotonic() - started < args.load_s - 2:
        next_at = started + args.every_s * (1 + len(readings) - args.idle)
        try:  # the next reading's moment, or the load's end, whichever comes first
            load.wait(timeout=max(0.0, next_at - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        if load.poll() is not None:
            break
        readings.append(reading(args.gpu, "bf16 load"))
    load.wait()

    print(f"{'phase':10} {'gpustation C':>12} {'nvidia-smi C':>12} {'diff':>6}  core C (ours/smi)")
    for r in readings:
        g, s = r["gpustation"], r["nvidia-smi"]
        print(
            f"{r['phase']:10} {g['memory_temperature_c']!s:>12} {s['memory_temperature_c']:>12}"
            f" {r['difference_c']!s:>6}  {g['temperature_c']}/{s['temperature_c']}"
        )
    diffs = [abs(r["difference_c"]) for r in readings if r["difference_c"] is not None]
    first = readings[0]["gpustation"]
    print(
        f"memory maximum {first['memory_temperature_max_c']} C, GPU maximum"
        f" {first['temperature_gpu_max_c']} C, margin {first['temperature_margin_c']} C;"
        f" largest difference {max(diffs) if diffs else 'n/a'} C over {len(readings)} readings"
    )
    if args.out:
        args.out.write_text(json.dumps(readings, indent=1))
    return 0 if diffs and len(diffs) == len(readings) else 1


if __name__ == "__main__":
    raise SystemExit(main())
