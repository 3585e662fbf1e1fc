"""Exit codes and the error type every command maps onto them.

The codes are part of the command-line interface and documented in the README.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1  # the command ran and the thing it did failed (a run failed, ...)
EXIT_USAGE = 2  # bad arguments, bad preset or profile, unknown name
EXIT_NO_DRIVER = 3  # NVML could not start: no NVIDIA driver or library
EXIT_NEEDS_ROOT = 4  # the driver refused a change for lack of privilege
EXIT_NOT_SUPPORTED = 5  # the card cannot do what was asked (e.g. no fans)
EXIT_UNREACHABLE = 6  # a remote host could not be read
EXIT_INTERRUPTED = 130  # stopped by Ctrl-C


class GpustationError(Exception):
    """An error with a message meant for the user and an exit code."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(GpustationError):
    exit_code = EXIT_USAGE


class NoDriverError(GpustationError):
    exit_code = EXIT_NO_DRIVER


class NeedsRootError(GpustationError):
    exit_code = EXIT_NEEDS_ROOT


class NotSupportedError(GpustationError):
    exit_code = EXIT_NOT_SUPPORTED
