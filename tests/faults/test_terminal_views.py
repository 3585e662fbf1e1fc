"""Text from elsewhere reaches no terminal raw, in any view: each program runs in
a real pseudo-terminal and the bytes the terminal receives are read.

Planted in a shared recording, a run's command line, log and metrics, a preset
and a hardware profile: an OSC 52 (clipboard), an OSC 0 (window title), the
8-bit OSC and a right-to-left override. Each must arrive harmless: no OSC
carries the planted payload, no C1 control arrives, the override is written
out as ``\\u202e``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from gpustation.telemetry.recording.file import Recording
from tests.conftest import child_env, gpustation_cmd
from tests.ptyterm import HOSTILE, PtyProgram, assert_harmless
from tests.runs.conftest import RunsEnv
from tests.telemetry.recording_tools import make_recording

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def programs() -> Iterator[list[PtyProgram]]:
    """Programs a test starts; each is ended when the test is over."""
    started: list[PtyProgram] = []
    yield started
    for program in started:
        program.close()


def start(programs: list[PtyProgram], *args: str, cwd: Path | None = None) -> PtyProgram:
    program = PtyProgram(gpustation_cmd(*args), child_env(), cwd=cwd)
    programs.append(program)
    return program


def hostile_recording(path: Path) -> None:
    """A recording as another machine would share it: its host and GPU names planted."""
    plain = path.with_name("plain.zst")
    make_recording(plain, n=5, gpus=2)
    docs = list(Recording(plain).iter_docs())
    for doc in docs:
        doc["hostname"] = f"evilhost{HOSTILE}"
        for gpu in doc["gpus"]:
            gpu["name"] = f"EvilCard{HOSTILE}"
    lines = "".join(json.dumps(d) + "\n" for d in docs).encode()
    path.write_bytes(zstandard.ZstdCompressor().compress(lines))  # a file as `zstd` makes it


def test_replay_draws_a_shared_recording_s_host_and_gpu_names_harmless(
    tmp_path: Path, programs: list[PtyProgram]
) -> None:
    path = tmp_path / "shared.zst"
    hostile_recording(path)
    replay = start(programs, "replay", str(path))
    replay.wait_for_bytes(
        lambda b: b.count(b"EvilCard") >= 2 and b"evilhost" in b, "the GPU cards and the host"
    )
    replay.send(b"q")
    assert replay.wait_exit() == 0
    assert_harmless(replay.bytes())


# A run that plants the text in its log line and its metrics' unit; its
# command line (the run's title) carries it as an argument.
CHILD = """
import json, os, sys
planted = sys.argv[1]
print(f"loss line {planted} end", flush=True)
with open(os.environ["GPUSTATION_METRICS_FILE"], "a") as metrics:
    for step in (1, 2):
        event = {"t": step / 10, "step": step, "total_steps": 2, "loss": 2.0 - step / 2,
                 "throughput": 100.0 * step, "unit": f"img/s{planted}"}
        metrics.write(json.dumps(event) + "\\n")
"""


def hostile_command(tmp_path: Path) -> list[str]:
    (tmp_path / "child.py").write_text(CHILD, encoding="utf-8")
    return ["run", "--", sys.executable, "child.py", HOSTILE]


def test_run_and_runs_follow_print_the_run_s_log_title_and_unit_harmless(
    runs_env: RunsEnv, tmp_path: Path, programs: list[PtyProgram]
) -> None:
    run = start(programs, *hostile_command(tmp_path), cwd=tmp_path)
    assert run.wait_exit() == 0, run.screen()
    raw = run.bytes()
    assert b"loss line" in raw and b"img/s" in raw  # the log line and the unit were printed
    assert_harmless(raw)
    follow = start(programs, "runs", "follow", "last")
    assert follow.wait_exit() == 0, follow.screen()
    raw = follow.bytes()
    assert b"loss line" in raw and b"img/s" in raw
    assert_harmless(raw)


def toml_string(text: str) -> str:
    return json.dumps(text)  # JSON's escapes (\u001b ...) are TOML's too


def test_the_runs_screen_draws_a_run_s_title_unit_and_log_and_a_preset_s_words_harmless(
    runs_env: RunsEnv, tmp_path: Path, programs: list[PtyProgram]
) -> None:
    made = subprocess.run(
        gpustation_cmd(*hostile_command(tmp_path)),
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    runs_env["write_preset"](
        "aaa-evil",  # first in the list: the preset shown when the screen opens
        f"title = {toml_string('EvilTitle' + HOSTILE)}\n"
        f"description = {toml_string('EvilWords' + HOSTILE)}\n"
        'command = ["true"]\n',
    )
    dashboard = start(programs)
    dashboard.wait_for_bytes(lambda b: b"History" in b, "the dashboard")
    dashboard.send(b"r")
    dashboard.wait_for_bytes(
        lambda b: all(w in b for w in (b"child.py", b"img/s", b"loss line", b"EvilWords")),
        "the run's header and log, and the preset's title and description",
    )
    dashboard.send(b"q")
    assert dashboard.wait_exit() == 0
    assert_harmless(dashboard.bytes())


def test_the_control_screen_draws_a_profile_s_description_harmless(
    gpustation_dirs: dict[str, Path], programs: list[PtyProgram]
) -> None:
    profiles = gpustation_dirs["config"] / "presets" / "profiles"
    profiles.mkdir(parents=True)
    (profiles / "evil.toml").write_text(
        f'description = {toml_string("EvilProfile" + HOSTILE)}\n[power]\nlimit = "default"\n',
        encoding="utf-8",
    )
    dashboard = start(programs, "--simulate", "1")
    dashboard.wait_for_bytes(lambda b: b"History" in b, "the dashboard")
    dashboard.send(b"c")
    dashboard.wait_for_bytes(lambda b: b"EvilProfile" in b, "the profile's description")
    dashboard.send(b"q")
    assert dashboard.wait_exit() == 0
    assert_harmless(dashboard.bytes())
