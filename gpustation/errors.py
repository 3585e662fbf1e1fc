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


def flag(field: str) -> str:
    """The command-line option of a field: ``power_limit`` -> ``--power-limit``."""
    return "--" + field.replace("_", "-")


class GpustationError(Exception):
    """An error with a message meant for the user and an exit code.

    An error about one input names its ``field`` (``gpus``, ``set``) and, where
    the input has parts, the ``subject`` (``batch_size=big``) instead of a
    command-line flag: the message reads ``--gpus: ...`` on the command line,
    and :meth:`worded` names the field in another caller's words (a form's label,
    a config key).
    """

    exit_code = EXIT_FAILURE

    def __init__(
        self,
        message: str,
        exit_code: int | None = None,
        *,
        field: str | None = None,
        subject: str | None = None,
    ) -> None:
        self.detail = message
        self.field = field
        self.subject = subject
        super().__init__(self.worded(flag(field)) if field is not None else message)
        if exit_code is not None:
            self.exit_code = exit_code

    def worded(self, name: str) -> str:
        """The message with its field called ``name`` ("" leaves the name out)."""
        if self.field is None:
            return str(self)
        head = " ".join(part for part in (name, self.subject) if part)
        return f"{head}: {self.detail}" if head else self.detail


class UsageError(GpustationError):
    exit_code = EXIT_USAGE


class NoDriverError(GpustationError):
    exit_code = EXIT_NO_DRIVER


class NeedsRootError(GpustationError):
    exit_code = EXIT_NEEDS_ROOT


class NotSupportedError(GpustationError):
    exit_code = EXIT_NOT_SUPPORTED
