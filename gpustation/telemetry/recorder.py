"""The flight recorder: snapshots written to zstd-compressed JSON Lines, read back with seek.

File format (``gpustation.recording/1``): a sequence of zstd frames, each
holding one ``gpustation.snapshot/1`` document per line, oldest first. Before
each data frame a zstd *skippable* frame carries ``{"t": first snapshot time}``
(any zstd tool skips it: ``zstdcat FILE`` prints the JSON Lines). A frame is
streamed: the lines written so far are flushed as a zstd block every
``flush_s`` (so a killed writer loses at most those seconds, and a reader
decompresses a torn last frame up to its last whole line); a new frame starts
every ``frame_s`` seconds.

The index is built on open without decompressing: the scan reads the
skippable frames' times and walks the data frames' block headers to find where
each ends. A seek decompresses one frame. A data frame without a time before
it (a file made with ``zstd``) has its first line decompressed for its time.

Rotation: ``FILE`` is written until it reaches a quarter of ``max_size``, then
renamed ``FILE.1`` (``FILE.1`` to ``FILE.2`` ...) and the oldest files are
deleted so that all of them stay under ``max_size``. :class:`Recording` reads
the whole chain, oldest first.
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import json
import math
import mmap
import os
import re
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import zstandard

from gpustation import paths
from gpustation.errors import GpustationError, UsageError
from gpustation.telemetry.model import Snapshot

FORMAT = "gpustation.recording/1"
ZSTD_MAGIC = 0xFD2FB528
SKIP_MAGIC = 0x184D2A5E  # one of zstd's skippable-frame magics (0x184D2A50..5F)
SKIP_FIRST, SKIP_LAST = 0x184D2A50, 0x184D2A5F
DEFAULT_MAX_SIZE = 200 * 1000 * 1000
#: the smallest cap: a few frames per file
MIN_MAX_SIZE = 16 * 1024
#: the playback speeds ``gpustation replay`` steps through
SPEEDS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
#: files in a chain: FILE and up to this many older ones
SEGMENTS = 4

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def parse_size(text: str | int, what: str = "--max-size") -> int:
    """Bytes from ``200MB``, ``1.5GiB``, ``64k`` or a plain number; UsageError naming ``what``."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _SIZE.fullmatch(str(text))
        unit = m.group(2).lower() if m else ""
        if m is None or unit not in _UNITS:
            raise UsageError(f"{what}: a size such as 200MB, 1GiB or 500k, got {text!r}")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value < MIN_MAX_SIZE:
        raise UsageError(f"{what}: at least {MIN_MAX_SIZE // 1024} KiB, got {text!r}")
    return value


def parse_time(text: str) -> float:
    """Unix seconds from ``1764581400.5`` or ISO 8601 (local time unless an offset is given)."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise ValueError(f"{text!r} is not a time")
        return value
    iso = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        return datetime.fromisoformat(iso).timestamp()  # naive: local time
    except ValueError:
        raise ValueError(
            f"{text!r} is neither Unix seconds nor an ISO 8601 time "
            "(e.g. 2026-12-01T09:30:00 or 2026-12-01T09:30:00+01:00)"
        ) from None


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


class RecordError(GpustationError):
    """Writing the recording failed (a full disk, a removed directory)."""


def _write(fd: int, data: bytes) -> None:
    """Write all of ``data`` (the one place the recorder writes, so tests can fail it)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, "short write")
        view = view[n:]


def _skippable(meta: dict[str, Any]) -> bytes:
    payload = json.dumps(meta, separators=(",", ":")).encode()
    return struct.pack("<II", SKIP_MAGIC, len(payload)) + payload


class Recorder:
    """Writes snapshots to ``path``, rotating to stay under ``max_size`` bytes in all.

    ``add`` keeps at most one snapshot per ``interval_s`` (of snapshot time),
    so a sampler running faster (the dashboard) records at the asked rate.
    Every failure to write is a :class:`RecordError` saying what was kept.
    One process writes a recording at a time (``FILE.lock``).
    """

    def __init__(
        self,
        path: Path,
        max_size: int = DEFAULT_MAX_SIZE,
        interval_s: float = 0.0,
        flush_s: float = 2.0,
        frame_s: float = 60.0,
        level: int = 3,
        clock: Any = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.max_size = max_size
        self.segment_size = max(MIN_MAX_SIZE // SEGMENTS, max_size // SEGMENTS)
        # A file ends its frame this far below its share, so the last write
        # (a block of a few snapshots) keeps the whole chain under max_size.
        self._limit = self.segment_size - min(self.segment_size // 4, 64 * 1024)
        self.interval_s = interval_s
        self.flush_s = flush_s
        self.frame_s = frame_s
        self._clock = clock
        self._cctx = zstandard.ZstdCompressor(level=level)
        self._obj: Any = None  # the open frame's compressor
        self._frame_started = 0.0
        self._last_flush = 0.0
        self._pending = False
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self.samples = 0
        self.first_time: float | None = None
        self.last_time: float | None = None
        self.error: str | None = None
        self._open()

    # ---- files -------------------------------------------------------------
    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = os.open(
                self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644
            )
        except OSError as err:
            raise RecordError(f"cannot write {self.path}: {err.strerror or err}") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            raise RecordError(f"{self.path} is being recorded by another process") from None
        self._lock_fd = lock
        try:
            if self.path.exists() and not _intact(self.path):
                # a torn last frame (a writer killed): keep it whole, start a fresh file
                self._rotate()
            self._open_current()
        except OSError as err:
            self._release()
            raise RecordError(f"cannot write {self.path}: {err.strerror or err}") from None

    def _open_current(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _rotate(self) -> None:
        """FILE -> FILE.1 -> FILE.2 ...; delete the oldest beyond the cap."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        files = list(reversed(chain(self.path)))  # newest first
        budget = self.max_size - self.segment_size
        kept: list[Path] = []
        total = 0
        for p in files:
            size = p.stat().st_size
            if total + size <= budget and len(kept) < SEGMENTS - 1:
                kept.append(p)
                total += size
            else:
                p.unlink()
        for k in range(len(kept), 0, -1):
            os.replace(kept[k - 1], self.path.with_name(f"{self.path.name}.{k}"))

    def files(self) -> list[Path]:
        return chain(self.path)

    @property
    def size(self) -> int:
        """Bytes on disk over the whole chain."""
        return sum(p.stat().st_size for p in self.files() if p.exists())

    # ---- writing -----------------------------------------------------------
    def add(self, snap: Snapshot) -> bool:
        """Record ``snap`` (unless within ``interval_s`` of the last); False when skipped."""
        if self._fd is None:
            raise RecordError(self.error or f"the recording {self.path} is closed")
        if self.last_time is not None and snap.time - self.last_time < self.interval_s * 0.9:
            return False
        line = json.dumps(snap.to_dict(), separators=(",", ":")).encode() + b"\n"
        now = self._clock()
        try:
            if self._obj is not None and now - self._frame_started >= self.frame_s:
                self._end_frame()
            if self._obj is None:
                size = os.fstat(self._fd).st_size
                if size >= self._limit:
                    self._rotate()
                    self._open_current()
                self._obj = self._cctx.compressobj()
                self._frame_started = now
                _write(self._fd, _skippable({"t": snap.time, "format": FORMAT}))
            out = self._obj.compress(line)
            self._pending = True
            if now - self._last_flush >= self.flush_s:
                out += self._obj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
                self._last_flush = now
                self._pending = False
            if out:
                _write(self._fd, out)
            if os.fstat(self._fd).st_size >= self._limit:
                self._end_frame()
        except OSError as err:
            self._fail(err)
        self.samples += 1
        if self.first_time is None:
            self.first_time = snap.time
        self.last_time = snap.time
        return True

    def _end_frame(self) -> None:
        if self._obj is not None and self._fd is not None:
            obj, self._obj = self._obj, None
            _write(self._fd, obj.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH))
            self._pending = False

    def flush(self) -> None:
        """Put every snapshot added so far on disk (as a zstd block)."""
        if self._obj is not None and self._fd is not None and self._pending:
            try:
                _write(self._fd, self._obj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))
            except OSError as err:
                self._fail(err)
            self._pending = False
            self._last_flush = self._clock()

    def _fail(self, err: OSError) -> None:
        kept = self.kept()
        self.error = f"cannot write {self.path}: {err.strerror or err}; {kept}"
        self._obj = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._release()
        raise RecordError(self.error) from None

    def kept(self) -> str:
        """What the recording holds so far, in words."""
        if self.first_time is None or self.last_time is None:
            return "no samples were recorded"
        return (
            f"kept {self.samples} samples from {format_time(self.first_time)} "
            f"to {format_time(self.last_time)} in {self.path}"
        )

    def close(self) -> None:
        """End the open frame and release the file (safe to call twice).

        Raises RecordError when the last write fails: that is data lost too.
        """
        if self._fd is not None:
            try:
                self._end_frame()
                os.fsync(self._fd)
            except OSError as err:
                self._fail(err)  # closes, releases, raises
            os.close(self._fd)
            self._fd = None
        self._release()

    def _release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- reading ----------------------------------------------------------------


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
    """The bytes of a file, mapped (pages are read when touched)."""
    with path.open("rb") as f:
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
                meta = json.loads(payload)
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


def _intact(path: Path) -> bool:
    """Whether a recording file ends on a whole frame (appending to it is safe)."""
    try:
        data = _map(path)
    except OSError:
        return False
    scan = _scan(path, data)
    return not scan.problems and all(f.whole for f in scan.frames)


def _lines(raw: bytes) -> list[dict[str, Any]]:
    docs = []
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue  # a torn line: the writer died in the middle of it
        if isinstance(doc, dict) and isinstance(doc.get("time"), (int, float)):
            docs.append(doc)
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
        docs = _lines(text)
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


# ---- the [record] table of config.toml -----------------------------------------


def default_path() -> Path:
    return paths.data_dir() / "recordings" / "gpustation.jsonl.zst"


@dataclass(frozen=True, slots=True)
class RecordSettings:
    """``[record]``: an always-on recording kept by the dashboard and ``serve``."""

    enabled: bool = False
    path: Path | None = None  # None: default_path()
    max_size: int = DEFAULT_MAX_SIZE
    interval_s: float = 1.0


def record_settings(table: dict[str, Any]) -> RecordSettings:
    """Validate a ``[record]`` table; UsageError naming the key that is wrong."""
    known = {"enabled", "path", "max_size", "interval"}
    for key in table:
        if key not in known:
            raise UsageError(f"[record] {key}: not a setting (known: {', '.join(sorted(known))})")
    enabled = table.get("enabled", False)
    if not isinstance(enabled, bool):
        raise UsageError(f"[record] enabled: true or false, got {enabled!r}")
    path = table.get("path")
    if path is not None and (not isinstance(path, str) or not path.strip()):
        raise UsageError(f"[record] path: a file name, got {path!r}")
    size = table.get("max_size", DEFAULT_MAX_SIZE)
    if not isinstance(size, (str, int)) or isinstance(size, bool):
        raise UsageError(f'[record] max_size: a size such as "200MB", got {size!r}')
    interval = table.get("interval", 1.0)
    if (
        not isinstance(interval, (int, float))
        or isinstance(interval, bool)
        or not (math.isfinite(interval) and 0.05 <= interval <= 3600)
    ):
        raise UsageError(f"[record] interval: between 0.05 and 3600 seconds, got {interval!r}")
    return RecordSettings(
        enabled=enabled,
        path=Path(path).expanduser() if path else None,
        max_size=parse_size(size, "[record] max_size"),
        interval_s=float(interval),
    )


def recorder_from_config() -> Recorder | None:
    """The ``[record]`` recording, opened; None when it is not enabled.

    UsageError for a bad table; RecordError when the file cannot be written.
    """
    from gpustation.config import section

    settings = record_settings(section("record"))
    if not settings.enabled:
        return None
    return Recorder(
        settings.path or default_path(),
        max_size=settings.max_size,
        interval_s=settings.interval_s,
    )
