"""Real NVIDIA GPUs through nvidia-ml-py: query helper, read table, backend, control,
topology, static cache, and the deep readers (XID events, GPM, NVLink, MIG, per-process SM)."""

from gpustation.telemetry.nvml.backend import NvmlBackend

__all__ = ["NvmlBackend"]
