"""Two runs on one real GPU at once: each one's energy beside the driver's counter.

Starts two ``gpustation run --detach --gpus GPU`` commands at the same moment:
a bf16 matmul loop (compute-bound) and a device-to-device copy loop
(memory-bound), each for ``--seconds``. When both have ended it prints each
run's recorded energy (marked estimated) and its mean SM share from the
samples of its telemetry; the rest of the GPU's energy account
(``runs/gpushare.py``: other processes, idle, unattributed); and the driver's
counter over the account's entries, read from the runs' own telemetry, which
the runs' energies and the rest should match within 1 %.

    python bench/shared_energy.py --gpu 0 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MATMUL = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
"""

COPY = """
import time, torch
src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
dst = torch.empty_like(src)
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    for _ in range(20):
        dst.copy_(src)
    torch.cuda.synchronize()
"""


def gs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpustation", *args], capture_output=True, text=True, check=False
    )


def trace(path: Path, gpu: int) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        sample = json.loads(line)
        for g in sample["gpus"]:
            if g["index"] == gpu:
                rows.append({"time": sample["time"], **g})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    from gpustation.runs import rundir

    ids = {}
    procs = {}
    for name, code in (("matmul", MATMUL), ("copy", COPY)):
        argv = ["run", "--detach", "--gpus", str(args.gpu), "--name", f"shared-{name}", "--"]
        argv += [sys.executable, "-c", code.format(seconds=args.seconds)]
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "gpustation", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            print(f"{name}: gpustation run failed: {err}", file=sys.stderr)
            return 1
        ids[name] = out.strip().splitlines()[-1]
    deadline = time.monotonic() + args.seconds + 300
    records = {}
    while len(records) < len(ids):
        if time.monotonic() > deadline:
            print("the runs did not end in time", file=sys.stderr)
            return 1
        for name, run_id in ids.items():
            doc = json.loads(gs("runs", "show", run_id, "--json").stdout or "{}")
            if doc.get("status") in rundir.FINAL_STATUSES:
                records[name] = doc
        time.sleep(1.0)
    traces = {
        name: trace(rundir.run_dir(run_id) / rundir.TELEMETRY_FILE, args.gpu)
        for name, run_id in ids.items()
    }
    from gpustation.runs.gpushare import accounts_dir

    counters = sorted(
        (row["time"], row["energy_j"])
        for rows in traces.values()
        for row in rows
        if row.get("energy_j") is not None
    )
    (account,) = accounts_dir().glob("*.json")
    entries = json.loads(account.read_text())["entries"]
    t0, t1 = entries[0]["t0"], entries[-1]["t1"]

    # the driver's counter over the account's span, as the runs read it
    def reading(t: float) -> float:
        return min(counters, key=lambda c: abs(c[0] - t))[1]

    counter = reading(t1) - reading(t0)
    rest: dict[str, float] = {}
    for entry in entries:
        for key, joules in entry["parts"].items():
            if not key.startswith("run:"):
                rest[key] = rest.get(key, 0.0) + joules
    total = 0.0
    for name, doc in records.items():
        shares = [row["run_share"] for row in traces[name] if "run_share" in row]
        mean = sum(shares) / len(shares) if shares else float("nan")
        energy = doc.get("energy_j") or 0.0
        total += energy
        print(
            f"{name:>7}: {energy / 1000:8.2f} kJ  estimated={doc.get('energy_estimated')}"
            f"  status={doc.get('status')}  mean share {mean:.3f} over {len(shares)} samples"
        )
    for key, joules in sorted(rest.items()):
        print(f"{key:>7}: {joules / 1000:8.2f} kJ")
    parts = total + sum(rest.values())
    print(f"  parts: {parts / 1000:8.2f} kJ ({len(entries)} entries of the GPU's account)")
    print(f"counter: {counter / 1000:8.2f} kJ over {t1 - t0:.1f} s")
    print(f"  ratio: {parts / counter:.4f} (within 1 %: {abs(parts / counter - 1) <= 0.01})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
