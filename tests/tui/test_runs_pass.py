"""The runs screen's poll pass: whatever it meets, it comes back with what it read
and what went wrong, so the screen shows it and arms the next pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpustation import paths
from gpustation.runs import rundir
from gpustation.runs.rundir import RunState
from gpustation.tui.runs import poller
from gpustation.tui.runs.poller import RunsPass


def starting_run(run_id: str, run: object) -> Path:
    """A run just launched (no supervisor yet) whose run.json holds ``run``."""
    directory = paths.runs_dir() / run_id
    directory.mkdir(parents=True)
    (directory / rundir.RUN_JSON).write_text(json.dumps(run))
    rundir.write_state(directory, RunState(id=run_id, status="starting"))
    return directory


def test_a_run_json_of_another_shape_is_said_once_and_the_other_runs_shown(
    gpustation_dirs: dict[str, Path],
) -> None:
    odd = "20261206-101010-odd-ab12"
    starting_run(odd, {"preset": "lora-tiny", "gpus": 5})
    fine = starting_run("20261206-101011-fine-cd34", {"preset": {"name": "lora-tiny"}, "gpus": [0]})
    work = RunsPass()
    polled = work()
    assert polled is not None
    result = polled.result
    assert len(result.errors) == 1 and result.errors[0].startswith(f"run {odd}: run.json"), result
    assert [s.id for s in result.discovered or []] == [fine.name]
    assert [d.id for d in result.deltas] == [fine.name]  # and followed from now on
    work._next_discover = 0.0  # the next pass looks again at once: nothing said twice
    again = work()
    assert again is not None and again.result.errors == []
    assert [s.id for s in again.result.discovered or []] == [fine.name]


def test_a_pass_that_raises_comes_back_saying_so_and_the_next_one_reads_again(
    gpustation_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    starting_run("20261206-101012-a-ef56", {"preset": {"name": "a"}, "gpus": [0]})
    work = RunsPass()

    def no_room(*args: object) -> None:
        raise MemoryError("no room")

    # Not an error the pass expects where it happens (those are said there): one it does not.
    monkeypatch.setattr(poller, "RunTrack", no_room)
    polled = work()
    assert polled is not None, "a pass that raised posted nothing: the screen would wait forever"
    assert polled.result.errors == ["reading the runs: MemoryError: no room"]
    monkeypatch.undo()
    again = work()
    assert again is not None and again.result.errors == []
    assert [d.id for d in again.result.deltas] == ["20261206-101012-a-ef56"]
    assert again.result.history is not None  # the history it could not read is read now
