"""Read-only check of the GPM and per-process readings on a real GPU (an H200).

    PYTHONUNBUFFERED=1 python bench/gpm_check.py [--gpu 0] [--seconds 10] [--out FILE]

Three phases, each ``--seconds`` long, on one GPU: a bf16 matmul loop, an
fp32 matmul loop with TF32 off (so the tensor cores should stay idle), and
idle. The load runs in a child process (so it shows in NVML's process list
as a process of its own); this process reads the GPU once a second through
gpustation's NVML backend and sampler, as ``gpustation snapshot --json``
does, with the profiling metrics asked for. It prints, per phase, the
median and range of ``sm_active_pct``, ``tensor_active_pct``,
``sm_occupancy_pct`` and ``dram_active_pct``, and the sum of the processes'
``sm_pct`` against the GPU's ``utilization_gpu_pct``.

It changes no GPU setting: no power limit, clock, fan, persistence, ECC,
compute or MIG mode. TF32 off is a setting of the child's PyTorch, not of the
card. The only NVML calls are the backend's readers. Leave
CUDA_VISIBLE_DEVICES unset: ``--gpu`` is NVML's index and the child's CUDA one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LOAD = r"""
import sys, time, torch
dtype, seconds, gpu = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
torch.cuda.set_device(gpu)
torch.backends.cuda.matmul.allow_tf32 = False  # a process setting of PyTorch, not of the GPU
torch.backends.cudnn.allow_tf32 = False
t = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
n = 8192
a = torch.randn(n, n, device="cuda", dtype=t)
b = torch.randn(n, n, device="cuda", dtype=t)
torch.cuda.synchronize()
print("ready", flush=True)
end = time.monotonic() + seconds
flops = 0
start = time.monotonic()
while time.monotonic() < end:
    for _ in range(8):
        c = a @ b
    torch.cuda.synchronize()
    flops += 8 * 2 * n ** 3
print(f"tflops {flops / (time.monotonic() - start) / 1e12:.1f}", flush=True)
"""

FIELDS = ("sm_active_pct", "tensor_active_pct", "sm_occupancy_pct", "dram_active_pct")


def summary(values: list[float | None]) -> dict[str, Any]:
    got = [v for v in values if v is not None]
    if not got:
        return {"median": None, "min": None, "max": None, "n": 0, "missing": len(values)}
    return {
        "median": round(statistics.median(got), 1),
        "min": round(min(got), 1),
        "max": round(max(got), 1),
        "n": len(got),
        "missing": len(values) - len(got),
    }


def phase(sampler: Any, gpu: int, name: str, seconds: float) -> dict[str, Any]:
    child = None
    tflops = None
    if name != "idle":
        child = subprocess.Popen(
            [sys.executable, "-c", LOAD, name, str(seconds + 2), str(gpu)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            child.wait()
            raise SystemExit(f"{name}: the load did not start (is torch with CUDA installed?)")
        time.sleep(1.0)  # past the first kernels' ramp
    rows: list[dict[str, Any]] = []
    sampler.sample()  # pairs the first GPM sample of the phase
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        snap = sampler.sample()
        g = snap.gpu(gpu)
        assert g is not None
        procs = [p for p in g.processes if p.sm_pct is not None]
        rows.append(
            {
                **{f: getattr(g, f) for f in FIELDS},
                "util": g.utilization_gpu_pct,
                "proc_sm_sum": sum(p.sm_pct or 0.0 for p in procs) if procs else None,
                "procs": {p.pid: p.sm_pct for p in g.processes},
            }
        )
    if child is not None:
        out, _ = child.communicate(timeout=60)
        for line in out.splitlines():
            if line.startswith("tflops"):
                tflops = float(line.split()[1])
    result = {f: summary([r[f] for r in rows]) for f in FIELDS}
    result["utilization_gpu_pct"] = summary([r["util"] for r in rows])
    result["process_sm_pct_sum"] = summary([r["proc_sm_sum"] for r in rows])
    result["load_pid"] = child.pid if child is not None else None
    result["load_pid_sm_pct"] = summary(
        [r["procs"].get(child.pid) for r in rows] if child is not None else []
    )
    result["tflops"] = tflops
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from gpustation.telemetry.nvml import NvmlBackend
    from gpustation.telemetry.sampler import Sampler

    backend = NvmlBackend()
    backend.read_gpm = True  # as snapshot --json and the exporter do
    try:
        sampler = Sampler(backend, gpus=[args.gpu], with_host=False, with_topology=False)
        first = sampler.sample(slow=True).gpu(args.gpu)
        assert first is not None
        print(f"GPU {args.gpu}: {first.name}, driver {backend.driver_version()}")
        print(f"  MIG: {first.mig}, remapped rows: {first.remapped_rows}")
        print(f"  NVLink: {first.nvlink}, XID watching: {first.xid_events is not None}")
        results: dict[str, Any] = {}
        for name in ("bf16", "fp32", "idle"):
            results[name] = phase(sampler, args.gpu, name, args.seconds)
            r = results[name]
            print(f"\n{name}: tflops {r['tflops']}")
            for f in (*FIELDS, "utilization_gpu_pct", "process_sm_pct_sum", "load_pid_sm_pct"):
                print(f"  {f:<22} {r[f]}")
        print(
            "\nexpected: bf16 tensor high (~88 % measured before), fp32 tensor ~0 with SM active "
            "high, idle everything 0; process SM sum near the GPU utilisation under load"
        )
        if backend.errors:
            print(f"NVML errors: {backend.errors}")
        if args.out:
            args.out.write_text(json.dumps(results, indent=2))
    finally:
        backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
