"""JSON written by another party, parsed within bounds.

Every document gpustation reads from outside its own process (a Prometheus
answer, a remote host's snapshot line, a recording's line) goes through
:func:`loads`: a size cap, a nesting depth checked before the parser recurses
(a line of ``[`` would otherwise end in RecursionError), and numbers that are
not finite (``NaN``, ``Infinity``, ``1e400``) read as missing (None), so they
can neither be printed back as ``Infinity`` nor compared as a real value.
What is wrong is raised as :class:`DocumentError` with a message for the user;
shapes are the caller's to check.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

#: deeper than any document gpustation reads (a snapshot or an API answer is under ten)
MAX_DEPTH = 64

_ESCAPES = re.compile(rb"\\.", re.DOTALL)
_STRINGS = re.compile(rb'"[^"]*"')
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'[]{}"')
#: one kind of bracket: depth is what is measured (the parser catches a ``[`` closed by ``}``)
_ONE_KIND = bytes.maketrans(b"{}", b"[]")


class DocumentError(ValueError):
    """A document that is too large, too deep or not JSON."""


def loads(raw: bytes | str, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in ``raw``; DocumentError naming what is wrong with it."""
    data = raw.encode("utf-8", errors="replace") if isinstance(raw, str) else raw
    if len(data) > max_bytes:
        raise DocumentError(f"larger than {_size(max_bytes)}")
    problem = _structure_problem(data, max_depth)
    if problem is not None:
        raise DocumentError(problem)
    try:
        return json.loads(data, parse_float=_finite, parse_constant=_missing)
    except RecursionError:  # only where the interpreter's own limit is below max_depth
        raise DocumentError(f"nested deeper than {max_depth} levels") from None
    except ValueError as err:  # JSONDecodeError, bad UTF-8, an integer too long
        raise DocumentError(f"not JSON ({err})") from None


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _missing(_name: str) -> None:
    return None


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def _structure_problem(data: bytes, max_depth: int) -> str | None:
    """Why the brackets outside strings nest deeper than ``max_depth`` (None when
    they do not, or when only the parser can tell what is wrong with them).

    Everything but brackets and quotes is dropped at C speed, then the
    innermost pairs are removed once per level (``bytes.replace`` does not look
    again at what it joined); only a remainder is walked in Python, and that
    walk ends at the first level too deep or the first unmatched bracket.
    """
    if data.count(b"[") + data.count(b"{") <= max_depth:
        return None  # too few openers to nest deeper: the common small document
    shape = _ESCAPES.sub(b"", data).translate(_ONE_KIND, _NOT_STRUCTURE)
    # Two adjacent quotes are an empty string or two strings side by side: dropping
    # them keeps what is inside strings inside, and most strings go at C speed.
    shape = _STRINGS.sub(b"", shape.replace(b'""', b"")).replace(b'"', b"")
    removed = 0
    while shape and removed < max_depth:
        shorter = shape.replace(b"[]", b"")
        if len(shorter) == len(shape):
            break
        shape, removed = shorter, removed + 1
    depth = removed
    for c in shape:
        depth += 1 if c == ord("[") else -1
        if depth > max_depth:
            return f"nested deeper than {max_depth} levels"
        if depth < removed:
            return None  # a bracket closed that was never opened: the parser says where
    return None
