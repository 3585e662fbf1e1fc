"""A recording: snapshots in zstd-compressed JSON Lines, read back with seek.

File format (``gpustation.recording/1``): a sequence of zstd frames, each
holding one ``gpustation.snapshot/1`` document per line, oldest first. Before
each data frame a zstd *skippable* frame carries ``{"t": first snapshot time}``
(any zstd tool skips it: ``zstdcat FILE`` prints the JSON Lines). A frame is
streamed, its lines flushed as zstd blocks, so a reader decompresses a torn
last frame up to its last whole line.

The index is built on open without decompressing: the scan reads the
skippable frames' times and walks the data frames' block headers to find where
each ends. A seek decompresses one frame. A data frame without a time before
it (a file made with ``zstd``) has its first line decompressed for its time.

A recording is the chain of ``FILE.N`` ... ``FILE.1``, ``FILE`` (the older
files rotated out of ``FILE``): :class:`Recording` reads the whole chain,
oldest first.
"""

from __future__ import annotations

import bisect
import mmap
import os
import stat
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import zstandard

from gpustation import jsondoc
from gpustation.errors import UsageError
from gpustation.files import open_regular
from gpustation.telemetry.model import Snapshot
from gpustation.textsafe import plain_json, safe_doc

FORMAT = "gpustation.recording/1"
ZSTD_MAGIC = 0xFD2FB528
SKIP_MAGIC = 0x184D2A5E  # one of zstd's skippable-frame magics (0x184D2A50..5F)
SKIP_FIRST, SKIP_LAST = 0x184D2A50, 0x184D2A5F
#: the playback speeds ``gpustation replay`` steps through
SPEEDS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
#: a recorded line longer than this is not a snapshot
MAX_LINE_BYTES = 16 * 1024 * 1024


def format_time(t: float) -> str:
    """A recording time as a person reads it: local ISO 8601 to the second, with offset."""
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def chain(path: Path) -> list[Path]:
    """The files of a recording, oldest first: ``FILE.N`` ... ``FILE.1``, ``FILE``."""
    older: list[Path] = []
    k = 1
    while True:
        p = path.with_name(f"{path.name}.{k}")
        if not p.exists():
            break
        older.append(p)
        k += 1
    files = [*reversed(older)]
    if path.exists():
        files.append(path)
    return files


def is_recording(path: Path) -> bool:
    """Whether ``path`` is empty or begins as a recording does (its format's header),
    so that a writer never rotates away a file of someone else's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        head = os.read(fd, 8 + 4096)
    finally:
        os.close(fd)
    if not head:
        return True
    if len(head) < 8 or struct.unpack_from("<I", head)[0] != SKIP_MAGIC:
        return False
    size = struct.unpack_from("<I", head, 4)[0]
    try:
        meta = jsondoc.loads(head[8 : 8 + size], max_bytes=4096)
    except ValueError:
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT


@dataclass(slots=True)
class FrameRef:
    """Where one data frame lies and the time of its first snapshot."""

    path: Path
    offset: int
    end: int
    t0: float | None
    #: False for a frame cut short (a writer killed or still writing)
    whole: bool = True


@dataclass(slots=True)
class _Scan:
    frames: list[FrameRef] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _frame_end(data: bytes | mmap.mmap, pos: int) -> tuple[int, bool]:
    """Where the zstd frame starting at ``pos`` ends, from its block headers alone.

    Returns (end, whole); a frame cut short ends at the data's end.
    """
    n = len(data)
    if pos + 5 > n:
        return n, False
    fhd = data[pos + 4]
    fcs_flag, single, checksum, did_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
    header = 1 + (0 if single else 1) + (0, 1, 2, 4)[did_flag]
    header += (1 if single else 0, 2, 4, 8)[fcs_flag]
    p = pos + 4 + header
    while True:
        if p + 3 > n:
            return n, False
        bh = data[p] | (data[p + 1] << 8) | (data[p + 2] << 16)
        last, kind, size = bh & 1, (bh >> 1) & 3, bh >> 3
        if kind == 3:
            raise ValueError("a corrupt zstd block")
        p += 3 + (1 if kind == 1 else size)
        if p > n:
            return n, False
        if last:
            break
    p += 4 if checksum else 0
    return (p, True) if p <= n else (n, False)


def _map(path: Path) -> bytes | mmap.mmap:
    """The bytes of a file, mapped (pages are read when touched); a FIFO or a device
    is refused (NotRegularFile, an OSError), not waited on or mapped."""
    with open_regular(path, "recording") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _scan(path: Path, data: bytes | mmap.mmap) -> _Scan:
    out = _Scan()
    pos, n = 0, len(data)
    t0: float | None = None
    while pos < n:
        if pos + 8 > n:
            out.problems.append(f"{path}: {n - pos} stray bytes at the end")
            break
        magic = struct.unpack_from("<I", data, pos)[0]
        if SKIP_FIRST <= magic <= SKIP_LAST:
            size = struct.unpack_from("<I", data, pos + 4)[0]
            payload = data[pos + 8 : pos + 8 + size]
            pos += 8 + size
            try:
                meta = jsondoc.loads(bytes(payload), MAX_LINE_BYTES)
                t0 = float(meta["t"]) if isinstance(meta, dict) and "t" in meta else None
            except (ValueError, TypeError, KeyError):
                t0 = None
            continue
        if magic != ZSTD_MAGIC:
            out.problems.append(f"{path}: not zstd data at byte {pos}")
            break
        try:
            end, whole = _frame_end(data, pos)
        except ValueError as err:
            out.problems.append(f"{path}: {err} at byte {pos}")
            break
        out.frames.append(FrameRef(path, pos, end, t0, whole))
        t0 = None
        pos = end
    return out


def intact(path: Path) -> bool:
    """Whether a recording file ends on a whole frame (appending to it is safe)."""
    try:
        data = _map(path)
    except OSError:
        return False
    scan = _scan(path, data)
    return not scan.problems and all(f.whole for f in scan.frames)


def _lines(raw: bytes, where: str = "", problems: list[str] | None = None) -> list[dict[str, Any]]:
    """The snapshot documents of a frame's text; a line that is not one is skipped
    (and, with ``problems``, said once per frame: the first, and how many)."""
    docs = []
    skipped: list[str] = []
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            doc = jsondoc.loads(line, MAX_LINE_BYTES)
        except jsondoc.DocumentError as err:
            skipped.append(str(err))  # or a torn line: the writer died in the middle of it
            continue
        time = doc.get("time") if isinstance(doc, dict) else None
        if isinstance(time, (int, float)) and not isinstance(time, bool):
            # Recordings are made to be shared: a host name or a process's argv
            # in one is another party's text (rule 8).
            docs.append(doc if plain_json(line) else safe_doc(doc))
        else:
            skipped.append('no finite "time"')
    if skipped and problems is not None:
        more = f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""
        problem = f"{where}: a line skipped ({skipped[0]}){more}"
        if problem not in problems:  # a frame decoded again says it once
            problems.append(problem)
    return docs


class Recording:
    """A recording (the chain of ``FILE.N`` ... ``FILE``) opened for reading.

    The index of frames is built on open; ``docs(frame)`` decompresses one
    frame (a few kept decoded). Readers never write.
    """

    CACHE = 4

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        files = chain(self.path)
        if not files:
            raise UsageError(f"no recording at {self.path}")
        self.problems: list[str] = []
        self.frames: list[FrameRef] = []
        self._data: dict[Path, bytes | mmap.mmap] = {}
        for p in files:
            try:
                data = _map(p)
            except OSError as err:
                self.problems.append(f"cannot read {p}: {err.strerror or err}")
                continue
            self._data[p] = data
            scan = _scan(p, data)
            self.problems.extend(scan.problems)
            self.frames.extend(scan.frames)
        self._cache: OrderedDict[int, list[dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()  # the cache is shared by the replay's threads
        # frames without a time before them, or empty ones: decode their first line
        for i, ref in enumerate(self.frames):
            if ref.t0 is None:
                docs = self.docs(i)
                ref.t0 = float(docs[0]["time"]) if docs else None
        self.frames = [f for f in self.frames if f.t0 is not None]
        self.frames.sort(key=lambda f: f.t0 or 0.0)
        self._cache.clear()
        self._t0s = [f.t0 or 0.0 for f in self.frames]
        last = self._last_docs()
        if not self.frames or not last:
            why = f" ({'; '.join(self.problems[:3])})" if self.problems else ""
            raise UsageError(f"{self.path}: no snapshots in the recording{why}")
        self.start = self._t0s[0]
        self.end = float(last[-1]["time"])

    def _last_docs(self) -> list[dict[str, Any]]:
        for i in range(len(self.frames) - 1, -1, -1):
            docs = self.docs(i)
            if docs:
                return docs
        return []

    def docs(self, index: int) -> list[dict[str, Any]]:
        """The snapshot documents of frame ``index``, oldest first (whole lines only)."""
        with self._lock:
            return self._docs(index)

    def _docs(self, index: int) -> list[dict[str, Any]]:
        cached = self._cache.get(index)
        if cached is not None:
            self._cache.move_to_end(index)
            return cached
        ref = self.frames[index]
        raw = self._data[ref.path][ref.offset : ref.end]
        try:
            text = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
        except zstandard.ZstdError as err:
            self.problems.append(f"{ref.path}: frame at byte {ref.offset}: {err}")
            text = b""
        if not ref.whole:
            text = text[: text.rfind(b"\n") + 1]  # up to the last whole line
        docs = _lines(text, f"{ref.path}: frame at byte {ref.offset}", self.problems)
        self._cache[index] = docs
        if len(self._cache) > self.CACHE:
            self._cache.popitem(last=False)
        return docs

    def frame_for(self, t: float) -> int:
        """The frame holding the last snapshot at or before ``t`` (0 before the start)."""
        return max(0, bisect.bisect_right(self._t0s, t) - 1)

    def locate(self, t: float) -> tuple[int, int]:
        """(frame, line) of the last snapshot at or before ``t`` (the first before the start)."""
        i = self.frame_for(t)
        while True:
            docs = self.docs(i)
            if docs or i == 0:
                break
            i -= 1
        times = [float(d["time"]) for d in docs]
        return i, max(0, bisect.bisect_right(times, t) - 1)

    def doc_at(self, t: float) -> dict[str, Any]:
        i, j = self.locate(t)
        return self.docs(i)[j]

    def snapshot_at(self, t: float) -> Snapshot:
        """The snapshot recorded at (the last one at or before) ``t``."""
        return Snapshot.from_dict(self.doc_at(t))

    def iter_docs(self) -> Iterator[dict[str, Any]]:
        """Every snapshot document, oldest first."""
        for i in range(len(self.frames)):
            yield from self.docs(i)

    def span(self) -> str:
        return f"{format_time(self.start)} to {format_time(self.end)}"

    @property
    def size(self) -> int:
        return sum(len(d) for d in self._data.values())
