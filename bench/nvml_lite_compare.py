"""The lite NVML binding against nvidia-ml-py on a real machine: answers and speed.

Reads every GPU through both modules (read-only: no setter is ever called)
and prints every answer that differs. Fast-changing values (power,
temperature, clocks, utilisation, memory in use, energy, PCIe throughput and
link state, fan speed, processes) are compared by kind only (a number on one
side and a number on the other, or the same NVML error), everything else by
value. Then the same for the snapshots the NVML backend builds on each.

Then the speed: import time of each module (``python -X importtime``, median
of ``--runs`` fresh interpreters), the time to import and start NVML, and the
wall time of ``python -m gpustation snapshot --json`` with the default binding
against ``GPUSTATION_NVML=pynvml`` (interleaved runs, medians).

    python bench/nvml_lite_compare.py [--runs 15] [--out results.json]

Exit status 1 when any answer differs.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Getters whose answers move between two reads a few milliseconds apart.
DYNAMIC = {
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetFanSpeed_v2",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
}
# Snapshot fields that move between reads (GpuSample / PcieInfo names).
DYNAMIC_FIELDS = {
    "temperature_c",
    "power_w",
    "energy_j",
    "clock_sm_mhz",
    "clock_mem_mhz",
    "memory_used_mib",
    "utilization_gpu_pct",
    "utilization_memory_pct",
    "fans_pct",
    "pstate",
    "throttle_reasons",
    "processes",
    "gen",
    "width",
    "tx_kib_s",
    "rx_kib_s",
}


def normalize(value: Any) -> Any:
    """An NVML answer as plain JSON-able data, its Python type kept."""
    if isinstance(value, ctypes.Structure):
        return {"struct": {k: normalize(getattr(value, k)) for k, *_ in value._fields_}}
    if isinstance(value, ctypes.Array):
        return {"array": [normalize(v) for v in value]}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [normalize(v) for v in value]}
    if type(value).__name__ == "nvmlFriendlyObject":
        return {"object": {k: normalize(v) for k, v in sorted(vars(value).items())}}
    return [type(value).__name__, value]


def kind_only(value: Any) -> Any:
    """The shape of an answer: types and field names, not the numbers."""
    if isinstance(value, dict):
        return {k: kind_only(v) for k, v in value.items()}
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
        return value[0]
    if isinstance(value, list):
        return [kind_only(v) for v in value[:1]]  # one element stands for all
    return value


def ask(mod: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    fn = getattr(mod, name, None)
    if fn is None:
        return ["absent"]
    try:
        return normalize(fn(*args, **kwargs))
    except mod.NVMLError as err:
        return ["NVMLError", err.value, str(err)]
    except Exception as err:  # a different Python error is a difference too
        return [type(err).__name__, str(err)]


def questions(mod: Any, index: int) -> list[tuple[str, str, tuple[Any, ...], dict[str, Any]]]:
    """(label, function, args, kwargs) for every read the NVML backend makes."""
    h = mod.nvmlDeviceGetHandleByIndex(index)
    count = mod.nvmlDeviceGetCount()
    q: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = []
    for name in (
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetPowerManagementDefaultLimit",
        "nvmlDeviceGetPowerManagementLimitConstraints",
        "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetNumFans",
        "nvmlDeviceGetMinMaxFanSpeed",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetPerformanceState",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetNumaNodeId",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses",
    ):
        q.append((name, name, (h,), {}))
    q.append(
        (
            "nvmlDeviceGetMemoryInfo_v2",
            "nvmlDeviceGetMemoryInfo",
            (h,),
            {"version": mod.nvmlMemory_v2},
        )
    )
    for t, label in ((mod.NVML_CLOCK_SM, "sm"), (mod.NVML_CLOCK_MEM, "mem")):
        q.append((f"nvmlDeviceGetClockInfo[{label}]", "nvmlDeviceGetClockInfo", (h, t), {}))
        q.append((f"nvmlDeviceGetMaxClockInfo[{label}]", "nvmlDeviceGetMaxClockInfo", (h, t), {}))
    q.append(("nvmlDeviceGetTemperature", "nvmlDeviceGetTemperature", (h, 0), {}))
    for t in (0, 1):
        q.append(
            (
                f"nvmlDeviceGetTemperatureThreshold[{t}]",
                "nvmlDeviceGetTemperatureThreshold",
                (h, t),
                {},
            )
        )
    q.append(("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetTotalEccErrors", (h, 1, 0), {}))
    for c in (0, 1):
        q.append((f"nvmlDeviceGetPcieThroughput[{c}]", "nvmlDeviceGetPcieThroughput", (h, c), {}))
    fans = ask(mod, "nvmlDeviceGetNumFans", h)
    for fan in range(fans[1] if fans[0] == "int" else 0):
        q.append((f"nvmlDeviceGetFanSpeed_v2[{fan}]", "nvmlDeviceGetFanSpeed_v2", (h, fan), {}))
        q.append(
            (
                f"nvmlDeviceGetFanControlPolicy_v2[{fan}]",
                "nvmlDeviceGetFanControlPolicy_v2",
                (h, fan),
                {},
            )
        )
    for link in range(int(mod.NVML_NVLINK_MAX_LINKS)):
        state = ask(mod, "nvmlDeviceGetNvLinkState", h, link)
        q.append((f"nvmlDeviceGetNvLinkState[{link}]", "nvmlDeviceGetNvLinkState", (h, link), {}))
        if state[0] != "int":
            break
        for name in ("nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetNvLinkRemotePciInfo"):
            q.append((f"{name}[{link}]", name, (h, link), {}))
    for other in range(count):
        if other == index:
            continue
        o = mod.nvmlDeviceGetHandleByIndex(other)
        q.append(
            (
                f"nvmlDeviceGetTopologyCommonAncestor[{other}]",
                "nvmlDeviceGetTopologyCommonAncestor",
                (h, o),
                {},
            )
        )
        for p in (0, 1):
            q.append(
                (f"nvmlDeviceGetP2PStatus[{other},{p}]", "nvmlDeviceGetP2PStatus", (h, o, p), {})
            )
    words = max(1, -(-(os.cpu_count() or 1) // 64))
    q.append(("nvmlDeviceGetCpuAffinity", "nvmlDeviceGetCpuAffinity", (h, words), {}))
    return q


def compare_calls(pynvml: Any, lite: Any) -> list[str]:
    diffs: list[str] = []
    for name in (
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlDeviceGetCount",
    ):
        a, b = ask(pynvml, name), ask(lite, name)
        if a != b:
            diffs.append(f"{name}: pynvml {a} | lite {b}")
    for index in range(pynvml.nvmlDeviceGetCount()):
        theirs = questions(pynvml, index)
        ours = questions(lite, index)
        if [q[0] for q in theirs] != [q[0] for q in ours]:
            diffs.append(f"GPU {index}: the two modules were asked different questions")
        for (label, name, args, kwargs), (_, _, largs, lkwargs) in zip(theirs, ours, strict=False):
            a = ask(pynvml, name, *args, **kwargs)
            b = ask(lite, name, *largs, **lkwargs)
            base = label.split("[")[0]
            if base in DYNAMIC or (base == "nvmlDeviceGetMemoryInfo" and kwargs):
                a, b = kind_only(a), kind_only(b)
            if a != b:
                diffs.append(f"GPU {index} {label}: pynvml {a} | lite {b}")
    return diffs


def compare_snapshots(pynvml: Any) -> list[str]:
    from gpustation.telemetry.nvml import NvmlBackend
    from gpustation.telemetry.sampler import Sampler

    def read(mod: Any) -> dict[str, Any]:
        with NvmlBackend(nvml=mod) as backend:
            snap = Sampler(backend, with_host=False).sample(slow=True).to_dict()
            snap["module"] = backend.nvml.__name__
            snap["missing_functions"] = sorted(backend.missing_functions)
            snap["errors"] = sorted(f"{k}: {v}" for k, v in backend.errors.items())
        return snap

    os.environ.pop("GPUSTATION_NVML", None)
    lite, theirs = read(None), read(pynvml)
    diffs = []
    if lite["module"] != "gpustation.telemetry.nvml_lite":
        diffs.append(f"the default backend used {lite['module']}, not the lite binding")
    for key in ("driver_version", "nvml_version", "cuda_driver_version", "topology"):
        if lite[key] != theirs[key]:
            diffs.append(f"snapshot {key}: pynvml {theirs[key]} | lite {lite[key]}")
    for key in ("missing_functions", "errors"):
        if lite[key] != theirs[key]:
            diffs.append(f"backend {key}: pynvml {theirs[key]} | lite {lite[key]}")
    for ours, other in zip(lite["gpus"], theirs["gpus"], strict=False):
        flat_ours = {**ours, **{f"pcie.{k}": v for k, v in ours.pop("pcie").items()}}
        flat_other = {**other, **{f"pcie.{k}": v for k, v in other.pop("pcie").items()}}
        for key, value in flat_ours.items():
            a, b = flat_other.get(key), value
            if key.removeprefix("pcie.") in DYNAMIC_FIELDS:
                same = (a is None) == (b is None)
            else:
                same = a == b
            if not same:
                diffs.append(f"snapshot GPU {ours['index']} {key}: pynvml {a} | lite {b}")
    return diffs


def median_import_us(module: str, runs: int) -> float:
    """Median cumulative import time of ``module`` in fresh interpreters, microseconds."""
    samples = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", f"import {module}"],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=True,
        ).stderr
        for line in out.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) == 3 and parts[2] == module:
                samples.append(float(parts[1]))
    return statistics.median(samples)


def median_start_ms(module: str, runs: int) -> float:
    """Median time to import ``module`` and call nvmlInit() in fresh interpreters."""
    code = (
        "import time; t = time.perf_counter(); import importlib; "
        f"m = importlib.import_module({module!r}); m.nvmlInit(); "
        "print((time.perf_counter() - t) * 1000); m.nvmlShutdown()"
    )
    samples = [
        float(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
            ).stdout
        )
        for _ in range(runs)
    ]
    return statistics.median(samples)


def snapshot_wall_s(runs: int) -> dict[str, float]:
    argv = [sys.executable, "-m", "gpustation", "snapshot", "--json"]
    envs = {
        "default (lite)": {k: v for k, v in os.environ.items() if k != "GPUSTATION_NVML"},
        "GPUSTATION_NVML=pynvml": {**os.environ, "GPUSTATION_NVML": "pynvml"},
    }
    times: dict[str, list[float]] = {k: [] for k in envs}
    for env in envs.values():  # warm-up: caches, bytecode
        subprocess.run(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, check=True)
    for _ in range(runs):
        for label, env in envs.items():
            start = time.perf_counter()
            subprocess.run(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, check=True)
            times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) for label, t in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=15, help="fresh interpreters per timing")
    ap.add_argument("--out", help="write the figures and differences as JSON here")
    args = ap.parse_args()

    import pynvml

    from gpustation.telemetry import nvml_lite

    pynvml.nvmlInit()
    nvml_lite.nvmlInit()
    try:
        print(
            f"driver {pynvml.nvmlSystemGetDriverVersion()}, "
            f"{pynvml.nvmlDeviceGetCount()} GPU(s), nvidia-ml-py at {pynvml.__file__}"
        )
        diffs = compare_calls(pynvml, nvml_lite)
    finally:
        nvml_lite.nvmlShutdown()
        pynvml.nvmlShutdown()
    diffs += compare_snapshots(pynvml)
    print(f"\nanswers that differ: {len(diffs)}")
    for line in diffs:
        print("  " + line)

    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("\nnote: PYTHONDONTWRITEBYTECODE is set, so every import below compiles its source")
    print(f"\nimport time, median of {args.runs} fresh interpreters (-X importtime, cumulative):")
    figures: dict[str, Any] = {"differences": diffs}
    for module in ("gpustation.telemetry.nvml_lite", "pynvml"):
        us = median_import_us(module, args.runs)
        figures[f"import_ms {module}"] = us / 1000
        print(f"  {module:34s} {us / 1000:8.2f} ms")
    print("import + nvmlInit(), median:")
    for module in ("gpustation.telemetry.nvml_lite", "pynvml"):
        ms = median_start_ms(module, args.runs)
        figures[f"start_ms {module}"] = ms
        print(f"  {module:34s} {ms:8.2f} ms")
    print(f"`python -m gpustation snapshot --json` wall time, median of {args.runs}:")
    walls = snapshot_wall_s(args.runs)
    for label, seconds in walls.items():
        figures[f"snapshot_s {label}"] = seconds
        print(f"  {label:34s} {seconds:8.3f} s")

    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
