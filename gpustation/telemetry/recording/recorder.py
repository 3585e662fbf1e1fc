"""The flight recorder: snapshots written to a recording, rotated to stay under a size.

The file format (``gpustation.recording/1``) and its reader are
:mod:`gpustation.telemetry.recording.file`. A frame is streamed: the lines written
so far are flushed as a zstd block every ``flush_s`` (so a killed writer loses
at most those seconds); a new frame starts every ``frame_s`` seconds.

Rotation: ``FILE`` is written until it reaches a quarter of ``max_size``, then
renamed ``FILE.1`` (``FILE.1`` to ``FILE.2`` ...) and the oldest files are
deleted so that all of them stay under ``max_size``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard

from gpustation import paths, private
from gpustation.config import section
from gpustation.errors import GpustationError, UsageError
from gpustation.telemetry.model import Snapshot
from gpustation.telemetry.recording.file import (
    FORMAT,
    SKIP_MAGIC,
    chain,
    format_time,
    intact,
    is_recording,
)

DEFAULT_MAX_SIZE = 200 * 1000 * 1000
#: the smallest cap: a few frames per file
MIN_MAX_SIZE = 16 * 1024
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
        make_dir: bool = False,
    ) -> None:
        self.path = Path(path)
        #: only gpustation's own folder is made when missing; a folder a user
        #: named must exist (under sudo, one made here would be root's)
        self._make_dir = make_dir
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
        # what a reader would find: samples in the blocks written whole so far
        # (those still in the compressor are lost with a failed write)
        self._on_disk = 0
        self._on_disk_last: float | None = None
        self.error: str | None = None
        self._open()

    # ---- files -------------------------------------------------------------
    def _open(self) -> None:
        parent = self.path.parent
        if not parent.is_dir() and not self._make_dir:
            raise RecordError(f"cannot write {self.path}: the folder {parent} does not exist")
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            parent.mkdir(parents=True, exist_ok=True)
            # never followed: a link planted there would have us create or lock its target
            lock = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, private.FILE_MODE)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise RecordError(
                    f"cannot write {self.path}: its lock {lock_path} is a symbolic link; remove it"
                ) from None
            raise RecordError(f"cannot write {self.path}: {err.strerror or err}") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            raise RecordError(f"{self.path} is being recorded by another process") from None
        self._lock_fd = lock
        foreign = [p for p in chain(self.path) if not is_recording(p)]
        if foreign:
            self._release()
            raise RecordError(
                f"{foreign[0]} exists and is not a gpustation recording: "
                "give another FILE, or move that file away"
            )
        try:
            if self.path.exists() and not intact(self.path):
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
            self.samples += 1
            if self.first_time is None:
                self.first_time = snap.time
            self.last_time = snap.time
            block = now - self._last_flush >= self.flush_s
            if block:
                out += self._obj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
                self._last_flush = now
                self._pending = False
            if out:
                _write(self._fd, out)
            if block:
                self._written()
            if os.fstat(self._fd).st_size >= self._limit:
                self._end_frame()
        except OSError as err:
            self._fail(err)
        return True

    def _written(self) -> None:
        """Every sample added so far is in a block on disk."""
        self._on_disk = self.samples
        self._on_disk_last = self.last_time

    def _end_frame(self) -> None:
        if self._obj is not None and self._fd is not None:
            obj, self._obj = self._obj, None
            _write(self._fd, obj.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH))
            self._pending = False
            self._written()

    def flush(self) -> None:
        """Put every snapshot added so far on disk (as a zstd block)."""
        if self._obj is not None and self._fd is not None and self._pending:
            try:
                _write(self._fd, self._obj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))
            except OSError as err:
                self._fail(err)
            self._written()
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
        """What the recording holds on disk, in words (not what was only added)."""
        if self.first_time is None or self._on_disk_last is None or not self._on_disk:
            return "no samples were recorded"
        return (
            f"kept {self._on_disk} samples from {format_time(self.first_time)} "
            f"to {format_time(self._on_disk_last)} in {self.path}"
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

    settings = record_settings(section("record"))
    if not settings.enabled:
        return None
    return Recorder(
        settings.path or default_path(),
        max_size=settings.max_size,
        interval_s=settings.interval_s,
        make_dir=settings.path is None,
    )
