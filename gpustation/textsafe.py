"""Text from another party, made safe for a terminal.

GPU process command lines (any local user's argv), a remote host's fields, a
recording, a run's log, metrics and ``run.json``, preset and profile text and
the control journal can hold escape sequences: an OSC that retitles the
terminal or writes the clipboard (OSC 52), a CSI that moves the cursor or
clears the screen. Everything such text goes through before it is printed or
drawn: escape sequences are removed whole, other C0 and C1 control characters
(and DEL) become U+FFFD, so a line keeps its length class and shows that
something was there. Tabs become a space; a newline is shown as ``⏎`` unless
the caller keeps newlines. Bidirectional controls (the overrides, embeddings,
isolates and marks) are shown as their escape, ``\\u202e``, never obeyed: the
reader sees the characters in the order they were written.
"""

from __future__ import annotations

import re
from typing import Any

# ESC-introduced sequences: CSI (ESC [ ... final), OSC/DCS/SOS/PM/APC strings
# (ESC ] ... BEL or ST), and two-character escapes; their 8-bit C1 forms too.
_SEQUENCES = re.compile(
    r"""
    (?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?              # CSI
  | (?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])         # OSC, DCS, SOS, PM, APC ...
        [^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?       # ... up to BEL or ST
  | \x1b[ -/]*[0-~]?                                # other escapes (ESC 7, ESC c ...)
    """,
    re.VERBOSE,
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROLS_NO_NEWLINE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
#: Unicode's Bidi_Control characters: ALM, LRM, RLM, LRE..RLO, LRI..PDI
BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: how a newline shows where the text must stay on one line
NEWLINE = "\u23ce"


def _escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def safe(text: object, newlines: bool = False) -> str:
    """``text`` with escape sequences removed, control characters replaced and
    bidirectional controls escaped."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():
        return s  # the common case, at C speed
    s = _SEQUENCES.sub("", s).replace("\t", " ").replace("\r\n", "\n")
    if not newlines:
        s = s.replace("\n", NEWLINE)
    pattern = _CONTROLS if newlines else _CONTROLS_NO_NEWLINE
    return BIDI_CONTROLS.sub(_escaped, pattern.sub("\ufffd", s))


_SURROGATES = re.compile(r"[\ud800-\udfff]")


def valid_unicode(text: str) -> str:
    """``text`` as UTF-8 can hold it: bytes that were not UTF-8 (an argument
    Python decoded with ``surrogateescape``) and lone surrogates become U+FFFD,
    so SQLite, JSON readers and terminals take it."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # surrogates no undecodable byte explains
        return _SURROGATES.sub("\ufffd", text)


def safe_doc(value: Any) -> Any:
    """A decoded JSON document with every string in it (keys too) made :func:`safe`."""
    if isinstance(value, str):
        return safe(value)
    if isinstance(value, dict):
        return {safe(k): safe_doc(v) for k, v in value.items()}
    if isinstance(value, list):
        return [safe_doc(v) for v in value]
    return value


def plain_json(raw: bytes | str) -> bool:
    """Whether a JSON text can hold no string that :func:`safe` would change.

    JSON strings cannot hold a raw C0 control, so without a backslash (no
    ``\\u`` escape), a DEL or a byte beyond ASCII every string is printable
    ASCII; a reader then skips walking the decoded document.
    """
    if isinstance(raw, str):
        return raw.isascii() and "\\" not in raw and "\x7f" not in raw
    return raw.isascii() and b"\\" not in raw and b"\x7f" not in raw
