"""RunFollower: what a log pane or `gpustation run` reads from a run, poll by poll."""

from __future__ import annotations

import sys
import time

from gpustation.runs.follow import RunFollower
from gpustation.runs.launch.start import launch
from gpustation.runs.presets import load_presets
from tests.runs.conftest import RunsEnv

CODE = (
    "import sys, time\\n"
    "from gpustation.runs.metrics import MetricsWriter\\n"
    "m = MetricsWriter.from_env()\\n"
    "for i in range(1, 4):\\n"
    "    print(f'line {i}', flush=True)\\n"
    "    m.log(step=i, loss=1.0 / i, total_steps=3)\\n"
    "    time.sleep(0.1)\\n"
    "sys.stdout.write('progress 50%\\\\rprogress 100%')\\n"
)


def test_follow_a_run_to_its_end(runs_env: RunsEnv) -> None:
    runs_env["write_preset"](
        "lines", f'command = ["{sys.executable}", "-c", """{CODE}"""]\ngpus = 1\n'
    )
    presets, _ = load_presets()
    handle = launch(presets["lines"])
    lines: list[str] = []
    steps: list[int] = []
    with RunFollower(handle.run_dir, max_bytes=8) as follower:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            update = follower.poll()
            lines += update.text_lines()
            steps += [e["step"] for e in update.events]
            if update.ended:
                break
            time.sleep(0.02)
        assert update.ended and update.state is not None
        assert update.state.status == "succeeded"
        # Small bites, the same lines; the unfinished last one comes at the end,
        # showing the last frame of its \r redraws.
        assert lines == ["line 1", "line 2", "line 3", "progress 100%"]
        assert steps == [1, 2, 3]
        assert follower.fold.fraction_done == 1.0 and follower.fold.final_loss == 1 / 3
        assert follower.poll().ended and follower.poll().lines == []
