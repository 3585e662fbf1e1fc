"""The doctor's checks: each a verdict (pass, warn, fail, or skip where this
machine or user cannot tell), what was found and what to do.

Everything is read: the GPUs through the backend (never a setter), torch in a
child process (``runners/torchprobe.py``, so torch stays out of this one), the
kernel log through ``dmesg`` where this user may read it, the control journal
for limits that drifted. Whether this user could change a limit is decided
from who it is (root, or the capability the driver checks), never by trying.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpustation.control.drift import applied_now, find_drift
from gpustation.errors import NoDriverError
from gpustation.privs import as_root
from gpustation.telemetry import health
from gpustation.telemetry.alerts import topology_findings
from gpustation.telemetry.backend import Backend
from gpustation.telemetry.model import Snapshot
from gpustation.telemetry.sampler import Sampler
from gpustation.telemetry.slotted import field, record
from gpustation.textsafe import safe

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
_RANK = {SKIP: 0, PASS: 0, WARN: 1, FAIL: 2}
#: free space in the run directory below which runs will not fit (checkpoints)
DISK_FAIL_GIB = 1.0
DISK_WARN_GIB = 20.0
#: the training extras (``pip install 'gpustation[train]'``)
EXTRAS = ("torchvision", "transformers", "peft", "accelerate")
#: CAP_SYS_ADMIN's bit in /proc/self/status CapEff: what the driver checks for
#: setting a power limit when not root
_CAP_SYS_ADMIN = 21
TORCH_PROBE_TIMEOUT_S = 120.0


@record(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


@record
class Findings:
    checks: list[Check] = field(default_factory=list)
    snapshot: Snapshot | None = None
    torch: dict[str, Any] | None = None
    #: the kernel log's NVRM and Xid lines; None where it cannot be read
    kernel_lines: list[str] | None = None


def worst(checks: Sequence[Check]) -> str:
    """The worst verdict of ``checks`` (``pass`` when there is nothing worse)."""
    found = [c.status for c in checks if c.status in (WARN, FAIL)]
    return max(found, key=_RANK.__getitem__) if found else PASS


# ---- what the checks read ---------------------------------------------------------


def probe_torch() -> dict[str, Any] | None:
    """torch's view of the GPUs, from a child process; None when it cannot be run."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gpustation.runners.lib.torchprobe"],
            capture_output=True,
            text=True,
            timeout=TORCH_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"torch": "?", "error": f"the torch probe did not answer ({err})"}
    try:
        doc = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = safe(proc.stderr.strip().splitlines()[-1]) if proc.stderr.strip() else ""
        return {"torch": "?", "error": f"the torch probe failed: {tail or proc.returncode}"}
    return doc if isinstance(doc, dict) else None


def read_kernel_log() -> list[str] | None:
    """The kernel log's NVIDIA driver lines (``NVRM``, ``Xid``) since boot; None
    where this user may not read it (``kernel.dmesg_restrict``)."""
    dmesg = shutil.which("dmesg")
    if dmesg is None:
        return None
    try:
        proc = subprocess.run(
            [dmesg],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=10,
            check=False,
            env={**os.environ, "LC_ALL": "C"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return [safe(line) for line in proc.stdout.splitlines() if "NVRM" in line or "Xid" in line]


def can_change_limits(simulated: bool) -> tuple[bool, str]:
    """Whether this user may set power limits and fans, and why; nothing is tried."""

    with as_root():
        euid = os.geteuid()
    if simulated:
        if os.environ.get("GPUSTATION_SIM_REQUIRE_ROOT") == "1" and euid != 0:
            return False, "the simulated driver asks for root (GPUSTATION_SIM_REQUIRE_ROOT=1)"
        return True, "simulated cards take changes from any user"
    if euid == 0:
        return True, "running as root"
    if _has_cap_sys_admin():
        return True, "this process has CAP_SYS_ADMIN"
    return False, "not root and without CAP_SYS_ADMIN: the driver refuses changes"


def _has_cap_sys_admin() -> bool:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_ADMIN & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---- the checks ------------------------------------------------------------------


def diagnose(
    open_backend: Callable[[], Backend],
    runs_dir: Path,
    torch_probe: Callable[[], dict[str, Any] | None] | None = None,
    kernel_log: Callable[[], list[str] | None] | None = None,
) -> Findings:
    """Every check, in the order a person fixes them; ``torch_probe`` and
    ``kernel_log`` default to :func:`probe_torch` and :func:`read_kernel_log`."""
    found = Findings()
    out = found.checks
    try:
        backend = open_backend()
    except NoDriverError as err:
        out.append(Check("driver", FAIL, str(err), "install or load the NVIDIA driver"))
        backend = None
    if backend is not None:
        try:
            backend.read_ecc = True
            snap = Sampler(backend, with_host=False, with_topology=True).sample(slow=True)
        finally:
            backend.close()
        found.snapshot = snap
        out += _gpu_checks(snap)
    found.torch = (torch_probe or probe_torch)()
    out += _torch_checks(found.torch, found.snapshot)
    if found.snapshot is not None:
        snap = found.snapshot
        out += _permission_checks(snap)
        out += _health_checks(snap)
        found.kernel_lines = (kernel_log or read_kernel_log)()
        out.append(_xid_check(found.kernel_lines, snap))
        out += _link_checks(snap)
        out += _drift_checks(snap)
    out.append(_disk_check(runs_dir))
    return found


def _gpu_checks(snap: Snapshot) -> list[Check]:
    versions = ", ".join(
        [f"driver {snap.driver_version or 'n/a'}"]
        + [str(v) for v in (snap.library_version, snap.compute_runtime_version) if v is not None]
    )
    out = [Check("driver", PASS, "simulated GPUs" if snap.simulated else versions)]
    if not snap.gpus:
        out.append(Check("GPUs", FAIL, "the driver sees no GPU", "check `nvidia-smi` and lspci"))
        return out
    lost = [g.index for g in snap.gpus if g.lost]
    names = ", ".join(f"{g.index} {health.short_name(g.name)}" for g in snap.gpus)
    if lost:
        out.append(
            Check(
                "GPUs",
                FAIL,
                f"GPU {', '.join(map(str, lost))} fell off the bus ({names})",
                "read the kernel log (dmesg), reseat or power-cycle the card",
            )
        )
    else:
        out.append(Check("GPUs", PASS, f"{len(snap.gpus)}: {names}"))
    return out


def _torch_checks(probe: dict[str, Any] | None, snap: Snapshot | None) -> list[Check]:
    out: list[Check] = []
    if probe is None or probe.get("torch") is None:
        out.append(
            Check(
                "torch",
                WARN,
                "torch is not installed: the training runners cannot start",
                "pip install 'gpustation[train]'",
            )
        )
    elif probe.get("error"):
        out.append(Check("torch", FAIL, f"torch {probe['torch']}: {probe['error']}", ""))
    else:
        out.append(_torch_view(probe, snap))
    missing = [name for name in EXTRAS if _version(name) is None]
    have = ", ".join(f"{n} {v}" for n in EXTRAS if (v := _version(n)))
    if missing:
        out.append(
            Check(
                "training extras",
                WARN,
                f"missing {', '.join(missing)}" + (f" (have {have})" if have else ""),
                "pip install 'gpustation[train]'",
            )
        )
    else:
        out.append(Check("training extras", PASS, have))
    gpus = len(snap.gpus) if snap is not None else 0
    nccl = (probe or {}).get("nccl")
    if gpus < 2:
        out.append(Check("NCCL", PASS, f"{nccl or 'n/a'} (one GPU: data-parallel runs need none)"))
    elif nccl:
        out.append(Check("NCCL", PASS, f"NCCL {nccl}"))
    else:
        out.append(
            Check(
                "NCCL",
                WARN if not (snap and snap.simulated) else SKIP,
                "torch has no NCCL here: multi-GPU runs fall back to gloo (slow)",
                "install a CUDA build of torch (it ships NCCL)",
            )
        )
    return out


def _torch_view(probe: dict[str, Any], snap: Snapshot | None) -> Check:
    version, built = probe.get("torch"), probe.get("cuda_built")
    devices = probe.get("devices") or []
    if snap is None or snap.simulated:
        seen = f"{len(devices)} GPU(s)" if probe.get("cuda_available") else "no GPU"
        return Check("torch", SKIP, f"torch {version} (CUDA {built}) sees {seen}; simulated GPUs")
    if built is None:
        return Check(
            "torch",
            FAIL,
            f"torch {version} is a CPU-only build",
            "install a CUDA build: https://pytorch.org/get-started/locally/",
        )
    runtime = snap.compute_runtime_version
    driver = runtime.version if runtime is not None and runtime.name == "CUDA" else None
    if driver and _newer(built, driver):
        return Check(
            "torch",
            FAIL,
            f"torch {version} needs CUDA {built}, the driver gives CUDA {driver}",
            "update the NVIDIA driver, or install a torch built for an older CUDA",
        )
    if not probe.get("cuda_available"):
        return Check(
            "torch",
            FAIL,
            f"torch {version} (CUDA {built}) sees no GPU",
            "check CUDA_VISIBLE_DEVICES and that this user may open /dev/nvidia*",
        )
    if len(devices) != len(snap.gpus):
        return Check(
            "torch",
            WARN,
            f"torch sees {len(devices)} GPU(s), the driver {len(snap.gpus)}",
            "CUDA_VISIBLE_DEVICES or a container hides some",
        )
    return Check("torch", PASS, f"torch {version} (CUDA {built}) sees {len(devices)} GPU(s)")


def _newer(a: str, b: str) -> bool:
    def parts(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split(".")[:2] if p.isdigit())

    return parts(a) > parts(b)


def _permission_checks(snap: Snapshot) -> list[Check]:
    ok, why = can_change_limits(snap.simulated)
    fix = "" if ok else "run gpustation power/fan/profile commands with sudo"
    out = [Check("power limits", PASS if ok else WARN, f"can be set: {why}" if ok else why, fix)]
    fans = [g.index for g in snap.gpus if g.fans_pct]
    if not fans:
        out.append(Check("fans", PASS, "no card here has controllable fans (datacenter cards)"))
    else:
        out.append(Check("fans", PASS if ok else WARN, f"GPU {fans}: {why}", fix))
    return out


def _health_checks(snap: Snapshot) -> list[Check]:
    out: list[Check] = []
    live = [g for g in snap.gpus if not g.lost]
    off = [g.index for g in live if g.persistence_mode is False and not g.fans_pct]
    if off:
        out.append(
            Check(
                "persistence mode",
                WARN,
                f"off on GPU {', '.join(map(str, off))}: each new process waits for the card",
                "sudo nvidia-smi -pm 1, or enable nvidia-persistenced",
            )
        )
    else:
        out.append(Check("persistence mode", PASS, "on where it matters (headless cards)"))
    failed = [g.index for g in live if g.remapped_rows.failure]
    pending = [g.index for g in live if g.remapped_rows.pending]
    ecc = [(g.index, g.ecc_uncorrected) for g in live if g.ecc_uncorrected]
    if failed:
        out.append(
            Check(
                "memory (ECC)",
                FAIL,
                f"a row remap failed on GPU {failed}: no spare rows left",
                "the card needs service (RMA)",
            )
        )
    elif pending or ecc:
        words = [f"GPU {i}: {n} uncorrected ECC error(s)" for i, n in ecc]
        words += [f"GPU {i}: a row remap is pending" for i in pending]
        out.append(
            Check("memory (ECC)", WARN, "; ".join(words), "reset the GPU when idle (nvidia-smi -r)")
        )
    elif all(g.ecc_uncorrected is None for g in live):
        out.append(Check("memory (ECC)", SKIP, "no ECC on these cards"))
    else:
        out.append(Check("memory (ECC)", PASS, "no uncorrected errors, no remapped rows pending"))
    return out


def _xid_check(lines: list[str] | None, snap: Snapshot) -> Check:
    if lines is None:
        return Check(
            "XID events",
            SKIP,
            "the kernel log is not readable as this user",
            "run `sudo gpustation doctor` to see the XIDs since boot",
        )
    xids = [line for line in lines if "Xid" in line]
    if snap.simulated:
        return Check("XID events", SKIP, "simulated GPUs: the kernel log speaks of real cards")
    if not xids:
        return Check("XID events", PASS, f"{len(xids)} in the kernel log since boot")
    return Check(
        "XID events",
        WARN,
        f"{len(xids)} since boot, the last: {xids[-1].strip()}",
        "look the code up in NVIDIA's XID catalogue; 79 or 48 need a reboot or service",
    )


def _link_checks(snap: Snapshot) -> list[Check]:
    findings = topology_findings(snap)
    slow = [f for f in findings if "while" in f and "busy" in f]
    if not findings:
        return [Check("PCIe and topology", PASS, "every link at its maximum, no weak spots")]
    return [
        Check(
            "PCIe and topology",
            WARN if (f in slow or "PCIe" not in f) else PASS,
            f,
            "reseat the card or check the BIOS slot settings" if f in slow else "",
        )
        for f in findings
    ]


def _drift_checks(snap: Snapshot) -> list[Check]:
    drifted = find_drift(snap.gpus, applied_now(snap.simulated))
    if not drifted:
        return [Check("limits", PASS, "every card has what the control journal applied last")]
    return [
        Check("limits", WARN, f"GPU {i}: {d.text()}", "gpustation profile apply --again")
        for i, d in sorted(drifted.items())
    ]


def _disk_check(runs_dir: Path) -> Check:
    where = runs_dir
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free / 2**30
    except OSError as err:
        return Check("disk", FAIL, f"cannot read {where}: {err.strerror or err}", "")
    text = f"{free:.1f} GiB free for runs in {runs_dir}"
    if free < DISK_FAIL_GIB:
        return Check("disk", FAIL, text, "free space or set another run directory")
    if free < DISK_WARN_GIB:
        return Check("disk", WARN, text, "checkpoints of a large model may not fit")
    return Check("disk", PASS, text)
