"""The GPU queue on simulated GPUs: how soon a queued run starts once its GPU is free, and
whether many submitters at once ever give one GPU to two runs or lose a run, with the
scheduler SIGKILLed along the way.

    python bench/queue_bench.py [--runs 20] [--submitters 4] [--per-submitter 50] [--kills 2]

Latency: runs queued for GPU 0 one behind the other; for each, the time from the end of
the run before it (its supervisor's recorded end) to its own child's start. Then
``--submitters`` processes each queue ``--per-submitter`` runs for any one of 2 GPUs at
once while the scheduler is killed ``--kills`` times; every run must end ``succeeded``
and no two runs' lives on one GPU may overlap.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def env_for(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    for kind in ("config", "data", "state"):
        (root / kind).mkdir(parents=True, exist_ok=True)
        env[f"GPUSTATION_{kind.upper()}_DIR"] = str(root / kind)
    env["GPUSTATION_SIMULATE"] = "2"
    env["PYTHONPATH"] = str(REPO)
    return env


def gs(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "gpustation", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"gpustation {' '.join(args)}: {done.stderr}")
    return done.stdout.strip()


def states(env: dict[str, str], ids: list[str]) -> dict[str, dict]:
    import json

    root = Path(env["GPUSTATION_DATA_DIR"]) / "runs"
    out = {}
    for run_id in ids:
        try:
            state = json.loads((root / run_id / "state.json").read_text())
            run = json.loads((root / run_id / "run.json").read_text())
        except (OSError, ValueError):
            continue
        out[run_id] = {**state, "gpus": run.get("gpus") or []}
    return out


def wait_all(env: dict[str, str], ids: list[str], timeout: float) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        found = states(env, ids)
        done = [
            s
            for s in found.values()
            if s.get("status") in ("succeeded", "failed", "stopped", "lost")
        ]
        if len(done) == len(ids) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def idle_cards(env: dict[str, str]) -> None:
    code = (
        "from gpustation.telemetry.sim import SimBackend\n"
        "b = SimBackend.open(count=2, card=None)\n"
        "[b.poke(i, load=0.0) for i in range(2)]\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def scheduler_pid(env: dict[str, str]) -> int | None:
    """The scheduler holding the lock now (a PID left in the file by one that
    ended may belong to another process since: never signal that one)."""
    import fcntl

    lock = Path(env["GPUSTATION_DATA_DIR"]) / "queue" / "scheduler.lock"
    try:
        with open(lock, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                pid = int(handle.read().strip() or 0)
            else:
                fcntl.flock(handle, fcntl.LOCK_UN)
                return None  # nobody holds it
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"gpustation.runs.queue.scheduler" in cmdline else None


def latency(runs: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        env = env_for(Path(tmp))
        idle_cards(env)
        gs(env, "queue", "pause")
        ids = [
            gs(env, "run", "--queue", "--gpus", "0", "--", sys.executable, "-c", "pass")
            for _ in range(runs)
        ]
        gs(env, "queue", "resume")
        found = wait_all(env, ids, 60 + 10 * runs)
        gaps = []
        for before, after in itertools.pairwise(ids):
            a, b = found.get(before, {}), found.get(after, {})
            if a.get("ended_at") and b.get("started_at"):
                gaps.append(b["started_at"] - a["ended_at"])
        return gaps


def crowd(submitters: int, per: int, kills: int) -> tuple[int, int, int, float]:
    """(runs, succeeded, overlaps, seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = env_for(Path(tmp))
        idle_cards(env)
        t0 = time.monotonic()

        def submit(_: int) -> list[str]:
            return [
                gs(env, "run", "--queue", "--gpus-count", "1", "--", sys.executable, "-c", "pass")
                for _ in range(per)
            ]

        with ThreadPoolExecutor(submitters) as pool:
            futures = [pool.submit(submit, i) for i in range(submitters)]
            killed = 0
            while killed < kills and not all(f.done() for f in futures):
                pid = scheduler_pid(env)
                if pid is not None:
                    time.sleep(1.0)
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed += 1
                    except ProcessLookupError:
                        pass  # it left (the queue was empty for a moment)
                time.sleep(0.5)
            ids = [run_id for f in futures for run_id in f.result()]
        gs(env, "queue")  # any command brings a killed scheduler back
        found = wait_all(env, ids, 60 + 5 * len(ids))
        seconds = time.monotonic() - t0
        ok = sum(1 for s in found.values() if s.get("status") == "succeeded")
        overlaps = 0
        for gpu in (0, 1):
            lives = sorted(
                (s["started_at"], s["ended_at"])
                for s in found.values()
                if gpu in s["gpus"] and s.get("started_at") and s.get("ended_at")
            )
            overlaps += sum(1 for (_, end), (start, _) in itertools.pairwise(lives) if start < end)
        return len(ids), ok, overlaps, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--submitters", type=int, default=4)
    parser.add_argument("--per-submitter", type=int, default=50)
    parser.add_argument("--kills", type=int, default=2)
    args = parser.parse_args()
    gaps = latency(args.runs)
    if gaps:
        gaps.sort()
        p95 = gaps[min(len(gaps) - 1, round(0.95 * (len(gaps) - 1)))]
        print(
            f"start after the GPU is free: {len(gaps)} runs, "
            f"median {statistics.median(gaps):.2f} s, p95 {p95:.2f} s, max {gaps[-1]:.2f} s"
        )
    total, ok, overlaps, seconds = crowd(args.submitters, args.per_submitter, args.kills)
    print(
        f"{args.submitters} submitters x {args.per_submitter} runs on 2 GPUs, scheduler killed "
        f"{args.kills}x: {ok}/{total} succeeded, {total - ok} lost or failed, "
        f"{overlaps} overlaps on a GPU, {seconds:.0f} s"
    )
    return 0 if ok == total and overlaps == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
