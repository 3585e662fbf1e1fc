"""Is this machine ready to train? Driver, CUDA, NVML, torch, NCCL and a matmul per GPU.

Each check passes, fails (with the fix to try) or is skipped. ``--device cpu``
skips the GPU checks and only checks torch on the CPU. Exit status 0 when no
check failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from gpustation.errors import NoDriverError
from gpustation.runners.lib import common
from gpustation.runs.metrics import MetricsWriter
from gpustation.telemetry.nvml.query import NoBindingError, Query, cuda_version, start_nvml
from gpustation.telemetry.nvml.topology import text

PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


def build_parser() -> argparse.ArgumentParser:
    parser = common.make_parser("healthcheck", __doc__)
    parser.add_argument("--matmul-size", type=int, default=1024, help="N of the check matmul")
    return parser


def nvml_checks(nvml: Any = None) -> tuple[list[Check], dict[str, Any]]:
    """Driver and NVML versions through NVML, as nvidia-smi would read them.

    Read through the telemetry's query helper; ``nvml`` stands in for
    ``pynvml`` (a fake in tests). A version the driver would not give is
    reported with the driver's error, never left out silently.
    """
    facts: dict[str, Any] = {}
    try:
        nv = start_nvml(nvml)
    except NoBindingError:
        return [
            Check(
                "NVML library",
                FAIL,
                "the nvidia-ml-py package is not installed",
                "pip install nvidia-ml-py",
            )
        ], facts
    except NoDriverError as exc:
        return [
            Check(
                "NVIDIA driver",
                FAIL,
                str(exc),
                "install the NVIDIA driver (e.g. `sudo ubuntu-drivers install` or your "
                "distribution's nvidia-driver package) and reboot; in a container, start it "
                "with --gpus all",
            )
        ], facts
    q = Query(nv)
    try:
        facts["driver_version"] = text(q(None, "driver_version", "nvmlSystemGetDriverVersion"))
        facts["nvml_version"] = text(q(None, "nvml_version", "nvmlSystemGetNVMLVersion"))
        cuda = q(None, "driver_cuda_version", "nvmlSystemGetCudaDriverVersion")
        facts["driver_cuda_version"] = None if cuda is None else cuda_version(int(cuda))
        count = q(None, "nvml_gpu_count", "nvmlDeviceGetCount")
        facts["nvml_gpu_count"] = None if count is None else int(count)
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # shutting down a half-broken library must not hide the checks
            pass
    detail = (
        f"driver {facts['driver_version'] or 'n/a'} (supports CUDA up to "
        f"{facts['driver_cuda_version'] or 'n/a'}), NVML {facts['nvml_version'] or 'n/a'}, "
        f"{facts['nvml_gpu_count'] if facts['nvml_gpu_count'] is not None else 'n/a'} GPU(s)"
    )
    errors = [f"{key}: {why}" for (_, key), why in sorted(q.errors.items())]
    if errors:
        return [
            Check(
                "NVIDIA driver",
                FAIL,
                f"{detail}; the driver did not answer: {'; '.join(errors)}",
                "check `nvidia-smi` and the kernel log (`sudo dmesg | grep -i nvrm`)",
            )
        ], facts
    return [Check("NVIDIA driver", PASS, detail)], facts


def _version_tuple(v: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in (v or "").split(".")[:2])
    except ValueError:
        return ()


def torch_checks(facts: dict[str, Any], size: int) -> list[Check]:
    """torch's CUDA build against the driver, the GPUs it sees, NCCL, and a matmul per GPU."""
    checks: list[Check] = []
    built = torch.version.cuda
    facts["torch_version"] = torch.__version__
    facts["torch_cuda_version"] = built
    if built is None:
        checks.append(
            Check(
                "torch CUDA build",
                FAIL,
                f"torch {torch.__version__} is a CPU-only build",
                "install a CUDA build of torch: see https://pytorch.org/get-started/locally/",
            )
        )
        return checks
    driver_cuda = facts.get("driver_cuda_version")
    if driver_cuda and _version_tuple(built) > _version_tuple(driver_cuda):
        checks.append(
            Check(
                "CUDA versions",
                FAIL,
                f"torch is built for CUDA {built} but the driver supports up to {driver_cuda}",
                "update the NVIDIA driver, or install a torch build for an older CUDA",
            )
        )
    else:
        checks.append(
            Check(
                "CUDA versions",
                PASS,
                f"torch {torch.__version__} built for CUDA {built}"
                + (f"; driver supports {driver_cuda}" if driver_cuda else ""),
            )
        )
    if not torch.cuda.is_available():
        checks.append(
            Check(
                "torch.cuda.is_available()",
                FAIL,
                "False: torch cannot use any GPU",
                "check that the driver is loaded (nvidia-smi), that CUDA_VISIBLE_DEVICES is "
                "not empty, and that the driver is new enough for this torch build",
            )
        )
        return checks
    n = torch.cuda.device_count()
    names = []
    for i in range(n):
        major, minor = torch.cuda.get_device_capability(i)
        names.append(f"{i}: {torch.cuda.get_device_name(i)} (sm_{major}{minor})")
    facts["devices"] = names
    checks.append(Check("torch.cuda.is_available()", PASS, f"{n} GPU(s): " + "; ".join(names)))
    arch_list = torch.cuda.get_arch_list()
    for i in range(n):
        major, minor = torch.cuda.get_device_capability(i)
        if (
            arch_list
            and not any(a.endswith(f"{major}{minor}") for a in arch_list)
            and not any(a.startswith("compute_") for a in arch_list)
        ):
            checks.append(
                Check(
                    f"GPU {i} architecture",
                    FAIL,
                    f"sm_{major}{minor} is not in this torch build's {arch_list}",
                    "install a torch build that supports this GPU generation",
                )
            )
    # start-up time: torch.distributed, only where it is used
    import torch.distributed as dist

    if dist.is_available() and dist.is_nccl_available():
        try:
            v = torch.cuda.nccl.version()
            version = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            version = "present"
        facts["nccl_version"] = version
        checks.append(Check("NCCL", PASS, f"NCCL {version} (multi-GPU training)"))
    else:
        checks.append(
            Check(
                "NCCL",
                FAIL,
                "torch has no NCCL backend: multi-GPU training would fall back to gloo",
                "install an official Linux CUDA build of torch (it bundles NCCL)",
            )
        )
    for i in range(n):
        checks.append(matmul_check(torch.device("cuda", i), size))
    return checks


def matmul_check(device: torch.device, size: int) -> Check:
    """Multiply two random matrices on ``device`` and compare with the CPU result."""
    g = torch.Generator().manual_seed(size)
    a = torch.randn(size, size, generator=g, dtype=torch.float64)
    b = torch.randn(size, size, generator=g, dtype=torch.float64)
    expected = a @ b
    name = f"matmul on {device}"
    try:
        # fp32 with TF32 off so only rounding, not a lower-precision format, differs.
        common.Precision("fp32", device).apply_backend_flags()
        got = (a.float().to(device) @ b.float().to(device)).double().cpu()
    except Exception as exc:
        return Check(
            name,
            FAIL,
            f"{type(exc).__name__}: {exc}",
            "the GPU could not run a kernel: check dmesg for Xid errors and "
            "`nvidia-smi -q` for ECC errors; reset or reseat the card",
        )
    err = ((got - expected).abs().max() / expected.abs().max()).item()
    if err > 1e-4:
        return Check(
            name,
            FAIL,
            f"relative error {err:.2e} against the CPU (expected < 1e-4)",
            "a wrong answer points at faulty memory or overclocking: reset clocks, check "
            "`nvidia-smi -q -d ECC`, run the card's diagnostics",
        )
    return Check(name, PASS, f"{size}x{size} fp32 product matches the CPU (rel. error {err:.1e})")


def main(args: argparse.Namespace) -> int:
    checks: list[Check] = []
    facts: dict[str, Any] = {"python": sys.version.split()[0]}
    gpu_wanted = args.device != "cpu"
    if gpu_wanted:
        nv, nv_facts = nvml_checks()
        facts.update(nv_facts)
        checks += nv
        checks += torch_checks(facts, args.matmul_size)
    else:
        facts["torch_version"] = torch.__version__
        checks.append(Check("GPU checks", SKIP, "--device cpu: driver, CUDA and NCCL not checked"))
    checks.append(matmul_check(torch.device("cpu"), min(args.matmul_size, 256)))
    checks[-1].name = "torch on the CPU"

    print(f"healthcheck: python {facts['python']}, torch {torch.__version__}\n")
    for c in checks:
        print(f"[{c.status.upper():>4}] {c.name}: {c.detail}")
        if c.status == FAIL and c.fix:
            print(f"       fix: {c.fix}")
    failed = [c for c in checks if c.status == FAIL]
    passed = sum(c.status == PASS for c in checks)
    print(
        f"\n{passed} passed, {len(failed)} failed, {sum(c.status == SKIP for c in checks)} skipped"
    )
    with MetricsWriter.from_env() as m:
        for i, c in enumerate(checks, 1):
            m.log(step=i, total_steps=len(checks), check=c.name, status=c.status)
        m.summary(
            ok=not failed,
            passed=passed,
            failed=len(failed),
            checks=[asdict(c) for c in checks],
            **facts,
        )
    if failed:
        common.print_limits([f"{c.name}: {c.fix or c.detail}" for c in failed])
    return common.EXIT_FAILED if failed else common.EXIT_OK


def cli(argv: Sequence[str] | None = None) -> int:
    return common.run_main(main, build_parser(), argv)


if __name__ == "__main__":
    sys.exit(cli())
