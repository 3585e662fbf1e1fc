"""Real NVIDIA GPUs through nvidia-ml-py: query helper, backend, topology, static cache."""

from gpustation.telemetry.nvml.backend import NvmlBackend

__all__ = ["NvmlBackend"]
