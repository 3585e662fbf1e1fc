"""A listening socket whose next accepts fail, as they do out of file descriptors."""

from __future__ import annotations

import os
import socket
import time
from typing import Any


class Refusing(socket.socket):
    """Its next accepts fail with the error numbers in ``errors``; ``tried_at`` keeps
    when each failed one was tried."""

    errors: list[int]
    tried_at: list[float]

    def accept(self) -> tuple[socket.socket, Any]:
        if self.errors:
            self.tried_at.append(time.monotonic())
            code = self.errors.pop(0)
            raise OSError(code, os.strerror(code))
        return super().accept()


def refusing(real: socket.socket, errors: list[int]) -> Refusing:
    """``real`` (a listening socket, which gives up its descriptor) as a :class:`Refusing`."""
    blocking = real.getblocking()
    sock = Refusing(real.family, real.type, real.proto, fileno=real.detach())
    sock.setblocking(blocking)
    sock.errors, sock.tried_at = errors, []
    return sock
