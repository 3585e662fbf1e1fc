"""gpustation: a workstation GPU monitor, controller and run launcher."""

__version__ = "0.1.0"
