"""``gpustation doctor [--json] [--strict] [--bundle FILE]``: is this machine
ready to train, and if not, why not and what to do. It only reads: no GPU
setting is changed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpustation import paths
from gpustation.commands import options
from gpustation.commands.options import add_gpu_options, print_json
from gpustation.doctor import bundle
from gpustation.doctor.checks import FAIL, WARN, diagnose, worst
from gpustation.textsafe import safe

#: exit statuses (documented in the README): ready; ready with warnings under
#: --strict, or a check failed: not ready
EXIT_READY = 0
EXIT_NOT_READY = 1

_MARKS = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "doctor",
        help="say whether this machine is ready to train, and why not",
        description="Check the driver, CUDA and torch, permissions, persistence mode, ECC "
        "and remapped rows, XIDs since boot, PCIe links and topology, limits that drifted, "
        "free disk, the training extras and NCCL: a line each, pass/warn/fail, with what to "
        "do. Exit 0 when ready (warnings allowed), 1 when a check failed. Changes nothing.",
    )
    add_gpu_options(p)
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 on a warning too")
    p.add_argument(
        "--bundle",
        metavar="FILE",
        type=Path,
        help="also write a support bundle (FILE.zip or FILE.tar.zst): versions, snapshot, "
        "topology, journal tail, recent runs' errors, kernel NVRM/Xid lines; secrets and "
        "other users' command lines left out",
    )


def _named(version: Any) -> dict[str, str] | None:
    return None if version is None else {"name": version.name, "version": version.version}


def report(findings: Any) -> dict[str, Any]:
    snap = findings.snapshot
    return {
        "schema": "gpustation.doctor/1",
        "verdict": worst(findings.checks),
        "simulated": bool(snap and snap.simulated),
        "versions": {
            "driver": snap.driver_version if snap else None,
            "library": _named(snap.library_version if snap else None),
            "compute_runtime": _named(snap.compute_runtime_version if snap else None),
            "torch": (findings.torch or {}).get("torch"),
            "torch_cuda": (findings.torch or {}).get("cuda_built"),
            "nccl": (findings.torch or {}).get("nccl"),
            "python": sys.version.split()[0],
        },
        "checks": [c.to_dict() for c in findings.checks],
    }


def run(args: argparse.Namespace) -> int:
    if args.bundle is not None:
        bundle.check_name(args.bundle)
    findings = diagnose(lambda: options.backend_from_args(args), paths.runs_dir())
    doc = report(findings)
    if args.json:
        print_json(doc)
    else:
        if doc["simulated"]:
            print("SIMULATED GPUs (what is checked is not your hardware)")
        width = max(len(c.name) for c in findings.checks)
        for c in findings.checks:
            line = f"{_MARKS[c.status]}  {c.name.ljust(width)}  {c.detail}"
            print(safe(line))
            if c.fix and c.status != "pass":
                print(safe(f"      {' ' * width}  -> {c.fix}"))
        verdict = {"pass": "ready to train", "warn": "ready, with warnings", "fail": "NOT ready"}
        print(f"gpustation doctor: {verdict[doc['verdict']]}")
    if args.bundle is not None:
        bundle.write_bundle(args.bundle, bundle.members(findings, doc))
        print(f"support bundle written to {args.bundle}", file=sys.stderr)
    worst = doc["verdict"]
    if worst == FAIL or (args.strict and worst == WARN):
        return EXIT_NOT_READY
    return EXIT_READY
