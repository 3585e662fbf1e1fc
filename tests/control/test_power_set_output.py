"""`power set` says only what it left set, and `--` before a value still makes it a value."""

from __future__ import annotations

import pytest

from gpustation.control import journal
from gpustation.errors import GpustationError
from tests.control.conftest import RecordingSim, cli


def test_a_second_gpu_failing_rolls_back_the_first_and_nothing_reads_as_set(
    sim: RecordingSim, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = sim.control.set_power_limit

    def refuse_gpu_1(index: int, watts: float) -> None:
        if index == 1:
            raise GpustationError("GPU 1: the driver refused")
        real(index, watts)

    monkeypatch.setattr(sim.control, "set_power_limit", refuse_gpu_1)
    code, out, err = cli(capsys, "power", "set", "400W", "--simulate")
    assert code == 1
    assert "set GPU" not in out  # GPU 0 was set, then put back
    assert "the driver refused (GPU 0 was put back to 450 W)" in err
    assert [g.power_limit_w for g in sim.read_gpus([0, 1], slow=False)] == [450.0, 450.0]
    outcomes = [(e.gpu, e.new, e.outcome) for e in journal.read_entries()]
    assert outcomes == [(0, 400.0, "made"), (1, 400.0, "refused"), (0, 450.0, "made")]


def test_a_negative_value_after_dashes_is_named_as_invalid(
    sim: RecordingSim, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "power", "set", "--simulate", "--", "-5W")
    assert code == 2
    assert "'-5W'" in err and "expected watts" in err
    assert "the following arguments are required" not in err
    code, out, _ = cli(capsys, "power", "set", "--simulate", "--dry-run", "--", "300W")
    assert code == 0 and "would set GPU 0: 450 W -> 300 W" in out
