"""The first-frame detection of ``bench/dashboard_cpu.py``: a virtual screen.

A curses program (nvitop) writes only the cells that changed, skips blanks
with cursor moves and colours parts of a word; the benchmark must still see
the text that is on screen.
"""

from __future__ import annotations

import importlib.util
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SENTINEL = b"\x1b]7777\x07"  # an OSC the screen ignores: splits the recording into frames


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "dashboard_cpu", REPO / "bench" / "dashboard_cpu.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench = load_bench()

# Three frames of an nvitop-like screen drawn with curses: the header alone,
# then a device row (part of its memory column in another colour), then the
# same row with one character changed (curses sends only that cell).
CURSES_PROGRAM = r"""
import curses, os, sys
SENTINEL = b"\x1b]7777\x07"

def mark():
    os.write(1, SENTINEL)

def main(win):
    curses.start_color()
    curses.init_pair(1, curses.COLOR_GREEN, curses.COLOR_BLACK)
    win.addstr(0, 0, "Sun Nov 29 17:00:00 2026")
    win.addstr(2, 0, "| NVITOP 1.7.2    Driver Version: 580.95.05    CUDA Driver Version: 13.0 |")
    win.refresh()
    mark()
    row = "| 30%   39C    P8    18W / 450W | {:>20} | {:>7}  {:>11} |"
    win.addstr(5, 0, row.format("0B / 140.4GiB", "0%", "Default"))
    win.chgat(5, 40, 5, curses.color_pair(1) | curses.A_BOLD)
    win.refresh()
    mark()
    win.addstr(5, 33, row.format("8B / 140.4GiB", "0%", "Default")[33:])
    win.refresh()
    mark()

curses.wrapper(main)
"""


def record_curses(program: str) -> bytes:
    """Run ``program`` under a 160x48 pseudo-terminal; return all it wrote."""
    pid, fd = pty.fork()
    if pid == 0:  # child
        import fcntl
        import struct
        import termios

        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 160, 0, 0))
        env = dict(os.environ, TERM="xterm-256color", LINES="48", COLUMNS="160")
        os.execvpe(sys.executable, [sys.executable, "-c", program], env)
    out = b""
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
    finally:
        os.close(fd)
        _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        pytest.skip(f"curses could not run here (exit {status}): {out[-300:]!r}")
    return out


@pytest.fixture(scope="module")
def curses_frames() -> list[bytes]:
    probe = subprocess.run([sys.executable, "-c", "import curses"], capture_output=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip("no curses module in this Python")
    frames = record_curses(CURSES_PROGRAM).split(SENTINEL)
    assert len(frames) == 4, frames  # three frames and what curses writes on exit
    return frames


def screen_after(frames: list[bytes], chunk: int = 7) -> str:
    """Feed the frames in small pieces (splitting sequences and UTF-8) and read the screen."""
    screen = bench.VirtualScreen(160, 48)
    data = b"".join(frames)
    for i in range(0, len(data), chunk):
        screen.feed(data[i : i + chunk])
    text: str = screen.text()
    return text


def test_nvitop_marker_appears_with_the_device_row_not_with_the_header(
    curses_frames: list[bytes],
) -> None:
    header_only = bench.VirtualScreen(160, 48)
    header_only.feed(curses_frames[0])
    hit = bench.find_marker(header_only, bench.NVITOP_MARKERS)
    # The header alone matches only the fallback marker, never the device row's.
    assert hit is not None and hit[0].label == "nvitop's header"
    assert "Driver Version: 580.95.05" in hit[1]

    screen = bench.VirtualScreen(160, 48)
    for frame in curses_frames[:2]:
        screen.feed(frame)
    hit = bench.find_marker(screen, bench.NVITOP_MARKERS)
    assert hit is not None
    marker, text = hit
    assert marker.label == "a GPU's memory used / total"
    assert text == "0B / 140.4GiB"
    # The old marker: an idle H200 shows no "MiB" anywhere.
    assert "MiB" not in screen.text()


def test_virtual_screen_applies_curses_updates_of_single_cells(
    curses_frames: list[bytes],
) -> None:
    # The third frame carries only the changed cell; the screen has the whole row.
    text = screen_after(curses_frames[:3])
    row = text.splitlines()[5]
    assert "| 30%   39C    P8    18W / 450W |        8B / 140.4GiB |      0%      Default |" in row
    assert "Sun Nov 29 17:00:00 2026" in text.splitlines()[0]


def test_virtual_screen_cursor_moves_erases_and_repeats() -> None:
    screen = bench.VirtualScreen(40, 5)
    # Written out of order with absolute moves, a colour inside a word, a
    # relative move over a gap, a repeat (REP) and an erase (ECH).
    stream = (
        b"\x1b[?1049h\x1b[2J"
        b"\x1b[2;9Hersion: 580\x1b[2;1HDriver\x1b[1C\x1b[1m\x1b[38;5;2mV\x1b[m"
        b"\x1b[3;1H\xe2\x94\x80\x1b[9b"  # a box line: one character repeated 9 more times
        b"\x1b[4;1HTemp  55 Cxxxx\x1b[4D\x1b[4X"
        b"\x1b[5;1Hgone\x1b[5;1H\x1b[K"
        b"\x1b]0;a window title\x07"
    )
    for i in range(len(stream)):  # one byte at a time: every sequence is split
        screen.feed(stream[i : i + 1])
    lines = screen.text().split("\n")
    assert lines[1] == "Driver Version: 580"
    assert lines[2] == "─" * 10
    assert lines[3] == "Temp  55 C"
    assert lines[4] == ""
    hit = bench.find_marker(screen, bench.GPUSTATION_MARKERS)
    assert hit is not None and hit[1] == "Temp  55 C"
    hit = bench.find_marker(screen, bench.NVITOP_MARKERS)
    assert hit is not None and hit[1] == "Driver Version: 580"
