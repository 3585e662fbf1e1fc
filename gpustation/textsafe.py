"""Text from another party, made safe for a terminal.

GPU process command lines (any local user's argv), a remote host's fields, a
run's log, preset and profile text and the control journal can hold escape
sequences: an OSC that retitles the terminal or writes the clipboard (OSC
52), a CSI that moves the cursor or clears the screen. Everything such text
goes through before it is printed or drawn: escape sequences are removed
whole, other C0 and C1 control characters (and DEL) become U+FFFD, so a line
keeps its length class and shows that something was there. Tabs become a
space; newlines are kept only where the caller asks.
"""

from __future__ import annotations

import re

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


def safe(text: object, newlines: bool = False) -> str:
    """``text`` with escape sequences removed and control characters replaced."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():
        return s  # the common case, at C speed
    s = _SEQUENCES.sub("", s).replace("\t", " ")
    pattern = _CONTROLS if newlines else _CONTROLS_NO_NEWLINE
    return pattern.sub("\ufffd", s)


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
