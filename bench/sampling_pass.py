"""How long one fast sampling pass of the NVML backend takes, per GPU.

    .venv/bin/python bench/sampling_pass.py [--gpus N] [--passes N]

Against the fake pynvml (tests/fake_nvml) with its call recording switched
off, the time is gpustation's own overhead: the target is under 500 µs per
GPU per pass. When an NVIDIA driver is present it also times real NVML:
the fast pass, a slow pass (PCIe throughput and energy read side by side in
threads) and, for comparison, the same slow getters called one after another.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpustation.errors import NoDriverError  # noqa: E402
from gpustation.telemetry.nvml import NvmlBackend  # noqa: E402


def load_fake(gpus: int) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_fake_pynvml", REPO / "tests" / "fake_nvml" / "pynvml.py"
    )
    assert spec is not None and spec.loader is not None
    fake = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = fake
    spec.loader.exec_module(fake)
    cards = ["rtx4090", "h200"]
    fake.reset(devices=[{"card": cards[i % 2]} for i in range(gpus)])
    return fake


def time_passes(backend: NvmlBackend, passes: int, slow: bool) -> list[float]:
    """Seconds per pass, per GPU."""
    indices = list(range(backend.device_count()))
    n = max(1, len(indices))
    backend.read_gpus(indices, slow=True)  # warm up: first calls cost more
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        backend.read_gpus(indices, slow=slow)
        times.append((time.perf_counter() - start) / n)
    return times


def report(label: str, times: list[float]) -> None:
    med = statistics.median(times) * 1e6
    p90 = sorted(times)[int(len(times) * 0.9)] * 1e6
    print(f"{label:<48} median {med:9.1f} µs/GPU   p90 {p90:9.1f} µs/GPU   ({len(times)} passes)")


def serial_slow(backend: NvmlBackend, passes: int) -> list[float]:
    """The slow getters called one after another, as a naive backend would."""
    nvml: Any = backend.nvml
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(backend.device_count())]
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        for h in handles:
            for fn, args in (
                (nvml.nvmlDeviceGetPcieThroughput, (nvml.NVML_PCIE_UTIL_TX_BYTES,)),
                (nvml.nvmlDeviceGetPcieThroughput, (nvml.NVML_PCIE_UTIL_RX_BYTES,)),
                (nvml.nvmlDeviceGetTotalEnergyConsumption, ()),
            ):
                try:
                    fn(h, *args)
                except nvml.NVMLError:
                    pass
        times.append((time.perf_counter() - start) / max(1, len(handles)))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8, help="fake GPUs (default 8)")
    parser.add_argument("--passes", type=int, default=2000, help="fast passes (default 2000)")
    args = parser.parse_args()

    fake = load_fake(args.gpus)
    with NvmlBackend(nvml=fake) as backend:
        fake.calls.clear()
        report(
            f"fake NVML, {args.gpus} GPUs, fast pass (recording calls)",
            time_passes(backend, min(args.passes, 200), slow=False),
        )
        fake.calls.clear()
        # The fake's own bookkeeping switched off: what is left is ours.
        fake._enter = lambda *a: None
        report(
            f"fake NVML, {args.gpus} GPUs, fast pass (our overhead)",
            time_passes(backend, args.passes, slow=False),
        )

    try:
        real = NvmlBackend()
    except NoDriverError as err:
        print(f"real NVML: skipped ({err})")
        return 0
    with real:
        count = real.device_count()
        print(f"real NVML: {count} GPU(s), driver {real.driver_version()}")
        report("real NVML, fast pass", time_passes(real, args.passes, slow=False))
        slow_passes = max(5, min(50, args.passes // 40))
        report("real NVML, slow pass (threads)", time_passes(real, slow_passes, slow=True))
        report("real NVML, slow getters one after another", serial_slow(real, slow_passes))
        if real.errors:
            print("fields that failed:", ", ".join(f"{i}:{f}" for i, f in sorted(real.errors)))
        if real.missing_functions:
            print("functions missing:", ", ".join(sorted(real.missing_functions)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
