"""No text from another party reaches the terminal raw: another user's argv,
another host's fields. Escape sequences are removed, control characters shown
as U+FFFD, bidirectional controls written out; a newline on a line is ``⏎``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpustation.telemetry import host
from gpustation.telemetry.model import GpuSample, ProcessInfo, Snapshot
from gpustation.telemetry.table import render_snapshot
from gpustation.textsafe import plain_json, safe, safe_doc
from tests.runs.conftest import RunsEnv, wait_until

HOSTILE = [
    "\x1b]0;owned\x07",  # OSC 0: retitle the terminal
    "\x1b]52;c;aGVsbG8=\x07",  # OSC 52: write the clipboard
    "\x1b]52;c;aGk=\x1b\\",  # the same, ended by ST
    "\x1b[2J\x1b[H",  # clear the screen, home the cursor
    "\x9b31m",  # an 8-bit CSI
    "\x1bP+q\x1b\\",  # DCS
    "\x07\x08\x7f",  # bell, backspace, delete
]


@pytest.mark.parametrize("text", HOSTILE)
def test_safe_leaves_no_escape_or_control_character(text: str) -> None:
    out = safe(f"python {text}train.py")
    assert out.startswith("python ") and out.endswith("train.py")
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in out)


def test_another_user_s_argv_is_made_safe_where_it_is_read() -> None:
    if not host._LINUX:
        pytest.skip("reads /proc")
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", *HOSTILE], stdin=subprocess.PIPE
    )
    try:
        wait_until(
            lambda: b"sys.stdin.read" in Path(f"/proc/{child.pid}/cmdline").read_bytes(),
            30,
            "the child to exec",
        )
        proc = ProcessInfo(pid=child.pid)
        host.describe_process(proc)
        assert proc.command is not None and "import sys" in proc.command
        assert "\x1b" not in proc.command and "\x07" not in proc.command
        assert "\x9b" not in proc.command
    finally:
        child.kill()
        child.wait()


def test_the_snapshot_table_draws_no_escape_from_any_field() -> None:
    hostile = "".join(HOSTILE)
    snap = Snapshot(
        hostname=f"box{hostile}",
        time=0.0,
        gpus=[
            GpuSample(
                index=0,
                name=f"H200{hostile}",
                processes=[ProcessInfo(pid=1, user=f"eve{hostile}", command=f"x{hostile}")],
            )
        ],
    )
    text = render_snapshot(snap, color=False)
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
    assert "H200" in text and "eve" in text


def test_a_run_s_log_tail_and_its_preset_text_reach_the_terminal_safe(runs_env: RunsEnv) -> None:
    import subprocess

    from tests.conftest import child_env, gpustation_cmd
    from tests.runs.conftest import command_preset

    hostile = "".join(HOSTILE)
    code = f"import sys; print({hostile!r}); sys.exit(1)"
    runs_env["write_preset"](
        "evil",
        command_preset("evil", "crash").replace(
            'title = "evil title"', 'title = "evil \\u001b]0;owned\\u0007 title"'
        ),
    )
    env = child_env()
    run = subprocess.run(
        gpustation_cmd("run", "--", sys.executable, "-c", code),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1
    for argv in (
        ("runs", "show", "last"),
        ("runs", "list"),
        ("presets", "list"),
        ("presets", "show", "evil"),
    ):
        out = subprocess.run(
            gpustation_cmd(*argv), env=env, capture_output=True, text=True, timeout=60
        ).stdout
        assert "\x1b]" not in out and "\x07" not in out and "\x9b" not in out, argv


def test_the_runs_screen_draws_log_lines_without_their_escapes() -> None:
    from gpustation.tui.runs.widgets import _printable

    line = _printable("epoch 1\t" + "".join(HOSTILE) + " done")
    assert "\x1b" not in line and "\x07" not in line and line.endswith(" done")


def test_every_c1_control_is_replaced_and_8_bit_sequences_go_whole() -> None:
    # C1 controls (U+0080-U+009F) act on a terminal as their ESC forms do.
    strings = (0x90, 0x98, 0x9D, 0x9E, 0x9F)  # DCS, SOS, OSC, PM, APC: up to their end
    for code in range(0x80, 0xA0):
        out = safe(f"a{chr(code)}\u00e9")  # é: no part of a CSI
        assert out == "a" if code in strings else out.startswith("a") and out.endswith("\u00e9")
        assert not any(0x80 <= ord(c) <= 0x9F for c in out), hex(code)
    assert safe("a\x9b2Jb") == "ab"  # 8-bit CSI: clear the screen
    assert safe("a\x9d0;pwned\x07b") == "ab"  # 8-bit OSC 0, its title with it
    assert safe("a\x9d52;c;aGk=\x9cb") == "ab"  # 8-bit OSC 52 ended by the 8-bit ST
    assert safe("a\x85b") == "a\ufffdb"  # NEL, a lone C1 control, shows it was there


@pytest.mark.parametrize(
    "code", [*range(0x202A, 0x202F), *range(0x2066, 0x206A)], ids=lambda c: f"U+{c:04X}"
)
def test_bidirectional_overrides_and_isolates_are_shown_not_obeyed(code: int) -> None:
    assert safe(f"abc{chr(code)}def") == f"abc\\u{code:04x}def"


def test_a_newline_shows_as_one_return_symbol_on_a_line() -> None:
    assert safe("a\nb") == safe("a\r\nb") == "a\u23ceb"
    assert safe("a\r\nb", newlines=True) == "a\nb"


def test_a_json_text_said_plain_holds_no_string_safe_would_change() -> None:
    texts = [chr(c) for c in range(0x2070)] + ["\x1b]0;x\x07", "\\", "\u202e"]
    for text in texts:
        doc = {text: [text, {"k": text}]}
        for raw in (json.dumps(doc), json.dumps(doc, ensure_ascii=False)):
            if plain_json(raw) or plain_json(raw.encode()):
                assert safe_doc(json.loads(raw)) == json.loads(raw), repr(text)
    assert not plain_json(json.dumps({"unit": "\x1b]0;x\x07"}))
    assert not plain_json(json.dumps({"unit": "\u202e"}, ensure_ascii=False).encode())


def test_runs_show_writes_a_multi_line_command_on_one_readable_line(runs_env: RunsEnv) -> None:
    from tests.conftest import child_env, gpustation_cmd

    code = "import sys\nsys.exit(0)"
    env = child_env()
    ran = subprocess.run(
        gpustation_cmd("run", "--", sys.executable, "-c", code),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    shown = subprocess.run(
        gpustation_cmd("runs", "show", "last"),
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    command = next(line for line in shown.splitlines() if line.startswith("command"))
    assert command.endswith(" -c 'import sys\u23cesys.exit(0)'"), command
    assert "\ufffd" not in shown


def test_a_run_s_files_are_read_safe_and_run_json_exact_for_what_launches(tmp_path: Path) -> None:
    from gpustation.runs import rundir

    planted = "\x1b]0;owned\x07\u202e"
    argv = [sys.executable, "-c", f"print(1)\n#{planted}"]
    rundir.write_json(tmp_path / rundir.RUN_JSON, {"id": "r1", "argv": argv})
    assert rundir.read_run(tmp_path) == {
        "id": "r1",
        "argv": [sys.executable, "-c", "print(1)\u23ce#\\u202e"],
    }
    assert rundir.read_run(tmp_path, exact=True) == {"id": "r1", "argv": argv}
    rundir.write_json(
        tmp_path / rundir.STATE_JSON,
        {"id": "r1", "status": "failed", "reason": f"exit 1{planted}", "error_tail": [planted]},
    )
    state = rundir.read_state(tmp_path)
    assert state is not None and state.reason == "exit 1\\u202e"
    assert state.error_tail == ["\\u202e"]
    log = tmp_path / rundir.OUTPUT_LOG
    log.write_bytes(f"step\t1\nTraceback{planted}\n".encode())
    assert rundir.tail_lines(log) == ["step    1", "Traceback\\u202e"]


def test_text_that_utf8_cannot_hold_becomes_replacement_characters() -> None:
    from gpustation.textsafe import valid_unicode

    assert valid_unicode("plain café") == "plain café"  # already valid: the same text
    # bytes that were not UTF-8, as Python decodes them from argv (surrogateescape)
    raw = b"note \xff\xfe end".decode("utf-8", "surrogateescape")
    assert valid_unicode(raw) == "note \ufffd\ufffd end"
    assert valid_unicode(raw).encode("utf-8")  # SQLite and JSON take it
    # a lone surrogate that no undecodable byte explains
    assert valid_unicode("a\ud83db") == "a\ufffdb"
    assert valid_unicode("\udc80\ud800") == "\ufffd\ufffd"


def test_a_truncated_utf8_sequence_is_one_replacement_character() -> None:
    from gpustation.textsafe import valid_unicode

    raw = b"x \xe2\x82 y".decode("utf-8", "surrogateescape")  # a euro sign cut short
    assert valid_unicode(raw) == "x \ufffd y"


def test_safe_takes_any_value_and_turns_a_tab_into_a_space() -> None:
    assert safe(42) == "42" and safe(None) == "None"
    assert safe("a\tb\x1b[31m") == "a b"
